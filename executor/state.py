"""The one state machine of a step: every state it can be in, and the moves between them.

One vocabulary serves the plan (a decision per step), the run (an outcome per step), the output
folder's `.status` (RUNNING, SUCCESS, FAILED), a record's attempts (plus INTERRUPTED) and every
drawing. States are strings on disk and in JSON (`StepState.SUCCESS == "SUCCESS"`), so files
written before this module existed read the same.

The habit is Dagster's: a step's life is an explicit table, in one small module, and the code
that runs steps moves only along it (`check_transition`).

    plan decision             run outcome
    CACHED, SKIPPED, STALE -> (stays: nothing to run)
    RUN, RERUN, RETRY,     -> PENDING -> [WAITING ->] RUNNING -> SUCCESS | FAILED
    WAITING, STALE (runs)          |          |          |-> PENDING (retried) | WAITING (lease lost)
                                   |          |          '-> BLOCKED (an input had no output)
                                   '----------'-> CACHED (done meanwhile, or early cutoff) | BLOCKED

A step may start only when every input is there (`gate`): an input that failed, was blocked, or
has no output (not selected and never made, or deleted) BLOCKS its consumer; an input still
pending, waiting or running makes it wait. An input with no output never counts as up to date.
"""

from __future__ import annotations

import enum
from typing import Iterable


class StepState(enum.StrEnum):
    """Where a step stands: in the plan, in a run, in its folder's `.status`, or in an attempt."""

    # plan decisions
    CACHED = "CACHED"  # done, and its inputs' outputs are the ones it was made from
    RUN = "RUN"  # no (valid) output yet
    RERUN = "RERUN"  # forced by --rerun
    STALE = "STALE"  # an input's output changed since this output was made
    RETRY = "RETRY"  # failed, or was interrupted, before
    WAITING = "WAITING"  # leased by another live executor
    BLOCKED = "BLOCKED"  # an input failed or has no output
    SKIPPED = "SKIPPED"  # not selected, or needed only by cached steps
    # while running
    PENDING = "PENDING"  # will run once its inputs are there
    RUNNING = "RUNNING"  # a worker has it (also the `.status` of a folder being made)
    # results (also the `.status` of a finished folder)
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    # an attempt of a record that died before it finished (never a `.status`)
    INTERRUPTED = "INTERRUPTED"


S = StepState

# Plan decisions, most urgent first (the order of a printed plan).
PLAN_ORDER = (S.RUN, S.RERUN, S.STALE, S.RETRY, S.WAITING, S.BLOCKED, S.CACHED, S.SKIPPED)
# Every state, most urgent first: a drawing's group box takes its most urgent member's colour.
URGENCY = (S.FAILED, S.BLOCKED, S.RUNNING, S.WAITING, S.PENDING, S.STALE, S.RETRY, S.RERUN, S.RUN,
           S.INTERRUPTED, S.SUCCESS, S.CACHED, S.SKIPPED)
# The run's table: from each outcome, where the runner may move a step. Decisions that run start
# as PENDING; the others are final outcomes already (they have no row).
TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    S.PENDING: frozenset({S.WAITING, S.RUNNING, S.CACHED, S.BLOCKED}),
    S.WAITING: frozenset({S.WAITING, S.RUNNING, S.CACHED, S.BLOCKED}),
    S.RUNNING: frozenset({S.SUCCESS, S.FAILED, S.BLOCKED, S.PENDING, S.WAITING}),
}


class InvalidTransition(RuntimeError):
    """The runner tried a move the table does not have: a bug, never a user error."""


def check_transition(name: str, old: StepState, new: StepState) -> None:
    """Raise InvalidTransition unless the table allows step `name` to go from `old` to `new`."""
    if new not in TRANSITIONS.get(StepState(old), frozenset()):
        raise InvalidTransition(f"{name}: {old} -> {new} is not a move of the step state machine")


def initial(decision: StepState, will_run: bool) -> StepState:
    """A step's outcome when a run starts: PENDING if its decision runs it, else the decision."""
    return S.PENDING if will_run else decision


class Gate(enum.Enum):
    """May a step start, given its inputs?"""

    READY = "ready"
    WAIT = "wait"
    BLOCK = "block"


def gate(inputs: Iterable[tuple[StepState, bool]]) -> Gate:
    """From each input's (outcome, has an output): BLOCK if one failed, was blocked or has no
    output and will not get one in this run; WAIT if one is still to come; READY otherwise."""
    wait = False
    for state, has_output in inputs:
        if state in (S.FAILED, S.BLOCKED):
            return Gate.BLOCK
        if state in (S.PENDING, S.WAITING, S.RUNNING):
            wait = True
        elif not has_output:
            return Gate.BLOCK
    return Gate.WAIT if wait else Gate.READY


def blocked_reason(inputs: Iterable[tuple[str, StepState, bool]]) -> str:
    """Why a gate said BLOCK, naming the inputs: failed ones first, then those without output."""
    failed = [name for name, state, _ in inputs if state in (S.FAILED, S.BLOCKED)]
    if failed:
        return f"dependency failed: {', '.join(failed)}"
    missing = [name for name, state, has in inputs if not has and state not in (S.PENDING, S.WAITING, S.RUNNING)]
    return f"input {', '.join(missing)} has no output" + (" (not selected, and never made or deleted)"
                                                           if missing else "")
