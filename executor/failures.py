"""Failure classes: why an attempt ended, and what the retry policy does about each.

A month-long run meets the same few failures over and over, and each deserves its own answer:

    lost_node    the worker's node died or was preempted (Ray's own errors, SIGTERM): retry
                 soon, many times; the step resumes from its checkpoints
    hang         no optimizer step finished within the watchdog's bound (steps/train/watchdog.py):
                 the stacks went to the step's logs; retry, a few times
    non_finite   a non-finite loss, gradient norm or result: retry once from the last verified
                 checkpoint (a bit flip does not come back; bad data does, and fails again)
    oom          out of memory (device or host): retry once, after a pause
    code_error   anything else the step raised: not retried (it would fail the same way), unless
                 the step's RetryPolicy says `on_exception`

`classify` reads the exception: an exception may name its class itself with a `failure_class`
attribute (the trainer's `Hang` and `NonFinite` do); Ray's node and worker deaths, SIGTERM and the
out-of-memory errors of torch and Ray are recognized by type name, so the executor imports
neither torch nor Ray here. `classify_text` does the same for an error that is only a line of
text (a result that came back from a dead worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executor.step import RetryPolicy


class FailureClass(StrEnum):
    """Why an attempt ended (a str: records and summaries hold its value, `"hang"`)."""

    LOST_NODE = "lost_node"
    HANG = "hang"
    NON_FINITE = "non_finite"
    OOM = "oom"
    CODE_ERROR = "code_error"


LOST_NODE, HANG, NON_FINITE, OOM, CODE_ERROR = FailureClass
CLASSES = tuple(FailureClass)

# Exception type names (anywhere in the MRO) that say the node or worker went away.
# LocalRayletDiedError: the raylet the driver talks to died (a removed node; found by bench/chaos.py).
_LOST = ("NodeDiedError", "WorkerCrashedError", "RayActorError", "ActorDiedError", "OwnerDiedError",
         "ObjectLostError", "TaskUnschedulableError", "ActorUnavailableError", "Preempted", "LocalRayletDiedError")
_OOM = ("OutOfMemoryError", "MemoryError")


class StepFailure(RuntimeError):
    """A failure that knows its class (subclasses set `failure_class`)."""

    failure_class = CODE_ERROR


class Hang(StepFailure):
    """No progress within the watchdog's bound; the workers' stacks are in the step's logs."""

    failure_class = HANG


class NonFinite(StepFailure):
    """A non-finite loss, gradient norm, tensor to save, or result."""

    failure_class = NON_FINITE


class LeaseLost(StepFailure):
    """The attempt's lease no longer carries its token (another executor took the step over), or
    was not renewed for too long: the attempt stops before a write its successor could see."""

    failure_class = LOST_NODE  # its executor stopped renewing: as if its node had gone


def classify(error: BaseException) -> FailureClass:
    """The failure class of an exception."""
    named = getattr(error, "failure_class", None)
    if named in CLASSES:
        return FailureClass(named)
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return LOST_NODE  # SIGTERM/SIGINT: the node is being taken away
    names = {t.__name__ for t in type(error).__mro__}
    if names & set(_OOM):
        return OOM
    if names & set(_LOST):
        return LOST_NODE
    cause = error.__cause__ or error.__context__
    if cause is not None and cause is not error and getattr(cause, "failure_class", None) in CLASSES:
        return FailureClass(cause.failure_class)
    return CODE_ERROR


def classify_text(error: str | None) -> FailureClass:
    """The failure class of an error known only as `"TypeName: message"`."""
    head = (error or "").split(":", 1)[0].strip()
    if head in ("Hang",):
        return HANG
    if head in ("NonFinite",):
        return NON_FINITE
    if head in ("LeaseLost",):
        return LOST_NODE
    if head in _OOM or "out of memory" in (error or "").lower():
        return OOM
    if head in _LOST or head in ("KeyboardInterrupt", "SystemExit"):
        return LOST_NODE
    return CODE_ERROR


@dataclass(frozen=True)
class Budget:
    """Retries of one failure class within one run of the executor, and the pause before each
    (`backoff_s` doubled per retry of the class, at most `max_backoff_s`)."""

    retries: int
    backoff_s: float = 0.0
    max_backoff_s: float = 300.0

    def delay(self, retry: int) -> float:
        """Seconds to wait before the `retry`-th retry (1-based) of this class."""
        return min(self.backoff_s * 2 ** max(retry - 1, 0), self.max_backoff_s)


# Executor-side retries of a lost node come on top of Ray's own task retries
# (RetryPolicy.max_node_failures), which resubmit a task whose worker died without telling us.
DEFAULT_BUDGETS = {LOST_NODE: Budget(3, 5.0), HANG: Budget(2, 1.0), NON_FINITE: Budget(1, 0.0),
                   OOM: Budget(1, 10.0), CODE_ERROR: Budget(0)}


def budget_for(policy: RetryPolicy, failure: str) -> Budget:
    """The budget a step's RetryPolicy gives a class (a FailureClass or its value): its `budgets`
    override, else the default; a code error gets `max_attempts - 1` retries when the policy sets
    `on_exception`."""
    failure = FailureClass(failure)
    overrides = dict(policy.budgets)
    if failure in overrides:
        found = overrides[failure]
        return found if isinstance(found, Budget) else Budget(int(found))
    if failure == CODE_ERROR and policy.on_exception:
        return Budget(max(int(policy.max_attempts) - 1, 0))
    return DEFAULT_BUDGETS[failure]


def should_retry(policy: RetryPolicy, failure: str, counts: dict[str, int]) -> float | None:
    """Seconds to wait before retrying a step that failed with class `failure` (None: do not
    retry); `counts` holds the retries already spent per class and is updated."""
    budget = budget_for(policy, failure)
    spent = counts.get(failure, 0)
    if spent >= budget.retries:
        return None
    counts[failure] = spent + 1
    return budget.delay(spent + 1)
