"""Running one step inside a worker: the life of one attempt (docs/concepts.md, "Attempts").

An attempt writes only into a folder of its own, `{output}/.attempts/{id}` (executor.storage.attempts),
which no reader resolves until a `.status` naming it is committed. The order of writes:
0. every input's `.status` is read: an input that has no committed output is missing, and the
   step is BLOCKED with nothing written; the config's `output_of` references are resolved to the
   folders of the attempts those statuses commit, so the step reads committed bytes only;
1. `.status` says RUNNING for this attempt and carries the SUCCESS it would replace
   (`committed`), which stays served; the attempt's record is written into its folder;
2. a fresh folder is chosen, except that a resumable step resumes the folder of its lineage's
   last uncommitted attempt (same recipe, code and inputs; never after `--rerun`), less the
   uncommitted `.tmp-*` writes of an attempt that was killed;
3. the function runs, with `ctx.output` the attempt's folder;
4. the manifest (the step type's declared logs marked, not digested) and output digest of the
   attempt's folder are computed; every input's status is read again: if the output it serves
   changed while the step read it (another executor reran it), the attempt FAILS with one line
   saying so, never SUCCESS from a half-read input;
5. inside the lease's fence, the record is written into the attempt's folder and then `.status`
   is swapped to SUCCESS naming the attempt, only if it still names this attempt: the commit.
Status and record are written only inside the fence, and data only into the attempt's own folder,
so an attempt that lost its lease (or was superseded by a retry of itself) never changes a byte a
reader resolves. A resumable step's folder is its lineage's: its writes check the lease themselves
(`StepContext.fenced`, given the attempt's `LeaseRef`), so a superseded attempt of the lineage
stops before it writes there. A failed attempt leaves `.status` FAILED with the old output still committed.
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

from executor.storage import attempts as layout
from executor import environment, heartbeat
from executor.context import LeaseRef, Mapper, StepContext, local_map
from executor import fingerprint, loaded_code
from executor.failures import StepFailure, classify
from executor.storage.lease import Leases
from executor.refs import resolve
from executor.state import StepState
from executor.step import Resources, StepType
from executor.storage.store import FAILED, RUNNING, SUCCESS, Attempt, InputInfo, Record, Status, Store, output_digest

INTERRUPTED = StepState.INTERRUPTED


@dataclass
class TaskSpec:
    """Everything a worker needs to run one step; built by the runner, shipped to the worker."""

    name: str
    step_type: StepType
    config: Any  # `output_of` references by step name (refs.detach); resolved by the worker
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
    code_parts: dict[str, str] = field(default_factory=dict)
    fresh: bool = False  # start from an empty folder even if resumable (a --rerun's first try)
    provenance: dict[str, Any] = field(default_factory=dict)  # from the DAG: sources and licences
    voyage: str = ""  # the voyage's name (StepContext.voyage); not part of any identity


@dataclass
class TaskResult:
    name: str
    ok: bool
    output_digest: str | None = None
    error: str | None = None
    traceback: str | None = None
    attempt: int = 0
    status: Status | None = None  # the SUCCESS it committed
    started: float = 0.0
    ended: float = 0.0
    lease_lost: bool = False
    blocked: bool = False  # an input had no output: nothing was written
    failure: str | None = None  # the failure class (executor.failures) when not ok


def execute(task: TaskSpec, mapper: Mapper = local_map, node: str | None = None,
            beats: heartbeat.Sink | None = None) -> TaskResult:
    """Run one attempt of a step, from its inputs to its commit; never raises for a user error.
    `beats`: where the step's heartbeat goes (executor.heartbeat), if the executor watches it."""
    store = Store(task.prefix, **task.storage_options)
    leases = Leases(store, ttl=task.lease_ttl)
    started = time.time()
    before, missing = _read_inputs(store, task)
    if missing:
        return TaskResult(task.name, False, error=missing, started=started, ended=time.time(), blocked=True)
    inputs = [i.model_copy(update={"output_digest": before[i.name].output_digest,
                                   "path": store.url(before[i.name].data_dir(_input_dirname(i)))}) for i in task.inputs]
    current = store.read_status(task.dirname)  # the newest attempt's, committed or not
    previous = store.read_record(task.dirname, current, latest=True) if current is not None else None
    attempts = list(previous.attempts) if previous is not None and previous.digest == task.digest else []
    _close_dead_attempts(attempts, current)
    clean = _starts_clean(task, previous, attempts, inputs)
    earlier: dict[str, tuple] = {}  # what the lineage's folder was made from through names (critical 4)
    if task.step_type.resumable and not clean and current is not None and current.state != SUCCESS and current.dir:
        earlier = _read_resolved(store, f"{task.dirname}/{current.dir}")
        clean = _resolved_changed(earlier, "since the attempt that left the folder")
        if clean:
            clean, earlier = "starts clean: " + clean, {}
    number = max([a.number for a in attempts] + [current.attempt if current is not None else 0]) + 1
    resumes = task.step_type.resumable and not clean and current is not None and current.state != SUCCESS \
        and previous is not None and previous.digest == task.digest
    # A folder from before attempts had folders (its status has no `dir`: its checkpoints are at its
    # root) is adopted as it is: the attempt resumes at the root, and commits it as the old layout
    # is served. A new folder would start from step 0 and leave the old checkpoints to --gc.
    folder_rel = (current.dir or "") if resumes else layout.new_dir(number)  # type: ignore[union-attr]
    folder = f"{task.dirname}/{folder_rel}" if folder_rel else task.dirname
    attempt = Attempt(number=number, state=RUNNING, started=started, host=socket.gethostname(),
                      pid=os.getpid(), node=node, run_id=task.run_id, token=task.token,
                      reason=task.reason + (f"; {clean}" if clean and task.step_type.resumable else ""))
    record = Record(
        name=task.name, step_type=task.step_type.name, version=task.step_type.version, digest=task.digest,
        scheme=task.scheme, output_path=store.url(folder), config=task.plain_config,
        code_fingerprint=task.code_fingerprint, code_parts=task.code_parts,
        resources=dataclasses.asdict(task.resources), inputs=inputs, state=RUNNING, attempts=[*attempts, attempt],
        created=previous.created if previous is not None and attempts else time.time(),
        provenance=copy.deepcopy(task.provenance), environment=environment.current(),
    )
    committed = current.served() if current is not None else None
    if committed is not None:
        committed = committed.model_copy(update={"committed": None})
    running = Status(state=RUNNING, digest=task.digest, attempt=number, token=task.token, dir=folder_rel,
                     committed=committed)
    with leases.fence(task.dirname, task.token) as ours:
        # the status first: from here on a crash leaves an attempt that is never served. A swap
        # against the status read at the start, not a plain write: a writer that passed its fence
        # check and then stalled past the ttl (an object store's fence is a check, then writes)
        # must not land RUNNING over the SUCCESS another executor committed meanwhile
        ours = ours and store.swap_status(task.dirname, current, running)  # type: ignore[arg-type]
        if ours:
            store.write_record(folder, record)
    if not ours:
        return _lost(task, attempt, started)
    if resumes:  # the lineage's folder survives; what a killed attempt had not committed goes
        store.clear_temporaries(folder)

    lease = None if task.token is None else LeaseRef(task.prefix, task.dirname, task.token, task.lease_ttl,
                                                     dict(task.storage_options), attempt=number)
    ctx = StepContext(name=task.name, output=store.url(folder), digest=task.digest, attempt=number,
                      resources=task.resources, resumable=task.step_type.resumable, mapper=mapper,
                      provenance=copy.deepcopy(task.provenance), lease=lease, voyage=task.voyage)
    dirs = {i.name: store.url(before[i.name].data_dir(_input_dirname(i))) for i in task.inputs}
    resolved = layout.Resolved(on_new=lambda r: store.write_json(
        store.path(folder, layout.RESOLVED), {k: list(v) for k, v in sorted(r.seen.items())}))
    resolved.seen.update(earlier)
    try:
        config = resolve(task.config, dirs.__getitem__, store.url(folder))
        _check_loaded_code(task)
        with resolved, heartbeat.sending_to(beats, name=task.name, output=store.url(folder), attempt=number,
                                            node=node):
            task.step_type.fn(config, ctx)
        manifest = store.manifest(folder, is_log=task.step_type.is_log)  # its failure is the step's
        digest_out = output_digest(manifest)
        store.sync(folder)  # on a local disk: the files reach the disk before a commit names them
        _check_loaded_code(task)  # again: what the step imported while it ran
        _check_inputs_unchanged(store, task, before)
        changed = _resolved_changed(resolved.seen, f"while {task.name} read it")
        if changed:
            raise InputChanged(f"{changed}: another executor reran it; this attempt is not committed; "
                               f"run {task.name} again")
    except BaseException as e:  # noqa: BLE001 - the record keeps whatever the step raised
        tb = traceback.format_exc()
        # SIGTERM (Ray stopping a worker whose executor died) or SIGINT: an interruption, not a
        # failure of the step; the status stays RUNNING, as after a SIGKILL.
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
        if not interrupted and not isinstance(e, InputChanged):
            # A file of an input that vanished under the step (another executor reran it and the
            # old attempt was retired): the one-line reason, not the step's own FileNotFoundError.
            try:
                _check_inputs_unchanged(store, task, before)
            except InputChanged as changed:
                e = changed
            except Exception:  # noqa: BLE001 - the store cannot say: keep the step's own error
                pass
        attempt.state, attempt.ended = (INTERRUPTED if interrupted else FAILED), time.time()
        attempt.error, attempt.traceback, attempt.failure = f"{type(e).__name__}: {e}", tb, classify(e)
        record.state, record.results = (RUNNING if interrupted else FAILED), ctx.results
        record.provenance = ctx.provenance
        with leases.fence(task.dirname, task.token) as ours:
            ours = ours and _still_running(store, task.dirname, running)
            if ours:
                store.write_record(folder, record)
                if not interrupted:
                    store.swap_status(task.dirname, running, running.model_copy(update={"state": FAILED}))
        if interrupted:
            raise
        if not ours:
            return _lost(task, attempt, started)
        return TaskResult(task.name, False, error=attempt.error, traceback=tb, attempt=number,
                          started=started, ended=attempt.ended, failure=attempt.failure)

    attempt.state, attempt.ended = SUCCESS, time.time()
    record.state, record.manifest, record.output_digest, record.results = SUCCESS, manifest, digest_out, ctx.results
    record.provenance = ctx.provenance
    done = Status(state=SUCCESS, digest=task.digest, output_digest=digest_out, attempt=number, token=task.token,
                  inputs={i.name: i.output_digest for i in inputs}, inputs_by="name", code=task.code_fingerprint,
                  env=environment.packages_digest(record.environment),
                  commit=environment.commit_text(record.environment), dir=folder_rel)
    with leases.fence(task.dirname, task.token) as ours:
        # Fencing: only while the lease carries our token and the status still names this attempt
        # (a Ray retry of this task, after its node was presumed lost, carries the same token but
        # a later attempt) is the record written, then the status swapped to SUCCESS: the commit.
        ours = ours and _still_running(store, task.dirname, running)
        if ours:
            store.write_record(folder, record)
            ours = store.swap_status(task.dirname, running, done)
    if not ours:
        return _lost(task, attempt, started)
    if task.step_type.alias:
        from executor.storage.alias import write_alias

        write_alias(store, task.name, task.dirname, folder_rel)
    return TaskResult(task.name, True, output_digest=digest_out, attempt=number, started=started,
                      ended=time.time(), status=done)


class CodeMismatch(StepFailure):
    """The code this worker runs is not the code the plan fingerprinted (executor.loaded_code):
    the record would say the wrong code made the output."""


def _check_loaded_code(task: TaskSpec) -> None:
    if task.code_parts and task.code_fingerprint.partition(":")[0] == fingerprint.SCHEME:
        why = loaded_code.mismatch(task.code_parts)
        if why:
            raise CodeMismatch(f"{task.name}: {why}")


def fail_from_outside(task: TaskSpec, number: int, error: str, failure: str, detail: str = "") -> bool:
    """Record that attempt `number` of `task` was ended from outside its process (the executor
    killed a worker whose heartbeat stopped): its record says FAILED with `error` and `failure`,
    and `.status` FAILED (the committed output it carries stays served). Only while the lease
    carries the task's token and `.status` still names that attempt as RUNNING; True if written.
    Called after the worker is dead, so nothing of the attempt writes at the same time."""
    store = Store(task.prefix, **task.storage_options)
    leases = Leases(store, ttl=task.lease_ttl)
    with leases.fence(task.dirname, task.token) as ours:
        status = store.read_status(task.dirname) if ours else None
        if status is None or status.state != RUNNING or status.attempt != number or status.token != task.token:
            return False
        record = store.read_record(task.dirname, status, latest=True)
        if record is not None:
            for a in record.attempts:
                if a.number == number and a.state == RUNNING:
                    a.state, a.ended, a.error, a.failure = FAILED, time.time(), error, failure
                    a.traceback = detail or None
            record.state = FAILED
            store.write_record(status.data_dir(task.dirname), record)
        return store.swap_status(task.dirname, status, status.model_copy(update={"state": FAILED}))


class InputChanged(RuntimeError):
    """An input was rerun (or removed) while the step read it: what it read may be half of one
    output and half of another, so the attempt fails rather than ever being SUCCESS."""


def _input_dirname(info: InputInfo) -> str:
    return f"{info.name}-{info.digest[:10]}"  # executor.dag.Node.dirname


def _read_inputs(store: Store, task: TaskSpec) -> tuple[dict[str, Status], str]:
    """The status of every input (one batch), and why the step cannot start if one has no output."""
    if not task.inputs:
        return {}, ""
    found = store.read_statuses([_input_dirname(i) for i in task.inputs])
    statuses: dict[str, Status] = {}
    missing: list[str] = []
    for info in task.inputs:
        status = found[_input_dirname(info)]
        served = status.served() if status is not None else None
        if served is None:
            what = "no .status" if status is None else f"its .status is {status.state}" + (
                ", being run by another executor" if status.state == RUNNING else "")
            missing.append(f"input {info.name} has no output ({what})")
        else:
            statuses[info.name] = served
    if missing:
        return statuses, f"{'; '.join(missing)}: {task.name} did not start (nothing written)"
    return statuses, ""


def _check_inputs_unchanged(store: Store, task: TaskSpec, before: dict[str, Status]) -> None:
    """Raise InputChanged if an input's status moved while the step ran (state, output,
    attempt or fencing token): another executor reran it under the step's feet."""
    if not task.inputs:
        return
    after, _ = _read_inputs(store, task)
    changed = []
    for info in task.inputs:
        old, new = before[info.name], after.get(info.name)
        if new is None or (old.output_digest, old.attempt, old.token, old.dir) != \
                (new.output_digest, new.attempt, new.token, new.dir):
            now = "no output now" if new is None else \
                f"output {(old.output_digest or '')[:10]} -> {(new.output_digest or '')[:10]}, attempt {old.attempt} -> {new.attempt}"
            changed.append(f"input {info.name} changed while {task.name} read it ({now})")
    if changed:
        raise InputChanged(f"{'; '.join(changed)}: another executor reran it; this attempt is not "
                           f"committed; run {task.name} again")


def _read_resolved(store: Store, folder: str) -> dict[str, tuple]:
    """What an attempt in `folder` recorded it resolved (executor.storage.attempts.Resolved)."""
    import json

    try:
        data = json.loads(store.fs.cat_file(store.path(folder, layout.RESOLVED)))
    except FileNotFoundError:
        return {}
    except ValueError:
        return {"(unreadable .resolved.json)": ()}  # never resume from what cannot be checked
    return {str(k): tuple(v) for k, v in data.items()} if isinstance(data, dict) else {"(bad .resolved.json)": ()}


def _resolved_changed(seen: dict[str, tuple], when: str) -> str:
    """"" if every output an attempt reached through other outputs' names still serves what it
    did; else one phrase naming the first that changed."""
    for folder, key in sorted(seen.items()):
        now = layout.current_key(folder) if key else None
        if now is None or tuple(now) != tuple(key):
            name = folder.rstrip("/").rpartition("/")[2]
            what = "has no output now" if now is None else \
                f"attempt {key[0] if key else '?'} -> {now[0]}, output {str(key[3] if key else '')[:10]} -> {str(now[3])[:10]}"
            return f"output {name} (read through another output's names) changed {when} ({what})"
    return ""


def _starts_clean(task: TaskSpec, previous: Record | None, attempts: list[Attempt], inputs: list[InputInfo]) -> str:
    """Why a resumable step must not resume from its folder ("" if it may): resume applies only
    within one lineage of one recipe, code and inputs."""
    if task.fresh and not any(a.run_id == task.run_id and a.token == task.token for a in attempts):
        return "starts clean (forced, or made without an input before)"  # a Ray retry of it resumes
    if previous is None or not attempts:
        return ""
    recorded = previous.code_fingerprint
    if recorded and recorded.split(":")[0] == task.code_fingerprint.split(":")[0] and \
            recorded != task.code_fingerprint:
        return "starts clean: the code changed since the attempt that left the folder"
    read_then = {i.name: i.output_digest for i in previous.inputs}
    if read_then != {i.name: i.output_digest for i in inputs}:
        return "starts clean: its inputs changed since the attempt that left the folder"
    return ""


def _close_dead_attempts(attempts: list[Attempt], status: Status | None) -> None:
    """Mark the attempts of the record that died before finishing as INTERRUPTED.

    An attempt still RUNNING died with its worker or executor. An attempt that reached SUCCESS in
    the record while the status still names it as RUNNING died between the two writes: its
    SUCCESS never counted.
    """
    for a in attempts:
        if a.state == RUNNING:
            a.state, a.error = INTERRUPTED, a.error or "the worker or executor died during this attempt"
        elif a.state == SUCCESS and status is not None and status.state == RUNNING and status.attempt == a.number:
            a.state, a.error = INTERRUPTED, "died after its record was written, before SUCCESS"


def _still_running(store: Store, dirname: str, running: Status) -> bool:
    status = store.read_status(dirname)
    return status is not None and (status.state, status.attempt, status.token, status.dir) == (
        running.state, running.attempt, running.token, running.dir)


def _lost(task: TaskSpec, attempt: Attempt, started: float) -> TaskResult:
    return TaskResult(task.name, False, error="lease lost to another executor; SUCCESS not written",
                      attempt=attempt.number, started=started, ended=time.time(), lease_lost=True)
