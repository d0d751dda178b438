"""A voyage for the logbook's CLI tests: vizkit's small voyage (a, b -> ab -> abc; ab -> model, a
trainer; lone), with its value and a failure on purpose as config fields (kits.logkit runs it
inline, as `marin-run` would, and writes its log entry)."""

from dataclasses import dataclass

from kits import vizkit


@dataclass(frozen=True)
class LogbookConfig:
    value: str = "A"
    fail: bool = False


def voyage(config: LogbookConfig):
    return vizkit.small_voyage(value=config.value, fail=config.fail)
