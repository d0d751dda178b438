"""Running one step inside a worker: the life of an output folder.

absent -> RUNNING -> SUCCESS | FAILED. The order of writes is the whole point:
1. `.status` says RUNNING (a crash from here on leaves a folder that is never a cache hit), then
   the record gains a new attempt;
2. a non-resumable step's partial output from an earlier attempt is cleared; a resumable step
   keeps its folder, less the uncommitted `.tmp-*` writes of an attempt that was killed;
3. the function runs;
4. the manifest and output digest are computed;
5. inside the lease's fence (`Leases.fence`: the lease still carries our token, and the status
   still names this attempt), the record is written and only then `.status` SUCCESS.
Status and record are written only inside the fence, so an attempt that lost its lease (or was
superseded by a retry of itself) never overwrites the folder of the one that replaced it.
This module is engine-agnostic: the Ray backend calls `execute` inside a Ray task.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from executor.context import Mapper, StepContext, local_map
from executor.lease import Leases
from executor.step import InputRef, OwnOutput, Resources, StepType
from executor.store import FAILED, RUNNING, SUCCESS, Attempt, InputInfo, Record, Status, Store, output_digest


@dataclass
class TaskSpec:
    """Everything a worker needs to run one step; built by the runner, shipped to the worker."""

    name: str
    step_type: StepType
    config: Any  # references already resolved to URLs
    plain_config: Any
    prefix: str
    dirname: str
    digest: str
    scheme: str
    code_fingerprint: str
    inputs: list[InputInfo]
    resources: Resources
    run_id: str = ""
    token: int | None = None
    lease_ttl: float = 60.0
    max_node_failures: int = 3
    reason: str = ""
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskResult:
    name: str
    ok: bool
    output_digest: str | None = None
    error: str | None = None
    traceback: str | None = None
    attempt: int = 0
    started: float = 0.0
    ended: float = 0.0
    lease_lost: bool = False


def execute(task: TaskSpec, mapper: Mapper = local_map, node: str | None = None) -> TaskResult:
    """Run one step through its whole output lifecycle; never raises for a user error."""
    store = Store(task.prefix, **task.storage_options)
    leases = Leases(store, ttl=task.lease_ttl)
    started = time.time()
    previous = store.read_record(task.dirname)
    attempts = list(previous.attempts) if previous is not None and previous.digest == task.digest else []
    _close_dead_attempts(attempts, store.read_status(task.dirname))
    attempt = Attempt(number=len(attempts) + 1, state=RUNNING, started=started, host=socket.gethostname(),
                      pid=os.getpid(), node=node, run_id=task.run_id, token=task.token, reason=task.reason)
    record = Record(
        name=task.name, step_type=task.step_type.name, version=task.step_type.version, digest=task.digest,
        scheme=task.scheme, output_path=store.url(task.dirname), config=task.plain_config,
        code_fingerprint=task.code_fingerprint, resources=dataclasses.asdict(task.resources),
        inputs=task.inputs, state=RUNNING, attempts=[*attempts, attempt],
        created=previous.created if previous is not None and attempts else time.time(),
    )
    running = Status(state=RUNNING, digest=task.digest, attempt=attempt.number, token=task.token)
    with leases.fence(task.dirname, task.token) as ours:
        if ours:  # the status first: from here on a crash leaves a folder that is never a cache hit
            store.write_status(task.dirname, running)
            store.write_record(task.dirname, record)
    if not ours:
        return _lost(task, attempt, started)
    if not task.step_type.resumable:
        store.clear_partial(task.dirname)
    else:  # the folder survives; what a killed attempt had not committed goes
        store.clear_temporaries(task.dirname)

    ctx = StepContext(name=task.name, output=store.url(task.dirname), digest=task.digest, attempt=attempt.number,
                      resources=task.resources, resumable=task.step_type.resumable, mapper=mapper)
    try:
        task.step_type.fn(task.config, ctx)
        manifest = store.manifest(task.dirname)  # a failure here is the step's failure too
        digest_out = output_digest(manifest)
    except BaseException as e:  # noqa: BLE001 - the record keeps whatever the step raised
        tb = traceback.format_exc()
        # SIGTERM (Ray stopping a worker whose executor died) or SIGINT: an interruption, not a
        # failure of the step; the status stays RUNNING, as after a SIGKILL.
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
        attempt.state, attempt.ended = ("INTERRUPTED" if interrupted else FAILED), time.time()
        attempt.error, attempt.traceback = f"{type(e).__name__}: {e}", tb
        record.state, record.results = (RUNNING if interrupted else FAILED), ctx.results
        with leases.fence(task.dirname, task.token) as ours:
            ours = ours and _still_running(store, task.dirname, running)
            if ours:
                store.write_record(task.dirname, record)
                if not interrupted:
                    store.write_status(task.dirname, Status(state=FAILED, digest=task.digest,
                                                            attempt=attempt.number, token=task.token))
        if interrupted:
            raise
        if not ours:
            return _lost(task, attempt, started)
        return TaskResult(task.name, False, error=attempt.error, traceback=tb, attempt=attempt.number,
                          started=started, ended=attempt.ended)

    attempt.state, attempt.ended = SUCCESS, time.time()
    record.state, record.manifest, record.output_digest, record.results = SUCCESS, manifest, digest_out, ctx.results
    with leases.fence(task.dirname, task.token) as ours:
        # Fencing: only while the lease carries our token and the folder is still this attempt's
        # (a Ray retry of this task, after its node was presumed lost, carries the same token
        # but a later attempt number) are the record and then SUCCESS written.
        ours = ours and _still_running(store, task.dirname, running)
        if ours:
            store.write_record(task.dirname, record)
            store.write_status(task.dirname, Status(
                state=SUCCESS, digest=task.digest, output_digest=digest_out, attempt=attempt.number,
                token=task.token, inputs={i.digest: i.output_digest for i in task.inputs},
                code=task.code_fingerprint))
    if not ours:
        return _lost(task, attempt, started)
    return TaskResult(task.name, True, output_digest=digest_out, attempt=attempt.number, started=started,
                      ended=time.time())


def _close_dead_attempts(attempts: list[Attempt], status: Status | None) -> None:
    """Mark the attempts of the record that died before finishing as INTERRUPTED.

    An attempt still RUNNING died with its worker or executor. An attempt that reached SUCCESS in
    the record while the status still names it as RUNNING died between the two writes: its
    SUCCESS never counted.
    """
    for a in attempts:
        if a.state == RUNNING:
            a.state, a.error = "INTERRUPTED", a.error or "the worker or executor died during this attempt"
        elif a.state == SUCCESS and status is not None and status.state == RUNNING and status.attempt == a.number:
            a.state, a.error = "INTERRUPTED", "died after its record was written, before SUCCESS"


def _still_running(store: Store, dirname: str, running: Status) -> bool:
    status = store.read_status(dirname)
    return status is not None and (status.state, status.attempt, status.token) == (
        running.state, running.attempt, running.token)


def _lost(task: TaskSpec, attempt: Attempt, started: float) -> TaskResult:
    return TaskResult(task.name, False, error="lease lost to another executor; SUCCESS not written",
                      attempt=attempt.number, started=started, ended=time.time(), lease_lost=True)


def resolve(value: Any, url_of: Any, own: str) -> Any:
    """A copy of a config with every reference replaced by its URL (no __post_init__ re-run)."""
    if isinstance(value, InputRef):
        base = url_of(value.step_name)
        return f"{base}/{value.subpath}" if value.subpath else base
    if isinstance(value, OwnOutput):
        return f"{own}/{value.subpath}" if value.subpath else own
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = resolve(old, url_of, own)
            if new is not old:
                changes[f.name] = new
        if not changes:
            return value
        clone = copy.copy(value)
        for k, v in changes.items():
            object.__setattr__(clone, k, v)
        return clone
    if isinstance(value, (list, tuple)):
        items = [resolve(v, url_of, own) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        out = {k: resolve(v, url_of, own) for k, v in value.items()}
        return value if all(out[k] is value[k] for k in value) else type(value)(out)
    return value
