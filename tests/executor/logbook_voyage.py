"""A voyage for the logbook's CLI tests: vizkit's small voyage (a, b -> ab -> abc; ab -> model, a
trainer; lone), with its value and a failure on purpose as config fields."""

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vizkit  # noqa: E402


@dataclass(frozen=True)
class LogbookConfig:
    value: str = "A"
    fail: bool = False


def voyage(config: LogbookConfig):
    return vizkit.small_voyage(value=config.value, fail=config.fail)
