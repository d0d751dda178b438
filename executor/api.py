"""Planning and running steps from Python: what `marin-run` does, without the command line.

    from executor import plan_steps, run_steps
    plan = plan_steps(voyage(HelloConfig()), prefix="gs://bucket/voyages")   # decides, writes nothing
    plan, summary = run_steps(voyage(HelloConfig()), prefix="gs://bucket/voyages")

Leases, the Ray cluster and the live page stay inside: a plan carries the leases of the executor
that made it, and running it starts (or joins) Ray and stops what it started. `marin-run` is a
thin layer over these three verbs.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from executor.dag import build_dag
from executor.errors import VoyageError
from executor.licenses import LicensePolicy
from executor.plan import Plan, Selection, make_plan
from executor.step import Step
from executor.storage.store import Store

if TYPE_CHECKING:  # running imports the runner (and the worker, and pydantic's records); planning does not
    from executor.runner import Listener, RunSummary


def plan_steps(steps: Iterable[Step], prefix: str, selection: Selection | None = None, *,
               lease_ttl: float = 60.0, policy: LicensePolicy | None = None) -> Plan:
    """Build the DAG of `steps` and decide what would run under `prefix`, and why. Writes nothing;
    a bad voyage, selection or setting is one VoyageError, and so is a licence that a policy
    refuses (`policy` binds every step, a step's `licenses=` binds it), found from the DAG before
    any status is read."""
    check_settings(prefix=prefix, lease_ttl=lease_ttl)
    if policy is not None and not isinstance(policy, LicensePolicy):
        raise VoyageError(f"policy: a LicensePolicy, got {policy!r}")
    dag = build_dag(steps)
    store = Store(prefix)
    # The leases are made when the plan is run (or a folder is found RUNNING): a dry-run on a
    # local folder then needs no fsspec filesystem at all.
    return make_plan(dag, store, selection or Selection(), lease_ttl=lease_ttl, policy=policy)


def run_plan(plan: Plan, *, ray_address: str | None = None, max_concurrent: int = 16,
             pickle_by_value: Sequence[Any] = (), on_change: Listener | None = None,
             voyage: str | None = None, on_page: Callable[[str], None] | None = None,
             live_page: bool = True, log: dict[str, Any] | None = None) -> RunSummary:
    """Run what `plan` marks to run on Ray (joining `ray_address`, or the Ray already initialized
    in this process, or an embedded local one), after checking that the prefix can be written
    and that every step can be placed.

    `pickle_by_value`: modules whose code workers cannot import (a voyage file loaded from a
    path). With `voyage` (a name), the run keeps a live page at
    `{prefix}/voyages/{voyage}/{run}/index.html` (its URL is passed to `on_page` before the
    first step starts, and kept in the summary; `live_page=False`: no page); a failing page write
    never fails the run. With `voyage`, a run that runs steps also writes one entry in the voyage's
    log (executor.logbook; `log` adds fields: config, flags, note, voyage_file), never failing it."""
    from executor.runner import Runner

    check_settings(max_concurrent=max_concurrent)
    if plan.leases is None:
        raise VoyageError("this plan was made without leases: make it with executor.api.plan_steps")
    to_run = plan.to_run()
    if not to_run:
        return Runner(plan, None).run()  # type: ignore[arg-type]  # nothing is submitted
    try:
        plan.store.check_writable()
    except Exception as e:
        raise VoyageError(f"prefix {plan.store.prefix!r} cannot be written: {type(e).__name__}: {e}") from None
    from executor import ray_backend
    from executor.placement import fail_if_unplaceable

    if voyage:
        plan.voyage = voyage
    started = ray_backend.start(ray_address, pickle_by_value=pickle_by_value)
    try:
        fail_if_unplaceable({d.name: d.node.step.resources for d in to_run}, ray_backend.cluster_nodes())
        page = None
        if voyage and live_page:
            from executor.views.live import open_page

            page = open_page(plan, voyage, plan.leases.owner.run_id)
        listener = on_change
        if page is not None:
            if on_page is not None:
                on_page(page.url)
            page.start()
            listener = _both(on_change, page) if on_change is not None else page
        runner = Runner(plan, ray_backend.RayBackend(), max_concurrent=max_concurrent, on_change=listener)
        summary = None
        try:
            summary = runner.run()
        finally:
            if page is not None:
                page.close(summary)
        if page is not None:
            summary.page = page.url
        if voyage:
            from executor.logbook import record_run
            from executor.views.logbook import rewrite_index

            record_run(plan, summary, voyage, page_folder=page.folder if page is not None else None, extra=log)
            rewrite_index(plan.store, voyage)  # the voyage's page of its entries
        return summary
    finally:
        if started:
            ray_backend.stop()


def run_steps(steps: Iterable[Step], prefix: str, selection: Selection | None = None, *,
              ray_address: str | None = None, max_concurrent: int = 16, lease_ttl: float = 60.0,
              on_change: Listener | None = None, voyage: str | None = None,
              pickle_by_value: Sequence[Any] = ()) -> tuple[Plan, RunSummary]:
    """Plan `steps` under `prefix` and run what is missing; returns the plan and the summary."""
    plan = plan_steps(steps, prefix, selection, lease_ttl=lease_ttl)
    summary = run_plan(plan, ray_address=ray_address, max_concurrent=max_concurrent,
                       pickle_by_value=pickle_by_value, on_change=on_change, voyage=voyage)
    return plan, summary


def check_settings(prefix: str | None = None, lease_ttl: float | None = None, max_concurrent: int | None = None,
                   names: dict[str, str] | None = None) -> None:
    """A VoyageError for a setting no run can use: an empty prefix (it would mean the filesystem
    root), a lease ttl that is not a positive number of seconds (0 renews forever, NaN never
    expires), fewer than one step at a time. `names` says what to call each setting (a flag)."""
    names = names or {}
    if prefix is not None and (not isinstance(prefix, str) or not prefix.strip()):
        raise VoyageError(f"{names.get('prefix', 'prefix')}: empty; give a folder or a URL such as gs://bucket/path")
    if lease_ttl is not None:
        if not isinstance(lease_ttl, (int, float)) or not math.isfinite(lease_ttl) or lease_ttl <= 0 \
                or lease_ttl > threading.TIMEOUT_MAX:
            raise VoyageError(f"{names.get('lease_ttl', 'lease_ttl')}: {lease_ttl!r} is not a positive number of "
                              "seconds (at most threading.TIMEOUT_MAX: the heartbeat waits a quarter of it)")
    if max_concurrent is not None and (not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise VoyageError(f"{names.get('max_concurrent', 'max_concurrent')}: {max_concurrent!r}; at least 1 step "
                          "must run at a time")


def _both(first: Listener, second: Listener) -> Listener:
    def both(outcome: Any) -> None:
        try:
            first(outcome)
        finally:
            second(outcome)

    return both
