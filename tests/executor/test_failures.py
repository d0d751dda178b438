"""Failure classes and their retry budgets (executor/failures.py), and a code error through the
runner on a real Ray: not retried, its class in the record and one line in the summary."""

import io
import json
import os
import sys
from dataclasses import dataclass

import pytest

from executor.storage.store import Store

from executor import Hang, NonFinite, RetryPolicy, Step, VoyageError, step_type
from executor.api import run_steps
from executor.failures import (CODE_ERROR, HANG, LOST_NODE, NON_FINITE, OOM, Budget, budget_for, classify,
                               classify_text, should_retry)


class WorkerCrashedError(Exception):  # Ray's name: classified by name, so the executor needs no Ray
    pass


class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name
    pass


class LocalRayletDiedError(Exception):  # Ray's name: the raylet of the driver's node died (chaos bench)
    pass


@pytest.mark.parametrize("error, cls", [
    (Hang("stuck"), HANG), (NonFinite("nan"), NON_FINITE), (OutOfMemoryError("CUDA out of memory"), OOM),
    (MemoryError(), OOM), (WorkerCrashedError("node died"), LOST_NODE), (KeyboardInterrupt(), LOST_NODE),
    (LocalRayletDiedError("The task's local raylet died. Check raylet.out for more information."), LOST_NODE),
    (ValueError("bug"), CODE_ERROR), (ZeroDivisionError(), CODE_ERROR)])
def test_classify(error, cls):
    assert classify(error) == cls
    assert classify_text(f"{type(error).__name__}: {error}") == cls


def test_each_class_has_its_budget_and_backoff():
    policy = RetryPolicy()
    spent: dict = {}
    assert should_retry(policy, CODE_ERROR, spent) is None  # a code error is not retried
    assert [should_retry(policy, HANG, spent) for _ in range(3)] == [1.0, 2.0, None]  # 2 retries, doubling
    assert should_retry(policy, NON_FINITE, spent) == 0.0 and should_retry(policy, NON_FINITE, spent) is None
    assert spent == {HANG: 2, NON_FINITE: 1}
    custom = RetryPolicy(budgets={"hang": 5, "lost_node": Budget(1, backoff_s=30)})
    assert budget_for(custom, HANG).retries == 5 and budget_for(custom, LOST_NODE).delay(1) == 30
    assert budget_for(RetryPolicy(max_attempts=3, on_exception=True), CODE_ERROR).retries == 2
    with pytest.raises(VoyageError, match=r"RetryPolicy\.budgets: unknown failure classes \['flaky'\]"):
        RetryPolicy(budgets={"flaky": 1})


@pytest.fixture(scope="module")
def ray_here(ray_local):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield


@dataclass(frozen=True)
class Boom:
    message: str


@step_type(version="1", name="failures_boom")
def boom(config: Boom, ctx) -> None:
    raise ValueError(config.message)


def test_a_code_error_is_not_retried_and_reads_as_one_line(ray_here, tmp_path):
    from executor.views.report import print_summary

    plan, summary = run_steps([Step("boom", boom, Boom("a bug in user code"))], str(tmp_path / "p"))
    outcome = summary.outcomes["boom"]
    assert (outcome.state, outcome.attempts, outcome.failure) == ("FAILED", 1, CODE_ERROR)
    record = Store(str(tmp_path / "p")).read_record(plan.decisions[0].node.dirname, latest=True)  # the failed attempt's
    assert [(a.state, a.failure) for a in record.attempts] == [("FAILED", CODE_ERROR)]
    out = io.StringIO()
    print_summary(summary, plan, out)
    lines = [line for line in out.getvalue().splitlines() if "boom" in line and "FAILED" in line]
    assert len(lines) == 1 and "(code_error) ValueError: a bug in user code" in lines[0], out.getvalue()
    assert "Traceback" not in out.getvalue()
