"""Attempts that readers never see (docs/concepts.md, "Attempts").

Each attempt writes into `{output}/.attempts/{id}`; a reader resolves only the attempt a
`.status` commits, and the commit is one fenced swap of that file. The runner and the worker are
the real ones; only Ray is left out (an inline backend runs each task in this process), so a step
can be paused between two writes on an event the test holds, deterministically.
"""

import json
import os
import threading
import time
from dataclasses import dataclass

import pytest

from executor import InputPath, Step, output_of, run_only, step_type
from executor.dag import build_dag
from executor.storage.lease import Leases, Owner
from executor.plan import Selection, make_plan
from executor.runner import Runner
from executor.storage.store import Status, Store, output_digest
from executor.worker import execute

GATES: dict[str, threading.Event] = {}  # a step that finds its gate here waits on it, once
REACHED: dict[str, threading.Event] = {}  # set when the step reaches its gate


@dataclass(frozen=True)
class Parts:
    gate: str = run_only(default="")
    fail_if: str = run_only(default="")  # a file: the step fails while it exists
    salt: str = ""


@step_type(version="1", name="attempts_parts")
def parts(config: Parts, ctx) -> None:
    """Two parts, each naming the attempt folder that wrote it; waits between them on its gate."""
    if config.fail_if and os.path.exists(config.fail_if):
        raise RuntimeError("fails on purpose")
    me = ctx.output.rpartition("/")[2] + config.salt
    with ctx.open("part-0.txt", "w") as f:
        f.write(me)
    _wait(config.gate)
    with ctx.open("part-1.txt", "w") as f:
        f.write(me)


@dataclass(frozen=True)
class Copy:
    src: InputPath
    gate: str = run_only(default="")


@step_type(version="1", name="attempts_copy")
def copy_parts(config: Copy, ctx) -> None:
    """Reads part-0, waits on its gate, reads part-1."""
    with ctx.open_input(config.src, "part-0.txt", "r") as f:
        first = f.read()
    _wait(config.gate)
    with ctx.open_input(config.src, "part-1.txt", "r") as f:
        second = f.read()
    with ctx.open("copy.txt", "w") as f:
        f.write(f"{first}|{second}")


def _wait(gate: str) -> None:
    if gate and gate in GATES:
        REACHED[gate].set()
        assert GATES.pop(gate).wait(30), "the test never opened the gate"


class Inline:
    """A backend that runs each task in this process when it is submitted."""

    def __init__(self) -> None:
        self.done: dict[str, object] = {}

    def submit(self, task, attempt):
        self.done[task.name] = execute(task)
        return task.name

    def wait(self, handles, timeout):
        return [(h, self.done.pop(h)) for h in handles]


def steps(gate_p: str = "", gate_c: str = "", fail_if: str = "") -> list[Step]:
    p = Step("p", parts, Parts(gate=gate_p, fail_if=fail_if))
    return [p, Step("c", copy_parts, Copy(output_of(p), gate=gate_c))]


class Paused(Leases):
    """The leases of an executor that is stopped (SIGSTOP): its heartbeat renews nothing."""

    def renew(self, dirname, lease):
        return lease


def run(store: Store, owner: str, ttl: float = 30, selection: Selection | None = None, paused: bool = False, **kw):
    leases = (Paused if paused else Leases)(store, ttl=ttl, owner=Owner(owner, 1, f"run-{owner}-{time.time_ns()}"))
    plan = make_plan(build_dag(steps(**kw)), store, selection, leases=leases, provenance=False)
    return plan, Runner(plan, Inline(), leases, poll=0.01).run()


def served_text(store: Store, plan, name: str, file: str) -> str:
    with store.fs.open(store.path(store.served_dir(plan.dag[name].dirname), file), "r") as f:
        return f.read()


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    return Store(str(tmp_path / "p") if request.param == "local" else f"memory://attempts-{time.time_ns()}")


def gate(name: str) -> threading.Event:
    GATES[name], REACHED[name] = threading.Event(), threading.Event()
    return GATES[name]


def test_a_paused_writer_never_changes_a_byte_of_the_output_that_took_over(store):
    """Executor A writes part-0 and is paused (its heartbeat with it) past its lease's ttl; B
    takes over, runs the step in its own attempt and commits; A resumes and writes part-1. The
    committed output is B's alone, its manifest matches its files, and the consumer reads B's."""
    go = gate("paused")
    a_result: list = []
    # a ttl that outlasts a loaded machine's delay before A's first fenced write, then lapses
    a = threading.Thread(target=lambda: a_result.append(run(store, "a", ttl=1.5, paused=True, gate_p="paused")))
    a.start()
    assert REACHED["paused"].wait(30)
    time.sleep(1.6)  # A's lease expires while it is paused (nothing renews it)
    plan_b, b = run(store, "b")
    assert b.outcomes["p"].state == "SUCCESS" and b.outcomes["c"].state == "SUCCESS", b.outcomes
    committed = store.read_status(plan_b.dag["p"].dirname)
    go.set()  # A resumes: its second write lands in its own attempt's folder
    a.join(30)
    _, a_summary = a_result[0]
    assert a_summary.exit_code == 0, a_summary.outcomes  # it lost the lease, and took B's result
    assert a_summary.outcomes["p"].state == "CACHED" and "another executor" in a_summary.outcomes["p"].reason

    d = plan_b.dag["p"].dirname
    assert store.read_status(d) == committed  # A changed nothing a reader resolves
    b_folder = committed.dir.rpartition("/")[2]
    assert served_text(store, plan_b, "p", "part-0.txt") == served_text(store, plan_b, "p", "part-1.txt") == b_folder
    assert served_text(store, plan_b, "c", "copy.txt") == f"{b_folder}|{b_folder}"
    record = store.read_record(d)
    assert output_digest(store.manifest(store.served_dir(d))) == committed.output_digest == record.output_digest
    # A's two writes are there, in an attempt nobody serves
    a_parts = [p for p in store.fs.glob(store.path(d, ".attempts/*/part-1.txt")) if b_folder not in p]
    assert len(a_parts) == 1
    # and the next plan trusts what is served
    plan = make_plan(build_dag(steps()), store, provenance=False)
    assert [x.state for x in plan.decisions] == ["CACHED", "CACHED"]


@step_type(version="1", name="attempts_lineage", resumable=True)
def lineage_parts(config: Parts, ctx) -> None:
    """A resumable step: two parts naming the attempt that wrote them, its gate between them."""
    for i in range(2):
        if i:
            _wait(config.gate)
        with ctx.open(f"part-{i}.txt", "w") as f:
            f.write(str(ctx.attempt))


def run_lineage(store: Store, owner: str, ttl: float = 30, paused: bool = False, gate_p: str = ""):
    leases = (Paused if paused else Leases)(store, ttl=ttl, owner=Owner(owner, 1, f"run-{owner}-{time.time_ns()}"))
    plan = make_plan(build_dag([Step("p", lineage_parts, Parts(gate=gate_p))]), store, leases=leases, provenance=False)
    return plan, Runner(plan, Inline(), leases, poll=0.01).run()


def test_a_paused_writer_of_a_resumable_step_never_writes_into_the_attempt_that_resumed_it(store):
    """A resumable step's next attempt resumes its lineage's folder, so a paused writer and the
    attempt that took over share it. A writes part-0 and is paused past its ttl; B resumes A's
    folder, writes both parts and commits; A resumes: its write of part-1 checks the lease
    first (ctx.open of a resumable step is fenced) and stops. The output is B's alone."""
    go = gate("lineage")
    a_result: list = []
    # a ttl that outlasts a loaded machine's delay before A's first (fenced) write, then lapses
    a = threading.Thread(target=lambda: a_result.append(run_lineage(store, "a", ttl=1.5, paused=True,
                                                                    gate_p="lineage")))
    a.start()
    assert REACHED["lineage"].wait(30)
    time.sleep(1.6)
    plan_b, b = run_lineage(store, "b")
    assert b.outcomes["p"].state == "SUCCESS", b.outcomes
    d = plan_b.dag["p"].dirname
    committed = store.read_status(d)
    assert committed.attempt == 2 and len(store.fs.glob(store.path(d, ".attempts/*"))) == 1  # B resumed A's folder
    go.set()
    a.join(30)
    _, a_summary = a_result[0]
    assert a_summary.exit_code == 0 and a_summary.outcomes["p"].state == "CACHED", a_summary.outcomes
    assert store.read_status(d) == committed
    assert served_text(store, plan_b, "p", "part-0.txt") == served_text(store, plan_b, "p", "part-1.txt") == "2"
    assert output_digest(store.manifest(store.served_dir(d))) == committed.output_digest


def test_a_failed_rerun_keeps_the_old_output_and_its_consumers_cached(store, tmp_path):
    plan, summary = run(store, "a")
    assert summary.exit_code == 0
    before = {n: served_text(store, plan, n, f) for n, f in (("p", "part-0.txt"), ("c", "copy.txt"))}
    old = store.read_status(plan.dag["p"].dirname)
    fail = tmp_path / "fail"
    fail.write_text("")
    _, summary = run(store, "b", selection=Selection(rerun=("p",)), fail_if=str(fail))
    assert summary.outcomes["p"].state == "FAILED" and "fails on purpose" in summary.outcomes["p"].error

    status = store.read_status(plan.dag["p"].dirname)
    assert status.state == "FAILED" and status.attempt == 2 and status.served() == old
    plan = make_plan(build_dag(steps(fail_if=str(fail))), store, provenance=False)
    p, c = plan["p"], plan["c"]
    assert p.state == "CACHED" and c.state == "CACHED", (p.reason, c.reason)
    assert "newest attempt (2) failed: attempt 1's output is still served" in p.reason
    assert {n: served_text(store, plan, n, f) for n, f in (("p", "part-0.txt"), ("c", "copy.txt"))} == before
    # the record served is the committed attempt's; the failed attempt's is in its own folder
    assert store.read_record(plan.dag["p"].dirname).state == "SUCCESS"
    assert store.read_record(plan.dag["p"].dirname, latest=True).attempts[-1].state == "FAILED"


def test_a_rerun_starts_a_clean_attempt_and_its_consumers_read_the_new_one(store):
    plan, _ = run(store, "a")
    first = store.served_dir(plan.dag["p"].dirname)
    _, summary = run(store, "b", selection=Selection(rerun=("p",)))
    assert summary.outcomes["p"].state == "SUCCESS"
    second = store.served_dir(plan.dag["p"].dirname)
    assert second != first and served_text(store, plan, "p", "part-0.txt") == second.rpartition("/")[2]
    plan = make_plan(build_dag(steps()), store, provenance=False)
    assert plan["c"].state == "STALE"  # the rerun wrote other bytes (its folder's name)
    _, summary = run(store, "c", selection=Selection(rerun=("c",)))
    assert served_text(store, plan, "c", "copy.txt") == "|".join([second.rpartition("/")[2]] * 2)


def test_a_reader_whose_input_is_rerun_and_retired_mid_read_fails_in_one_line(store):
    """c reads part-0 of p's committed attempt; another executor reruns p and the old attempt is
    retired (deleted) before c reads part-1: c fails with one line naming the input, never with a
    bare FileNotFoundError, and nothing of c is committed."""
    plan, summary = run(store, "a")
    assert summary.exit_code == 0
    old = store.served_dir(plan.dag["p"].dirname)
    go = gate("reader")
    result: list = []
    reader = threading.Thread(target=lambda: result.append(
        run(store, "c", selection=Selection(rerun=("c",)), gate_c="reader")))
    reader.start()
    assert REACHED["reader"].wait(30)
    _, other = run(store, "b", selection=Selection(rerun=("p",)))
    assert other.outcomes["p"].state == "SUCCESS"
    store.fs.rm(store.path(old), recursive=True)  # retired by a collector of old attempts
    go.set()
    reader.join(30)
    _, summary = result[0]
    c = summary.outcomes["c"]
    assert c.state == "FAILED" and c.error.startswith("InputChanged: input p changed while c read it"), c.error
    assert "\n" not in c.error
    assert store.read_status(plan.dag["c"].dirname).state == "FAILED"
    assert store.read_status(plan.dag["c"].dirname).served() is not None  # the old copy is still served


@pytest.mark.parametrize("content", [{"state": "SUCCESS"}, {"state": "SUCCESS", "digest": "ab"},
                                     {"state": "RUNNING"}, ["SUCCESS"]])
def test_a_status_missing_its_required_fields_is_corrupt_not_cached(tmp_path, content):
    store = Store(str(tmp_path))
    dag = build_dag(steps())
    d = dag["p"].dirname
    store.fs.makedirs(store.path(d), exist_ok=True)
    store.fs.pipe_file(store.path(d, ".status"), json.dumps(content).encode())
    assert store.read_status(d) is None
    plan = make_plan(dag, store, provenance=False)
    assert plan["p"].state == "RUN" and "its .status is corrupt" in plan["p"].reason, plan["p"].reason


def test_an_old_layout_output_without_attempts_is_still_read(tmp_path):
    """A `.status` written before attempts had folders (no `dir`) serves the folder itself."""
    store = Store(str(tmp_path))
    dag = build_dag(steps())
    d = dag["p"].dirname
    for part in ("part-0.txt", "part-1.txt"):
        store.fs.pipe_file(store.path(d, part), b"old")
    digest = output_digest(store.manifest(d))
    store.write_status(d, Status(state="SUCCESS", digest=dag["p"].digest, output_digest=digest, attempt=1))
    plan, summary = run(store, "a")
    assert plan["p"].state == "CACHED" and summary.outcomes["c"].state == "SUCCESS"
    assert served_text(store, plan, "c", "copy.txt") == "old|old"


# -- item 4: what is hashed is what runs ---------------------------------------------------------------

@dataclass(frozen=True)
class Rate:
    lr: float = 0.5
    steps: int = 1
    table: dict[str, float] | None = None


@step_type(version="1", name="attempts_rate")
def rate(config: Rate, ctx) -> None:
    """Writes the repr of what it received."""
    with ctx.open("out.txt", "w") as f:
        f.write(repr((config.lr, config.steps, config.table)))


def test_the_step_receives_its_config_normalised_as_it_was_hashed(tmp_path):
    store = Store(str(tmp_path))
    leases = Leases(store, ttl=30)
    given = Step("r", rate, Rate(lr=1, steps=2.0, table={"a": 3}))  # an int for a float, a whole float for an int
    plan = make_plan(build_dag([given]), store, leases=leases, provenance=False)
    assert Runner(plan, Inline(), leases, poll=0.01).run().exit_code == 0
    assert served_text(store, plan, "r", "out.txt") == "(1.0, 2, {'a': 3.0})"
    same = make_plan(build_dag([Step("r", rate, Rate(lr=1.0, steps=2, table={"a": 3.0}))]), store, provenance=False)
    assert same["r"].state == "CACHED" and same.dag["r"].digest == plan.dag["r"].digest
