"""Carrying out a plan: each step moves along the one state machine (executor.state), over any
execution backend.

Per step: PENDING -> (WAITING ->) RUNNING -> SUCCESS | FAILED, or CACHED (done meanwhile, or an
early cutoff: its inputs' outputs did not change), or BLOCKED (an input failed, or has no output:
a step never runs without one). Failure policy is one choice: keep going, so a failure blocks its
dependents only and every independent step still finishes. Before a step is sent to a worker the
runner takes its lease, then reads its status again (another executor may have finished it), and
keeps the lease alive from one heartbeat thread until the step returns.

"Done meanwhile" is a commit made by someone else: never the commit the plan saw (the plan chose
to run the step all the same) nor one an attempt of this run superseded. A retry of a failed
attempt finds the old output still served; it runs, and a --rerun whose attempts all fail ends
FAILED with the class of its last failure (the old output stays served), never CACHED.

The backend (`executor.ray_backend.RayBackend` in practice) only submits tasks and waits for
them; it is handed to the runner, which knows nothing of Ray.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from executor.failures import HANG, classify_text, should_retry
from executor.heartbeat import Beat, outside_bound, overdue
from executor.identity import SCHEME, normalized, plain
from executor.storage.lease import Heartbeat, LeaseInfo, Leases
from executor.plan import Decision, Plan, recorded_input
from executor.refs import detach
from executor.state import Gate, StepState, blocked_reason, check_transition, gate, initial
from executor.storage.store import InputInfo
from executor.worker import TaskResult, TaskSpec, fail_from_outside

log = logging.getLogger("marin.runner")

PENDING, WAITING, RUNNING, SUCCEEDED, FAILED, BLOCKED, CACHED, SUCCESS = (
    StepState.PENDING, StepState.WAITING, StepState.RUNNING, StepState.SUCCESS, StepState.FAILED, StepState.BLOCKED,
    StepState.CACHED, StepState.SUCCESS)


class Backend(Protocol):
    def submit(self, task: TaskSpec, attempt: int) -> Any: ...
    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, TaskResult]]: ...
    # optional, for the watchdog outside the worker (executor.heartbeat):
    # heartbeats(handles) -> {handle: Beat}; stop_hung(handle, beat) -> the dump, and kills it


WATCH_EVERY = 1.0  # seconds between looks at the running attempts' heartbeats


@dataclass
class Outcome:
    """What happened to one step in this run."""

    name: str
    state: StepState
    reason: str = ""
    output_digest: str | None = None
    error: str | None = None
    attempts: int = 0
    started: float | None = None
    ended: float | None = None
    failure: str | None = None  # the class of its last failure (executor.failures)

    @property
    def seconds(self) -> float | None:
        return None if self.started is None or self.ended is None else self.ended - self.started


@dataclass
class RunSummary:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    stale_after: list[str] = field(default_factory=list)  # consumers made STALE by a changed rerun
    seconds: float = 0.0
    page: str | None = None  # the URL of the run's live page, if it kept one

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.state in (FAILED, BLOCKED)]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


Listener = Callable[[Outcome], None]


@dataclass(frozen=True)
class _Waiting:
    """A step another executor holds the lease of (`holder`, None if unreadable)."""

    holder: LeaseInfo | None


def _commit_id(status: Any) -> tuple:
    """What tells one commit of an output folder from another."""
    return (status.attempt, status.token, status.dir, status.output_digest)


class Runner:
    """Runs the steps a plan marks `will_run`, dependencies first, at most `max_concurrent` at once."""

    def __init__(self, plan: Plan, backend: Backend, leases: Leases | None = None, max_concurrent: int = 16,
                 poll: float = 0.2, on_change: Listener | None = None) -> None:
        leases = leases or plan.leases
        if leases is None:
            raise ValueError("a plan made without leases cannot be run (plan it with executor.api.plan_steps)")
        self.plan, self.backend, self.leases = plan, backend, leases
        self.store = plan.store
        self.max_concurrent = max(1, max_concurrent)
        self.poll = poll
        self.on_change = on_change or (lambda outcome: None)
        self.outputs: dict[str, str | None] = {
            d.name: d.status.output_digest for d in plan.decisions if d.has_output}
        # Per step, the commits this run must never take as "done meanwhile": the one the plan saw
        # (it decided to run the step all the same) and the one each of its attempts superseded.
        # A retry of a failed attempt finds the old output still served (`committed`); taking it
        # would turn a failed --rerun into CACHED, exit 0.
        self._superseded: dict[str, set[tuple]] = {}
        self._hung: dict[Any, tuple[str, str, Beat]] = {}  # killed from outside: (error, dump, last beat)
        self._watched = 0.0
        for d in plan.decisions:
            served = d.status.served() if d.status is not None else None
            if served is not None:
                self._superseded.setdefault(d.name, set()).add(_commit_id(served))

    def run(self) -> RunSummary:
        t0 = time.time()
        summary = RunSummary()
        for d in self.plan.decisions:
            summary.outcomes[d.name] = Outcome(d.name, initial(d.state, d.will_run), d.reason)
        pending = [d for d in self.plan.decisions if d.will_run]
        inflight: dict[Any, tuple[Decision, TaskSpec, int]] = {}
        next_try: dict[str, float] = {}
        tries: dict[str, int] = {}
        spent: dict[str, dict[str, int]] = {}  # retries spent per step, per failure class
        with Heartbeat(self.leases) as heartbeat:
            while pending or inflight:
                now = time.time()
                for d in list(pending):
                    if len(inflight) >= self.max_concurrent:
                        break
                    inputs = [(dep.name, summary.outcomes[dep.name].state, self.outputs.get(dep.name) is not None)
                                  for dep in d.node.deps]
                    ready = gate((state, has) for _, state, has in inputs)
                    if ready is Gate.BLOCK:
                        pending.remove(d)
                        self._set(summary, d.name, BLOCKED, reason=blocked_reason(inputs))
                        continue
                    if ready is Gate.WAIT:
                        continue
                    if next_try.get(d.name, 0.0) > now:
                        continue
                    started = self._start(d, summary, heartbeat, tries)
                    if started is None:  # finished meanwhile, or cut off
                        pending.remove(d)
                    elif isinstance(started, _Waiting):
                        next_try[d.name] = now + self._wait_for(started.holder, now)
                    else:
                        pending.remove(d)
                        handle, task = started
                        inflight[handle] = (d, task, tries[d.name])
                if not inflight:
                    if pending:
                        time.sleep(self.poll)
                    continue
                self._watch(inflight)
                for handle, result in self.backend.wait(list(inflight), timeout=self.poll):
                    d, task, attempt = inflight.pop(handle)
                    if handle in self._hung:  # recorded while the lease is still ours
                        result = self._hung_result(d, task, handle, result)
                    heartbeat.drop(d.node.dirname)
                    if result.blocked:  # an input had no output when the worker looked: nothing written
                        self._set(summary, d.name, BLOCKED, reason=result.error or "an input has no output",
                                  started=result.started, ended=result.ended)
                    elif result.lease_lost:
                        # Another executor took the folder over; wait for it and take its result.
                        log.warning("step %s: %s; waiting for the new holder", d.name, result.error)
                        pending.insert(0, d)
                        self._set(summary, d.name, WAITING, reason="lease lost to another executor")
                    elif result.ok:
                        self.outputs[d.name] = result.output_digest
                        self._set(summary, d.name, SUCCEEDED, output_digest=result.output_digest,
                                  started=result.started, ended=result.ended, attempts=result.attempt)
                        self._note_stale(d, result, summary)
                    else:
                        failure = result.failure or classify_text(result.error)
                        delay = should_retry(d.node.step.retry, failure, spent.setdefault(d.name, {}))
                        if delay is not None:
                            log.warning("step %s failed (%s: %s); trying again in %.0fs", d.name, failure,
                                        result.error, delay)
                            pending.insert(0, d)
                            next_try[d.name] = time.time() + delay
                            self._set(summary, d.name, PENDING, failure=failure,
                                      reason=f"retrying after {failure}: {result.error}")
                        else:
                            self._set(summary, d.name, FAILED, error=result.error, started=result.started,
                                      ended=result.ended, attempts=result.attempt, failure=failure)
        summary.seconds = time.time() - t0
        return summary

    # -- the watchdog outside the worker --------------------------------------------------------
    def _watch(self, inflight: dict[Any, tuple[Decision, TaskSpec, int]]) -> None:
        """Kill the attempts whose heartbeat stopped past its outside bound (executor.heartbeat):
        a worker frozen where its own watchdog cannot fire."""
        heartbeats = getattr(self.backend, "heartbeats", None)
        if heartbeats is None or not inflight or time.monotonic() - self._watched < WATCH_EVERY:
            return
        self._watched = time.monotonic()
        for handle, beat in heartbeats([h for h in inflight if h not in self._hung]).items():
            if not overdue(beat):
                continue
            d, task, _ = inflight[handle]
            where = f"pid {beat.info.get('pid', '?')}" + (f" on node {str(beat.info['node'])[:12]}"
                                                         if beat.info.get("node") else "")
            error = (f"Hang: no heartbeat for {beat.age:.0f}s (outside bound {outside_bound(beat):.0f}s; "
                     f"{beat.count} optimizer steps done{', saving a checkpoint' if beat.paused else ''}): "
                     f"the worker ({where}) did not answer and was killed from outside")
            log.error("step %s, attempt %s: %s", d.name, beat.info.get("attempt", "?"), error)
            dump = self.backend.stop_hung(handle, beat)  # type: ignore[attr-defined]
            where_dump = self._write_dump(beat, error, dump)
            if where_dump:
                error += f"; its state is in {where_dump}"
            self._hung[handle] = (error, dump, beat)

    def _write_dump(self, beat: Beat, error: str, dump: str) -> str | None:
        output, attempt = beat.info.get("output"), beat.info.get("attempt", 0)
        if not output:
            return None
        url = f"{output.rstrip('/')}/logs/hang-outside-attempt{attempt}.txt"  # a declared log of trainers
        try:
            import fsspec

            with fsspec.open(url, "w") as f:
                f.write(f"{error}\n\n{dump}")
        except Exception as e:  # noqa: BLE001 - the dump goes to the executor's log then
            log.error("could not write %s (%s); the dump follows\n%s", url, e, dump)
            return None
        return url

    def _hung_result(self, d: Decision, task: TaskSpec, handle: Any, result: TaskResult) -> TaskResult:
        """The result of an attempt this runner killed for a stopped heartbeat: a `hang`, its
        record and `.status` saying so (its worker is dead: nothing else writes them now)."""
        error, dump, beat = self._hung.pop(handle)
        if result.ok or result.lease_lost or result.blocked:  # it finished after all, before the kill
            return result
        number = int(beat.info.get("attempt", result.attempt or 0))
        try:
            fail_from_outside(task, number, error, HANG, dump)
        except Exception as e:  # noqa: BLE001 - the next attempt closes it as interrupted then
            log.warning("step %s: recording the hang of attempt %d failed: %s", d.name, number, e)
        return TaskResult(d.name, False, error=error, attempt=number, started=result.started or time.time(),
                          ended=time.time(), failure=HANG)

    # -- one step ------------------------------------------------------------------------------
    def _start(self, d: Decision, summary: RunSummary, heartbeat: Heartbeat, tries: dict[str, int]) -> Any:
        node = d.node
        forced = d.state == StepState.RERUN and tries.get(d.name, 0) == 0
        if not forced and self._done_with_same_inputs(d):
            self._set(summary, d.name, CACHED, reason=self._cutoff_reason(d))
            return None
        lease, holder = self.leases.try_acquire(node.dirname)
        if lease is None:
            who = holder.describe() if holder else "another executor"
            if summary.outcomes[d.name].state != WAITING:
                log.info("%s: WAITING, leased by %s", d.name, who)
                self._set(summary, d.name, WAITING, reason=f"leased by {who}")
            return _Waiting(holder)
        # Read the status again now that the lease is ours: the holder may have just finished.
        if not forced and self._done_with_same_inputs(d):
            self.leases.release(node.dirname, lease)
            self._set(summary, d.name, CACHED, reason=self._cutoff_reason(d))
            return None
        if summary.outcomes[d.name].state == WAITING:
            log.info("%s: took over the lease (token %d) to run it", d.name, lease.token)
        if forced:  # what this attempt supersedes, if another executor committed since the plan
            now = self.store.read_status(node.dirname)
            if now is not None and now.served() is not None:
                self._superseded.setdefault(d.name, set()).add(_commit_id(now.served()))
        heartbeat.hold(node.dirname, lease)
        tries[d.name] = tries.get(d.name, 0) + 1
        # A forced rerun (or an output made without its inputs) starts clean once; the retries
        # of this run resume from what its first try made.
        task = self._task(d, lease.token, fresh=d.fresh and tries[d.name] == 1)
        handle = self.backend.submit(task, tries[d.name])
        self._set(summary, d.name, RUNNING, started=time.time())
        return handle, task

    def _wait_for(self, holder: LeaseInfo | None, now: float) -> float:
        """Seconds until a waiting step looks at its lease again: every quarter ttl, and just
        after the holder's lease would expire if that comes sooner (a dead holder is taken over
        about one ttl after its last renewal)."""
        every = min(30.0, max(self.poll, self.leases.ttl / 4))
        if holder is not None and not holder.released:
            every = min(every, max(self.poll, holder.expires - now + 0.05))
        return every

    def _done_with_same_inputs(self, d: Decision) -> bool:
        """Done, from the inputs whose outputs are there now. An input recorded without output, or
        without output now, never counts as the same."""
        status = self.store.read_status(d.node.dirname)
        status = status.served() if status is not None else None
        if status is None:
            return False
        cutoff = d.state != StepState.RERUN and (d.conditional_on or d.state == StepState.STALE)
        if not cutoff and _commit_id(status) in self._superseded.get(d.name, ()):
            return False  # the output this run set out to replace (or the plan saw): not done meanwhile
        for dep in d.node.deps:
            _, then = recorded_input(status, dep)
            now = self.outputs.get(dep.name)
            if then is None or now is None or then != now:
                return False
        self.outputs[d.name] = status.output_digest
        return True

    def _cutoff_reason(self, d: Decision) -> str:
        if d.conditional_on or d.state == StepState.STALE:
            return "early cutoff: its inputs' outputs are unchanged"
        log.info("%s: done meanwhile by another executor; taking its result", d.name)
        return "done meanwhile by another executor"

    def _task(self, d: Decision, token: int, fresh: bool = False) -> TaskSpec:
        node, store = d.node, self.store
        inputs = [InputInfo(name=dep.name, digest=dep.digest, output_digest=self.outputs.get(dep.name),
                            path=store.url(dep.dirname)) for dep in node.deps]
        fingerprint = self.plan.dag.fingerprint(node)
        return TaskSpec(
            name=node.name, step_type=node.step.type, config=detach(normalized(node.step.config)),
            plain_config=plain(node.step.config), prefix=store.prefix, dirname=node.dirname,
            digest=node.digest, scheme=SCHEME, code_fingerprint=fingerprint.digest, code_parts=fingerprint.parts,
            inputs=inputs, resources=node.step.resources, run_id=self.leases.owner.run_id, token=token,
            lease_ttl=self.leases.ttl, max_node_failures=node.step.retry.max_node_failures,
            reason=f"{d.state}: {d.reason}", fresh=fresh, voyage=self.plan.voyage or "",
            provenance=self.plan.lineage.record_of(node.name) if self.plan.lineage is not None else {})

    def _note_stale(self, d: Decision, result: TaskResult, summary: RunSummary) -> None:
        before = d.status.output_digest if d.status is not None else None
        if d.state != StepState.RERUN or before is None or before == result.output_digest:
            return
        for consumer in d.node.consumers:
            if not self.plan[consumer.name].will_run:
                summary.stale_after.append(consumer.name)

    def _set(self, summary: RunSummary, name: str, state: StepState, **changes: Any) -> None:
        outcome = summary.outcomes[name]
        check_transition(name, outcome.state, state)
        outcome.state = state
        for key, value in changes.items():
            setattr(outcome, key, value)
        try:
            self.on_change(outcome)
        except Exception as e:  # a listener (the live page) must never fail the voyage
            log.warning("state listener failed: %s", e)
