"""The logbook tests' small voyage run inline and logged as `marin-run` logs it (not a test module)."""

import os

from kits.vizkit import run_inline, small_voyage

from executor import logbook

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
    return plan, summary, rel
