"""The plan: one decision per step, with a reason a person can read.

States (DESIGN.md): CACHED, RUN (no output yet), RERUN (forced), STALE (an input's output changed
since this output was made), RETRY (failed or interrupted before), WAITING (leased by a live
executor), BLOCKED (a dependency failed; set while running), SKIPPED (not selected, or needed only
by cached steps).

Planning is one pass over the DAG in topological order with one status read per step (issued as
one concurrent batch on remote stores), then one reverse pass that prunes what nothing needs: a
missing step whose consumers are all cached does not run (Marin #6783). Reasons for new outputs
come from diffing the config against the newest record of the same step name.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from executor.dag import Dag, Node, gc_paused
from executor.errors import VoyageError
from executor.identity import diff, plain
from executor.lease import LeaseInfo, Leases
from executor.store import FAILED, RUNNING, SUCCESS, Record, Status, Store

CACHED, RUN, RERUN, STALE, RETRY, WAITING, BLOCKED, SKIPPED = (
    "CACHED", "RUN", "RERUN", "STALE", "RETRY", "WAITING", "BLOCKED", "SKIPPED")
STATES = (RUN, RERUN, STALE, RETRY, WAITING, BLOCKED, CACHED, SKIPPED)


@dataclass
class Selection:
    """What the user asked for on the command line."""

    rerun: tuple[str, ...] = ()
    downstream: bool = False
    only: tuple[str, ...] = ()


@dataclass(frozen=True)
class StaleInput:
    """An input whose output changed since this output was made: full output digests."""

    name: str
    recorded: str  # the input's output digest this output was made from
    current: str  # the input's output digest now


@dataclass
class Decision:
    node: Node
    state: str
    reason: str
    will_run: bool = False
    status: Status | None = None
    holder: LeaseInfo | None = None
    conditional_on: tuple[str, ...] = ()  # runs only if these forced steps change their output
    code_drift: bool = False
    stale_inputs: tuple[StaleInput, ...] = ()  # STALE: which inputs changed, and from what to what

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class Plan:
    dag: Dag
    store: Store
    decisions: list[Decision] = field(default_factory=list)
    planned_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.by_name = {d.name: d for d in self.decisions}

    def __getitem__(self, name: str) -> Decision:
        return self.by_name[name]

    def counts(self) -> Counter:
        return Counter(d.state for d in self.decisions)

    def to_run(self) -> list[Decision]:
        return [d for d in self.decisions if d.will_run]

    def path(self, node: Node) -> str:
        return self.store.url(node.dirname)


@gc_paused
def make_plan(dag: Dag, store: Store, selection: Selection | None = None,
              leases: Leases | None = None, explain_new: bool = True) -> Plan:
    """Decide, for every step, whether it is cached, must run, waits, or is skipped, and why."""
    sel = selection or Selection()
    for name in (*sel.rerun, *sel.only):
        if name not in dag.by_name:
            raise VoyageError(f"no step named {name!r} in this voyage{_closest(name, dag.by_name)}")
    statuses = store.read_statuses([n.dirname for n in dag])
    forced = set(sel.rerun)
    downstream_of_forced = dag.downstream(forced) - forced if forced else set()
    if sel.only:
        wanted = dag.upstream(sel.only)
    elif forced:
        wanted = dag.upstream(forced) | (downstream_of_forced if sel.downstream else set())
    else:
        wanted = None  # everything

    decisions: dict[str, Decision] = {}
    for node in dag:
        status = statuses[node.dirname]
        if status is not None and status.digest and status.digest != node.digest:
            raise VoyageError(
                f"step {node.name!r}: folder {store.url(node.dirname)} belongs to digest "
                f"{status.digest[:16]}..., not {node.digest[:16]}... (a 10-hex-digit prefix collision)")
        done = status is not None and status.state == SUCCESS
        if node.name in forced:
            d = Decision(node, RERUN, "forced by --rerun", will_run=True, status=status)
        elif done:
            d = _decide_done(node, status, statuses, forced, downstream_of_forced, sel)
        elif status is not None and status.state == RUNNING and leases is not None and \
                (holder := leases.holder(node.dirname)) is not None and holder.live() and \
                holder.run_id != leases.owner.run_id:
            d = Decision(node, WAITING, f"leased by {holder.describe()}", will_run=True,
                         status=status, holder=holder)
        elif status is not None and status.state == RUNNING:
            d = Decision(node, RETRY, "an earlier attempt was interrupted (RUNNING without a live lease)",
                         will_run=True, status=status)
        elif status is not None and status.state == FAILED:
            d = Decision(node, RETRY, f"failed before (attempt {status.attempt})", will_run=True, status=status)
        else:
            d = Decision(node, RUN, "", will_run=True, status=status)
        if wanted is not None and node.name not in wanted:
            if d.will_run or d.state == STALE:
                d.state, d.will_run = SKIPPED, False
                d.reason = "not selected" + (f" (would be {d.reason})" if d.reason else "")
        if sel.downstream and d.state == CACHED and (wanted is None or node.name in wanted):
            changing = tuple(dep.name for dep in node.deps if decisions[dep.name].will_run)
            if changing:  # decided when they finish: runs only if an input's output changed
                d.state, d.will_run, d.conditional_on = STALE, True, changing
                d.reason = f"downstream of {', '.join(changing)}: runs only if their outputs change"
        decisions[node.name] = d

    _prune(dag, decisions, sel)
    _note_code_drift(dag, decisions)
    if explain_new:
        for d in decisions.values():
            if d.state == RUN and not d.reason:
                d.reason = _why_new(d.node, store, dag)
    return Plan(dag, store, [decisions[n.name] for n in dag])


def _decide_done(node: Node, status: Status, statuses: dict[str, Status | None], forced: set[str],
                 downstream_of_forced: set[str], sel: Selection) -> Decision:
    changed: list[str] = []
    stale: list[StaleInput] = []
    for dep in node.deps:
        dep_status = statuses[dep.dirname]
        now = dep_status.output_digest if dep_status is not None and dep_status.state == SUCCESS else None
        then = status.inputs.get(dep.digest)
        if now is not None and then is not None and now != then:
            changed.append(f"input {dep.name} output changed {then[:10]} -> {now[:10]}")
            stale.append(StaleInput(dep.name, then, now))
    if changed:
        run = sel.downstream
        hint = "" if run else " (run with --downstream, or --rerun it)"
        return Decision(node, STALE, "; ".join(changed) + hint, will_run=run, status=status,
                        stale_inputs=tuple(stale))
    if node.name in downstream_of_forced and not sel.downstream:
        upstream_forced = tuple(sorted(forced))
        return Decision(node, CACHED, "cached; becomes STALE if the rerun of " + ", ".join(upstream_forced) +
                        " changes its output", status=status)
    return Decision(node, CACHED, "cached", status=status)


def _note_code_drift(dag: Dag, decisions: dict[str, Decision]) -> None:
    """The fingerprint is recorded, not keyed: a drift is reported, never a new path."""
    for d in decisions.values():
        if d.state == CACHED and d.status is not None and d.status.code:
            now = dag.fingerprint(d.node)
            if now != d.status.code:
                d.code_drift = True
                d.reason += (f"; code drifted since it was made (fingerprint {d.status.code[:8]} -> {now[:8]}; "
                             f"bump the version of {d.node.step.type.name} if the output changes, or --rerun it)")


def _prune(dag: Dag, decisions: dict[str, Decision], sel: Selection) -> None:
    """Missing steps needed by nothing that runs are skipped; deps of what runs must be there."""
    needed: set[str] = set()
    targets = set(sel.only) | set(sel.rerun)
    for node in reversed(dag.nodes):
        d = decisions[node.name]
        consumers_run = any(decisions[c.name].will_run for c in node.consumers)
        is_target = node.name in targets or (not targets and not node.consumers)
        if d.will_run and not (is_target or consumers_run or node.name in needed):
            if d.state in (RUN, RETRY, WAITING):
                d.state, d.will_run = SKIPPED, False
                d.reason = "needed only by cached steps" + (f" (would be {d.reason})" if d.reason else "")
        if d.will_run:
            needed.update(dep.name for dep in node.deps)


def _why_new(node: Node, store: Store, dag: Dag) -> str:
    prev: Record | None = store.newest_sibling_record(node.name, exclude=node.dirname)
    if prev is None:
        return "new step: no earlier output of this name"
    if prev.step_type != node.step.type.name or prev.version != node.step.type.version:
        return f"step type {prev.step_type}@{prev.version} -> {node.step.type.key}"
    now = plain(node.step.config)
    changes = diff(prev.config, now)
    dep_changes = []
    prev_inputs = {i.name: i.digest for i in prev.inputs}
    for dep in node.deps:
        if dep.name in prev_inputs and prev_inputs[dep.name] != dep.digest:
            dep_changes.append(f"input {dep.name} re-addressed {prev_inputs[dep.name][:10]} -> {dep.digest[:10]}")
    parts = changes + dep_changes
    if not parts:
        return f"new digest {node.digest[:10]} (was {prev.digest[:10]}; identity scheme or defaults changed)"
    return "; ".join(parts)


def _closest(name: str, names: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""
