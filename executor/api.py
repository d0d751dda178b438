"""Planning and running steps from Python (what `marin-run` does, without the command line).

    from executor.api import plan_steps, run_steps
    summary = run_steps(voyage(HelloConfig()), prefix="gs://bucket/voyages")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from executor.dag import build_dag
from executor.lease import Leases
from executor.plan import Plan, Selection, make_plan
from executor.runner import Listener, RunSummary
from executor.step import Step
from executor.store import Store

if TYPE_CHECKING:
    from executor.live import LivePage


def plan_steps(steps: Iterable[Step], prefix: str, selection: Selection | None = None,
               lease_ttl: float = 60.0) -> tuple[Plan, Leases]:
    """Build the DAG of `steps` and decide what would run under `prefix`, and why."""
    dag = build_dag(steps)
    store = Store(prefix)
    leases = Leases(store, ttl=lease_ttl)
    return make_plan(dag, store, selection or Selection(), leases), leases


def run_plan(plan: Plan, leases: Leases, ray_address: str | None = None, max_concurrent: int = 16,
             pickle_by_value: Sequence[Any] = (), on_change: Listener | None = None,
             page: LivePage | None = None) -> RunSummary:
    """Run what `plan` marks to run on Ray (joining `ray_address`, or the Ray already initialized
    in this process, or an embedded local one), after checking that every step can be placed.

    `page` (from `executor.live.open_page`) is kept up to date from the first step to the last;
    it is written only once the run is known to start, and a failing write never fails the run."""
    from executor import ray_backend
    from executor.placement import fail_if_unplaceable
    from executor.runner import Runner

    to_run = plan.to_run()
    if not to_run:
        return Runner(plan, None, leases).run()  # type: ignore[arg-type]  # nothing is submitted
    started = ray_backend.start(ray_address, pickle_by_value=pickle_by_value)
    try:
        fail_if_unplaceable({d.name: d.node.step.resources for d in to_run}, ray_backend.cluster_nodes())
        listener = on_change
        if page is not None:
            page.start()
            listener = _both(on_change, page) if on_change is not None else page
        runner = Runner(plan, ray_backend.RayBackend(), leases, max_concurrent=max_concurrent, on_change=listener)
        summary = None
        try:
            summary = runner.run()
        finally:
            if page is not None:
                page.close(summary)
        return summary
    finally:
        if started:
            ray_backend.stop()


def run_steps(steps: Iterable[Step], prefix: str, selection: Selection | None = None, *,
              ray_address: str | None = None, max_concurrent: int = 16, lease_ttl: float = 60.0,
              on_change: Listener | None = None, voyage: str | None = None) -> tuple[Plan, RunSummary]:
    """Plan `steps` under `prefix` and run what is missing; returns the plan and the summary.

    With `voyage` (a name), the run keeps a live page at `{prefix}/voyages/{voyage}/{run}/index.html`."""
    plan, leases = plan_steps(steps, prefix, selection, lease_ttl)
    Store(prefix).check_writable()
    page = None
    if voyage and plan.to_run():
        from executor.live import open_page

        page = open_page(plan, voyage, leases.owner.run_id)
    return plan, run_plan(plan, leases, ray_address, max_concurrent, on_change=on_change, page=page)


def _both(first: Listener, second: Listener) -> Listener:
    def both(outcome: Any) -> None:
        try:
            first(outcome)
        finally:
            second(outcome)

    return both
