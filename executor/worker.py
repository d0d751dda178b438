"""Running one step inside a worker: the life of an output folder.

absent -> RUNNING -> SUCCESS | FAILED. The order of writes is the whole point:
1. the record gains a new attempt and `.status` says RUNNING (a crash from here on leaves a
   folder that is never a cache hit);
2. a non-resumable step's partial output from an earlier attempt is cleared;
3. the function runs;
4. the manifest and output digest are computed and the record is written;
5. the lease is checked to still carry our fencing token;
6. only then is `.status` SUCCESS written.
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
    started = time.time()
    previous = store.read_record(task.dirname)
    attempts = list(previous.attempts) if previous is not None and previous.digest == task.digest else []
    for a in attempts:  # an attempt still RUNNING in the record died with its worker
        if a.state == RUNNING:
            a.state, a.error = "INTERRUPTED", a.error or "the worker or executor died during this attempt"
    attempt = Attempt(number=len(attempts) + 1, state=RUNNING, started=started, host=socket.gethostname(),
                      pid=os.getpid(), node=node, run_id=task.run_id, token=task.token, reason=task.reason)
    record = Record(
        name=task.name, step_type=task.step_type.name, version=task.step_type.version, digest=task.digest,
        scheme=task.scheme, output_path=store.url(task.dirname), config=task.plain_config,
        code_fingerprint=task.code_fingerprint, resources=dataclasses.asdict(task.resources),
        inputs=task.inputs, state=RUNNING, attempts=[*attempts, attempt],
        created=previous.created if previous is not None and attempts else time.time(),
    )
    store.write_record(task.dirname, record)
    store.write_status(task.dirname, Status(state=RUNNING, digest=task.digest, attempt=attempt.number,
                                            token=task.token))
    if not task.step_type.resumable:
        store.clear_partial(task.dirname)

    ctx = StepContext(name=task.name, output=store.url(task.dirname), digest=task.digest, attempt=attempt.number,
                      resources=task.resources, resumable=task.step_type.resumable, mapper=mapper)
    leases = Leases(store, ttl=task.lease_ttl)
    try:
        task.step_type.fn(task.config, ctx)
    except BaseException as e:  # noqa: BLE001 - the record keeps whatever the step raised
        tb = traceback.format_exc()
        attempt.state, attempt.ended = FAILED, time.time()
        attempt.error, attempt.traceback = f"{type(e).__name__}: {e}", tb
        record.state, record.results = FAILED, ctx.results
        store.write_record(task.dirname, record)
        if task.token is None or leases.still_ours(task.dirname, task.token):
            store.write_status(task.dirname, Status(state=FAILED, digest=task.digest, attempt=attempt.number,
                                                    token=task.token))
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return TaskResult(task.name, False, error=attempt.error, traceback=tb, attempt=attempt.number,
                          started=started, ended=attempt.ended)

    manifest = store.manifest(task.dirname)
    digest_out = output_digest(manifest)
    attempt.state, attempt.ended = SUCCESS, time.time()
    record.state, record.manifest, record.output_digest, record.results = SUCCESS, manifest, digest_out, ctx.results
    store.write_record(task.dirname, record)
    if task.token is not None and not leases.still_ours(task.dirname, task.token):
        # Fencing: another executor took this folder over; its SUCCESS, not ours, counts.
        return TaskResult(task.name, False, error="lease lost to another executor; SUCCESS not written",
                          attempt=attempt.number, started=started, ended=time.time(), lease_lost=True)
    store.write_status(task.dirname, Status(
        state=SUCCESS, digest=task.digest, output_digest=digest_out, attempt=attempt.number, token=task.token,
        inputs={i.digest: i.output_digest for i in task.inputs}, code=task.code_fingerprint))
    return TaskResult(task.name, True, output_digest=digest_out, attempt=attempt.number, started=started,
                      ended=time.time())


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
