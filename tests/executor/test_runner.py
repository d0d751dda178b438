"""Running plans on a real (embedded, local) Ray: failures, reruns, staleness, selection, placement."""

import json
import os
import sys
import time
from dataclasses import dataclass

import pytest

from executor import Resources, RetryPolicy, Step, VoyageError, output_of, run_only, step_type
from executor.api import plan_steps, run_plan, run_steps
from executor.plan import Selection
from executor.storage.store import Store


@pytest.fixture(scope="module", autouse=True)
def ray_here(ray_local):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import test modules
    yield


@dataclass(frozen=True)
class Make:
    value: str
    sleep: float = run_only(default=0.0)
    salt_file: str = run_only(default="")  # when set, the output changes with this file's content


@step_type(version="1", name="runner_make")
def make(config: Make, ctx) -> None:
    time.sleep(config.sleep)
    salt = open(config.salt_file).read() if config.salt_file else ""
    with ctx.open("value.txt", "w") as f:
        f.write(config.value + salt)
    ctx.results["wrote"] = config.value


@dataclass(frozen=True)
class Join:
    parts: tuple
    fail: bool = False


@step_type(version="1", name="runner_join")
def join(config: Join, ctx) -> None:
    import fsspec

    if config.fail:
        raise RuntimeError("this step fails on purpose")
    text = "+".join(fsspec.open(p, "r").open().read() for p in config.parts)
    with ctx.open("joined.txt", "w") as f:
        f.write(text)


@dataclass(frozen=True)
class Flaky:
    marker: str


@step_type(version="1")
def flaky(config: Flaky, ctx) -> None:
    if not os.path.exists(config.marker):
        open(config.marker, "w").close()
        raise RuntimeError("first attempt fails")
    with ctx.open("ok.txt", "w") as f:
        f.write("ok")


@step_type(version="1", resumable=True)
def shards(config: Flaky, ctx) -> None:
    """Resumable: shard 0 is committed and kept across attempts; the first attempt dies while
    shard 1 is still under its temporary name (an exception stands in for the kill)."""
    from executor.storage.store import temp_path

    if not ctx.exists("shard-0"):
        with ctx.open("shard-0", "w") as f:
            f.write("zero")
    if not os.path.exists(config.marker):
        open(config.marker, "w").close()
        with ctx.open(temp_path("shard-1"), "w") as f:
            f.write("half")
        raise RuntimeError("killed while writing shard 1")
    with ctx.open("shard-1", "w") as f:
        f.write("one")


def voyage(fail=False, salt_file=""):
    a = Step("a", make, Make("A", salt_file=salt_file))
    b = Step("b", make, Make("B"))
    ab = Step("ab", join, Join((output_of(a, "value.txt"), output_of(b, "value.txt")), fail=fail))
    abc = Step("abc", join, Join((output_of(ab, "joined.txt"), output_of(b, "value.txt"))))
    lone = Step("lone", make, Make("L"))
    return [abc, lone]


def read(store, plan, name, file):
    return open(os.path.join(store.prefix, store.served_dir(plan.dag[name].dirname), file)).read()


def test_run_then_everything_cached(tmp_path):
    plan, summary = run_steps(voyage(), str(tmp_path))
    assert summary.exit_code == 0
    assert {o.state for o in summary.outcomes.values()} == {"SUCCESS"}
    store = Store(str(tmp_path))
    assert read(store, plan, "abc", "joined.txt") == "A+B+B"
    record = store.read_record(plan.dag["a"].dirname)
    assert record.state == "SUCCESS" and record.results == {"wrote": "A"} and len(record.attempts) == 1
    assert record.digest == plan.dag["a"].digest and len(record.digest) == 64
    abc = store.read_record(plan.dag["abc"].dirname)
    assert {i.name for i in abc.inputs} == {"ab", "b"} and all(i.output_digest for i in abc.inputs)
    plan2 = plan_steps(voyage(), str(tmp_path))
    assert plan2.counts() == {"CACHED": 5}


def test_a_failure_blocks_its_dependents_only(tmp_path):
    plan, summary = run_steps(voyage(fail=True), str(tmp_path))
    states = {n: o.state for n, o in summary.outcomes.items()}
    assert states == {"a": "SUCCESS", "b": "SUCCESS", "ab": "FAILED", "abc": "BLOCKED", "lone": "SUCCESS"}
    assert summary.exit_code == 1
    assert "fails on purpose" in summary.outcomes["ab"].error
    store = Store(str(tmp_path))
    record = store.read_record(plan.dag["ab"].dirname)
    assert record.state == "FAILED" and "RuntimeError: this step fails on purpose" in record.attempts[-1].traceback
    assert store.read_status(plan.dag["ab"].dirname).state == "FAILED"
    plan2 = plan_steps(voyage(fail=True), str(tmp_path))
    assert plan2["ab"].state == "RETRY" and plan2["abc"].state == "RUN"


def test_rerun_keeps_history_and_early_cutoff_when_bytes_are_identical(tmp_path):
    run_steps(voyage(), str(tmp_path))
    plan, summary = run_steps(voyage(), str(tmp_path), Selection(rerun=("a",), downstream=True))
    assert summary.outcomes["a"].state == "SUCCESS"
    assert summary.outcomes["ab"].state == "CACHED" and "early cutoff" in summary.outcomes["ab"].reason
    assert summary.outcomes["lone"].state == "CACHED"  # not selected, and cached: untouched
    assert summary.stale_after == []
    record = Store(str(tmp_path)).read_record(plan.dag["a"].dirname)
    assert [a.state for a in record.attempts] == ["SUCCESS", "SUCCESS"]
    assert record.attempts[1].reason.startswith("RERUN")


def test_rerun_with_changed_output_makes_consumers_stale(tmp_path):
    salt = tmp_path / "salt"
    salt.write_text("1")
    prefix = str(tmp_path / "p")
    run_steps(voyage(salt_file=str(salt)), prefix)
    salt.write_text("2")  # the same recipe now writes other bytes
    plan, summary = run_steps(voyage(salt_file=str(salt)), prefix, Selection(rerun=("a",)))
    assert summary.outcomes["a"].state == "SUCCESS" and summary.outcomes["ab"].state == "CACHED"
    assert summary.stale_after == ["ab"]
    plan2 = plan_steps(voyage(salt_file=str(salt)), prefix)
    assert plan2["ab"].state == "STALE" and not plan2["ab"].will_run
    assert "input a output changed" in plan2["ab"].reason
    assert plan2["abc"].state == "CACHED"  # its own inputs have not changed (yet)
    # --downstream runs the stale consumers, and then theirs
    plan3, summary3 = run_steps(voyage(salt_file=str(salt)), prefix, Selection(downstream=True))
    assert summary3.outcomes["ab"].state == "SUCCESS"
    assert read(Store(prefix), plan3, "abc", "joined.txt") == "A2+B+B"
    assert summary3.outcomes["abc"].state == "SUCCESS"


def test_only_runs_the_named_steps_and_what_they_need(tmp_path):
    plan, summary = run_steps(voyage(), str(tmp_path), Selection(only=("ab",)))
    states = {n: o.state for n, o in summary.outcomes.items()}
    assert states == {"a": "SUCCESS", "b": "SUCCESS", "ab": "SUCCESS", "abc": "SKIPPED", "lone": "SKIPPED"}


def test_partial_output_of_an_interrupted_attempt_is_cleared(tmp_path):
    plan = plan_steps(voyage(), str(tmp_path))
    store = Store(str(tmp_path))
    d = plan.dag["a"].dirname
    store.fs.makedirs(store.path(d), exist_ok=True)
    store.fs.pipe_file(store.path(d, "half-written.bin"), b"junk")
    store.fs.pipe_file(store.path(d, ".status"), json.dumps({"state": "RUNNING", "digest": plan.dag["a"].digest}).encode())
    plan, summary = run_steps(voyage(), str(tmp_path))
    assert plan["a"].state == "RETRY" and "interrupted" in plan["a"].reason
    assert summary.outcomes["a"].state == "SUCCESS"
    assert [m.path for m in store.manifest(store.served_dir(d))] == ["value.txt"]


def test_a_folder_with_files_but_no_success_is_not_cached(tmp_path):
    plan = plan_steps(voyage(), str(tmp_path))
    store = Store(str(tmp_path))
    d = plan.dag["b"].dirname
    store.fs.pipe_file(store.path(d, "value.txt"), b"B")  # looks done, is not
    plan = plan_steps(voyage(), str(tmp_path))
    assert plan["b"].state == "RUN"


def test_unplaceable_resources_fail_before_anything_runs(tmp_path):
    gpu = Step("train", make, Make("T"), resources=Resources(gpus=8, accelerator="GB200"))
    plan = plan_steps([gpu, Step("fine", make, Make("F"))], str(tmp_path))
    with pytest.raises(VoyageError, match=r"step 'train' needs .*GB200.*no node can ever run it: GB200=8 \(largest node has 0\)"):
        run_plan(plan)
    assert not any(p.name != ".lease" for p in tmp_path.rglob("*") if p.is_file())


def test_independent_steps_overlap_and_max_concurrent_serializes(tmp_path):
    steps = [Step(f"s{i}", make, Make(str(i), sleep=1.0)) for i in range(2)]
    for limit, overlap in ((2, True), (1, False)):
        _, summary = run_steps(steps, str(tmp_path / str(limit)), max_concurrent=limit)
        a, b = (summary.outcomes[f"s{i}"] for i in range(2))
        overlaps = a.started < b.ended and b.started < a.ended
        assert overlaps == overlap, (limit, a, b)


def test_retry_policy_on_exception(tmp_path):
    marker = str(tmp_path / "marker")
    s = Step("flaky", flaky, Flaky(marker), retry=RetryPolicy(max_attempts=2, on_exception=True))
    plan, summary = run_steps([s], str(tmp_path / "p"))
    assert summary.outcomes["flaky"].state == "SUCCESS" and summary.outcomes["flaky"].attempts == 2
    record = Store(str(tmp_path / "p")).read_record(plan.dag["flaky"].dirname)
    assert [a.state for a in record.attempts] == ["FAILED", "SUCCESS"]
    # without the policy a user exception is not retried
    os.remove(marker)
    _, summary = run_steps([Step("flaky", flaky, Flaky(marker))], str(tmp_path / "q"))
    assert summary.outcomes["flaky"].state == "FAILED"


def test_a_resumed_step_loses_what_its_killed_attempt_left_uncommitted(tmp_path):
    marker = str(tmp_path / "marker")
    s = Step("shards", shards, Flaky(marker), retry=RetryPolicy(max_attempts=2, on_exception=True))
    plan, summary = run_steps([s], str(tmp_path / "p"))
    assert summary.outcomes["shards"].attempts == 2
    store = Store(str(tmp_path / "p"))
    d = plan.dag["shards"].dirname
    assert sorted(os.listdir(store.path(d))) == [".attempts", ".lease", ".status"]
    # the retry resumed the folder of its lineage's attempt, less the killed attempt's temporaries
    assert len(os.listdir(store.path(d, ".attempts"))) == 1
    assert sorted(os.listdir(store.path(store.served_dir(d)))) == [".step.json", "shard-0", "shard-1"]
    # the same output digest as a run that was never interrupted
    open(str(tmp_path / "marker2"), "w").close()
    clean_plan, clean = run_steps([Step("shards", shards, Flaky(str(tmp_path / "marker2")))], str(tmp_path / "q"))
    assert clean.outcomes["shards"].attempts == 1
    clean_status = Store(str(tmp_path / "q")).read_status(clean_plan.dag["shards"].dirname)
    assert store.read_status(d).output_digest == clean_status.output_digest


def test_a_step_leased_by_a_live_executor_waits(tmp_path):
    from executor.storage.lease import Leases, Owner

    plan = plan_steps(voyage(), str(tmp_path))
    store = Store(str(tmp_path))
    other = Leases(store, ttl=60, owner=Owner("otherhost", 4242, "someone-else"))
    d = plan.dag["lone"].dirname
    other.try_acquire(d)
    store.write_status(d, __import__("executor.storage.store", fromlist=["Status"]).Status(state="RUNNING", digest=plan.dag["lone"].digest))
    plan = plan_steps(voyage(), str(tmp_path))
    assert plan["lone"].state == "WAITING" and "otherhost pid 4242" in plan["lone"].reason


@dataclass(frozen=True)
class Switch:
    control: str  # a file: "hang" makes the step raise Hang, else it writes the file's text
    value: str = run_only(default="")


@step_type(version="1", name="runner_switch")
def switch(config: Switch, ctx) -> None:
    from executor.failures import Hang

    text = open(config.control).read()
    if text == "hang":
        raise Hang("no optimizer step within 1s (a test's own)")
    with ctx.open("value.txt", "w") as f:
        f.write(text)


def test_a_rerun_whose_attempts_fail_is_failed_never_the_old_output(tmp_path):
    """A --rerun whose attempt fails (and whose retry fails too) ends FAILED with its class, exit
    1; the old output stays served; no retry takes the old commit as "done meanwhile"."""
    import io

    from executor.failures import Budget
    from executor.views.report import print_summary

    control = tmp_path / "control"
    control.write_text("good")
    prefix = str(tmp_path / "p")
    retry = RetryPolicy(budgets={"hang": Budget(1, 0.0)})
    steps = [Step("s", switch, Switch(str(control)), retry=retry)]
    plan, summary = run_steps(steps, prefix)
    assert summary.exit_code == 0
    store = Store(prefix)
    d = plan.dag["s"].dirname
    good = store.read_status(d)
    control.write_text("hang")
    plan, summary = run_steps(steps, prefix, Selection(rerun=("s",)))
    outcome = summary.outcomes["s"]
    assert (outcome.state, outcome.failure, outcome.attempts, summary.exit_code) == ("FAILED", "hang", 3, 1), outcome
    out = io.StringIO()
    print_summary(summary, plan, out)
    assert "FAILED 1" in out.getvalue() and "(hang) Hang: no optimizer step" in out.getvalue()
    now = store.read_status(d)
    assert now.state == "FAILED" and now.served().output_digest == good.output_digest  # still served
    assert now.served().attempt == good.attempt == 1
    assert read(store, plan, "s", "value.txt") == "good"
    record = store.read_record(d, now, latest=True)
    assert [a.state for a in record.attempts] == ["SUCCESS", "FAILED", "FAILED"]
    assert [a.failure for a in record.attempts[1:]] == ["hang", "hang"]
    # A plain plan afterwards serves the old output, and says its newest attempt failed.
    plan = plan_steps(steps, prefix)
    assert plan["s"].state == "CACHED" and "its newest attempt (3) failed" in plan["s"].reason
    # Once the cause is gone, a rerun that succeeds commits a new attempt.
    control.write_text("better")
    plan, summary = run_steps(steps, prefix, Selection(rerun=("s",)))
    assert summary.outcomes["s"].state == "SUCCESS" and read(store, plan, "s", "value.txt") == "better"


def test_a_failed_rerun_takes_a_commit_another_executor_made_meanwhile(tmp_path):
    """The other half of the rule: a commit that is neither the one the plan saw nor one this run
    superseded is another executor's, and a retry takes it."""
    control = tmp_path / "control"
    control.write_text("good")
    prefix = str(tmp_path / "p")
    steps = [Step("s", switch, Switch(str(control)), retry=RetryPolicy(budgets={"hang": 1}))]
    run_steps(steps, prefix)
    control.write_text("hang")
    plan = plan_steps(steps, prefix, Selection(rerun=("s",)))
    # another executor commits a new output between the plan and the run's first attempt ...
    control.write_text("theirs")
    _, other = run_steps(steps, prefix, Selection(rerun=("s",)))
    assert other.outcomes["s"].state == "SUCCESS"
    control.write_text("hang")
    summary = run_plan(plan)
    # ... which this run's forced attempt superseded: its failure stays a failure
    assert summary.outcomes["s"].state == "FAILED" and summary.exit_code == 1
    assert read(Store(prefix), plan, "s", "value.txt") == "theirs"
