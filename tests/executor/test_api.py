"""`executor.api` (exported by `executor`): plan and run from Python without leases or Ray in
sight; `InputPath` for config fields that hold another step's output; `ctx.open_input`."""

from dataclasses import dataclass

import pytest

import executor
from executor import InputPath, Step, StepContext, VoyageError, output_of, plan_steps, run_steps, step_type


@dataclass(frozen=True)
class Words:
    text: str


@step_type(version="1", name="api_words")
def words(config: Words, ctx: StepContext) -> None:
    with ctx.open("words.txt", "w") as f:
        f.write(config.text)


@dataclass(frozen=True)
class Count:
    words: InputPath  # a type checker accepts output_of(...) here; the step reads a URL
    folder: InputPath


@step_type(version="1", name="api_count")
def count(config: Count, ctx: StepContext) -> None:
    with ctx.open_input(config.words, mode="r") as f:
        n = len(f.read().split())
    with ctx.open_input(config.folder, "words.txt") as f:
        assert len(f.read().split()) == n
    with pytest.raises(VoyageError, match="read-only"):
        ctx.open_input(config.words, mode="w")
    ctx.results["words"] = n


def test_the_api_hides_leases_and_ray(tmp_path, ray_local):
    from ray import cloudpickle

    import sys

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    assert {"plan_steps", "run_steps", "InputPath", "StepState"} <= set(executor.__all__)
    w = Step("w", words, Words("a b c"))
    steps = [Step("n", count, Count(words=output_of(w, "words.txt"), folder=output_of(w)))]
    plan = plan_steps(steps, str(tmp_path))
    assert [d.state for d in plan.decisions] == ["RUN", "RUN"]
    plan, summary = run_steps(steps, str(tmp_path))
    assert summary.exit_code == 0
    from executor.storage.store import Store

    assert Store(str(tmp_path)).read_record(plan["n"].node.dirname).results == {"words": 3}
    assert plan_steps(steps, str(tmp_path)).counts() == {"CACHED": 2}


def test_a_plan_makes_its_leases_when_asked_and_still_sees_another_executors(tmp_path):
    """plan_steps makes the executor's leases only when they are needed (a dry-run on a local
    folder then needs no fsspec filesystem): a folder RUNNING under another executor's live lease
    is still WAITING, and the plan that is run has one set of leases, made once."""
    from executor.storage.lease import Leases
    from executor.storage.store import RUNNING, Status, Store

    steps = [Step("w", words, Words("a b"))]
    plan = plan_steps(steps, str(tmp_path))
    assert plan.given_leases is None and plan["w"].state == "RUN"
    assert isinstance(plan.leases, Leases) and plan.leases is plan.leases and plan.leases.ttl == 60.0

    store = Store(str(tmp_path))
    dirname = plan.dag["w"].dirname
    other = Leases(store, ttl=60.0)
    assert other.try_acquire(dirname)[0] is not None
    store.write_status(dirname, Status(state=RUNNING, digest=plan.dag["w"].digest))
    again = plan_steps(steps, str(tmp_path), lease_ttl=30.0)
    assert again["w"].state == "WAITING" and again["w"].holder.run_id == other.owner.run_id
    assert again.leases.ttl == 30.0 and again.leases.owner.run_id != other.owner.run_id
