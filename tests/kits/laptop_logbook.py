"""The laptop voyage with two more config fields, for the logbook's three-run test (copied to a
folder as `535b.py`, so that its log is the laptop voyage's): `title` changes the model card's
title (a config change that reruns only `card/laptop`), and `fail_check` adds a step that reads
the export and fails on purpose."""

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass

from executor import Step, output_of, step_type

ROOT = os.environ["MARIN_LOGBOOK_ROOT"]  # the checkout whose voyages/535b.py this extends
_spec = importlib.util.spec_from_file_location("laptop_logbook_base", os.path.join(ROOT, "voyages", "535b.py"))
base = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = base
_spec.loader.exec_module(base)


@dataclass(frozen=True)
class LogbookVoyageConfig(base.VoyageConfig):
    title: str = ""  # the model card's title ("" : the voyage's)
    fail_check: bool = False  # the check step fails on purpose


@dataclass(frozen=True)
class CheckConfig:
    export: str
    fail: bool = False


@step_type(version="1")
def check_export(config: CheckConfig, ctx) -> None:
    """Read the export's config; fail on purpose when asked."""
    with open(os.path.join(config.export, "hf", "config.json")) as f:
        ctx.results["model_type"] = f.read()[:40]
    if config.fail:
        raise RuntimeError("check/laptop fails on purpose (--fail_check)")


def voyage(config: LogbookVoyageConfig):
    steps = base.voyage(base.VoyageConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(base.VoyageConfig)}))
    out = []
    for s in steps:
        if s.name == "card/laptop" and config.title:
            s = Step(s.name, s.type, dataclasses.replace(s.config, title=config.title), resources=s.resources)
        out.append(s)
    export = next(s for s in out if s.name == "export/laptop")
    return out + [Step("check/laptop", check_export, CheckConfig(export=output_of(export), fail=config.fail_check))]
