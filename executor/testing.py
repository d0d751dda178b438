"""Running steps without a cluster, for tests, notebooks and benchmarks (as Dagster's
`build_op_context`): a step function called with a context of our making, or a whole plan carried
out in this process through the real runner and worker.

    from executor.testing import build_context, run_inline
    tokenize(TokenizeConfig(...), build_context(tmp_path / "out", name="tokenized/kjv"))
    plan, summary = run_inline(voyage(Config()), prefix=str(tmp_path))

`run_inline` writes real records and statuses and reaches the same STALE and FAILED states as a
run on Ray, in milliseconds: nothing but the backend differs.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from executor.context import StepContext


def build_context(output: str | os.PathLike, *, name: str = "step", digest: str | None = None,
                  **fields: Any) -> StepContext:
    """A `StepContext` writing to `output` (a local path or any fsspec URL), for calling a step
    function directly. The digest, unless given, is derived from the name (64 hex digits, as a
    recipe digest); every other field of `StepContext` may be given by name."""
    if digest is None:
        digest = hashlib.sha256(name.encode()).hexdigest()
    return StepContext(name=name, output=os.fspath(output), digest=digest, **fields)


class InlineBackend:
    """A backend that runs each task in this process as soon as it is submitted."""

    def __init__(self) -> None:
        self.results: list = []

    def submit(self, task, attempt):
        from executor.worker import execute

        handle = object()
        self.results.append((handle, execute(task)))
        return handle

    def wait(self, handles, timeout):
        wanted = {id(h) for h in handles}
        ready = [(h, r) for h, r in self.results if id(h) in wanted]
        self.results = [(h, r) for h, r in self.results if id(h) not in wanted]
        return ready


def run_inline(steps, prefix: str, selection=None, on_change=None, voyage: str | None = None):
    """Plan `steps` under `prefix` and carry the plan out in this process: `(plan, summary)`;
    `voyage`: the voyage's name the steps see (StepContext.voyage), as `marin-run` gives it."""
    from executor.api import plan_steps
    from executor.runner import Runner

    plan = plan_steps(steps, prefix, selection)
    plan.voyage = voyage
    summary = Runner(plan, InlineBackend(), poll=0.01, on_change=on_change).run()
    return plan, summary
