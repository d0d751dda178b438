"""The logbook tests' small voyage run inline and logged as `marin-run` logs it (not a test module)."""

import os
from dataclasses import dataclass

from kits.vizkit import run_inline, small_voyage

from executor import logbook, step_type
from executor.views.logbook import rewrite_index

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOYAGE = os.path.join(ROOT, "tests", "kits", "logbook_voyage.py")
NAME = "logbook_voyage"


def run_and_log(prefix, *, fail=False, value="A", note=None):
    """A run of the small voyage (inline, through the real runner and worker) and its entry, as
    `api.run_plan` writes it."""
    plan, summary = run_inline(small_voyage(fail=fail, value=value), prefix)
    config = {"value": value, "fail": fail}
    rel = logbook.record_run(plan, summary, NAME, extra={"config": config, "note": note,
                                                        "flags": {"rerun": [], "only": [], "downstream": False}})
    assert rel is not None
    rewrite_index(plan.store, NAME)
    return plan, summary, rel


@dataclass(frozen=True)
class Linked:
    """A step whose results give the logbook a headline and links (as ladder and training steps do)."""

    headline_bytes: int = 40


@step_type(version="1", name="logkit_linked")
def linked(config: Linked, ctx) -> None:
    with ctx.open("out.txt", "w") as f:
        f.write(ctx.voyage)
    ctx.results["voyage"] = ctx.voyage
    ctx.results["headline"] = {"kind": "demo", "text": "v" * config.headline_bytes}
    ctx.results["links"] = {"W&B run": "https://wandb.ai/team/marin-voyage/runs/marin-0123",
                            "local": "file:///etc/passwd",
                            "script": "javascript:alert(1)", "here": "/tmp/out", "spaced": "https://a b"}
