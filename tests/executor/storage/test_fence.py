"""Fencing, without Ray: a worker changes a folder's status and record only while its lease still
carries its token and the folder still names its attempt; on local files the check and the writes
hold the lease's lock, so a takeover cannot slip in between. The logic runs on local files and on
memory:// (GCS runs the same logic over generation preconditions; see docs/leases.md)."""

import threading
import time
from dataclasses import dataclass

import pytest

from executor import Step, step_type
from executor.dag import build_dag
from executor.storage.lease import Leases, Owner
from executor.plan import make_plan
from executor.runner import Runner
from executor.storage.store import Attempt, Record, Status, Store, output_digest
from executor.worker import TaskResult, execute

GATES: dict[str, threading.Event] = {}  # a step blocks on its gate, if it has one


@dataclass(frozen=True)
class Parts:
    n: int
    gate: str = ""


@step_type(version="1", name="fence_parts")
def parts(config: Parts, ctx) -> None:
    for i in range(config.n):
        with ctx.open(f"part-{i}.txt", "w") as f:
            f.write(f"part {i}\n")
        if config.gate and i == 0 and config.gate in GATES:
            GATES.pop(config.gate).wait(30)


@pytest.fixture(params=["local", "memory"])
def prefix(request, tmp_path):
    return str(tmp_path / "p") if request.param == "local" else f"memory://fence-{time.time_ns()}"


def setup(prefix, gate=""):
    store = Store(prefix)
    leases = Leases(store, ttl=30, owner=Owner("driver", 1, "run-a"))
    plan = make_plan(build_dag([Step("s", parts, Parts(3, gate=gate))]), store, leases=leases)
    lease, _ = leases.try_acquire(plan["s"].node.dirname)
    task = Runner(plan, None, leases)._task(plan["s"], lease.token)  # type: ignore[arg-type]
    return store, leases, plan["s"].node.dirname, task


def test_a_zombie_attempt_superseded_by_a_retry_with_the_same_token_writes_nothing(prefix):
    """Ray retries a task whose node it presumed lost under the same lease (token): the first
    attempt, still running somewhere, must not mark the folder done under the retry's feet."""
    GATES["zombie"] = gate = threading.Event()
    store, _, dirname, task = setup(prefix, gate="zombie")
    results: list[TaskResult] = []
    zombie = threading.Thread(target=lambda: results.append(execute(task)))
    zombie.start()
    deadline = time.time() + 30
    while "zombie" in GATES or not store.fs.glob(store.path(dirname, ".attempts/*/part-0.txt")):
        assert time.time() < deadline, "the zombie never wrote its first part"
        time.sleep(0.01)
    retry = execute(task)  # the gate is gone: the retry runs straight through
    assert retry.ok and retry.attempt == 2
    gate.set()
    zombie.join(30)
    assert results[0].lease_lost and not results[0].ok
    record, status = store.read_record(dirname), store.read_status(dirname)
    assert status.state == "SUCCESS" and status.attempt == 2
    assert [a.state for a in record.attempts] == ["INTERRUPTED", "SUCCESS"]
    served = store.served_dir(dirname)
    assert record.manifest == store.manifest(served) and output_digest(record.manifest) == status.output_digest
    # the zombie finished its writes, into its own attempt's folder, which no reader resolves
    assert len(store.fs.glob(store.path(dirname, ".attempts/*/part-2.txt"))) == 2


def test_an_attempt_whose_lease_was_taken_over_writes_nothing(prefix):
    store, leases, dirname, task = setup(prefix)
    other = Leases(store, ttl=30, owner=Owner("elsewhere", 2, "run-b"))
    lease = leases.holder(dirname)
    leases.release(dirname, lease)  # as if it had expired: the other executor takes it over
    theirs, _ = other.try_acquire(dirname)
    assert theirs.token == task.token + 1
    result = execute(task)
    assert result.lease_lost and not result.ok
    assert store.read_status(dirname) is None and store.read_record(dirname) is None


def test_a_crash_between_record_and_status_is_not_a_success(prefix):
    store, _, dirname, task = setup(prefix)
    # killed right after the record said SUCCESS, before the status did
    dead = ".attempts/0001-deadbeef"
    store.write_status(dirname, Status(state="RUNNING", digest=task.digest, attempt=1, token=task.token, dir=dead))
    store.write_record(f"{dirname}/{dead}", Record(name="s", step_type="fence_parts", version="1", digest=task.digest,
                                       scheme=task.scheme, output_path=store.url(dirname), state="SUCCESS",
                                       attempts=[Attempt(number=1, state="SUCCESS", started=0.0)]))
    assert execute(task).ok
    assert [a.state for a in store.read_record(dirname).attempts] == ["INTERRUPTED", "SUCCESS"]


def test_the_local_fence_holds_off_a_takeover_until_its_writes_are_done(tmp_path):
    store = Store(str(tmp_path))
    a = Leases(store, ttl=1.0, owner=Owner("a", 1, "run-a"))  # lapses while the fence is held below
    b = Leases(store, ttl=30, owner=Owner("b", 2, "run-b"))
    lease, _ = a.try_acquire("d")
    taken = threading.Event()
    with a.fence("d", lease.token) as ours:
        assert ours
        thread = threading.Thread(target=lambda: b.try_acquire("d")[0] and taken.set())
        thread.start()
        assert not taken.wait(1.3)  # a's lease has expired meanwhile, but the fence is held
    assert taken.wait(10)
    thread.join()
    assert not a.still_ours("d", lease.token)


class LostThenDone:
    """A backend whose one task comes back `lease_lost` while another executor finishes the step."""

    def __init__(self, store: Store) -> None:
        self.store, self.done = store, []

    def submit(self, task, attempt):
        self.store.write_status(task.dirname, Status(state="SUCCESS", digest=task.digest, output_digest="x"))
        self.done.append(task.name)
        return task.name

    def wait(self, handles, timeout):
        return [(h, TaskResult(h, False, error="lease lost", lease_lost=True)) for h in handles]


def test_a_runner_that_lost_a_lease_waits_and_takes_the_new_holders_result(tmp_path):
    store = Store(str(tmp_path))
    leases = Leases(store, ttl=30)
    plan = make_plan(build_dag([Step("s", parts, Parts(1))]), store, leases=leases)
    summary = Runner(plan, LostThenDone(store), leases, poll=0.01).run()
    outcome = summary.outcomes["s"]
    assert summary.exit_code == 0 and outcome.state == "CACHED" and "another executor" in outcome.reason
