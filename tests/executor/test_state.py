"""The one state machine of a step (executor/state.py): every vocabulary (plan decisions, run
outcomes, `.status` states, drawings) uses its states, and the runner moves only along its table."""

import pytest

from executor.state import TRANSITIONS, InvalidTransition, StepState, check_transition


def test_every_state_is_drawn_and_described():
    from executor.views.viz.style import COLORS, DESCRIPTIONS, RICH, STATE_ORDER

    for state in StepState:
        assert state in COLORS and state in DESCRIPTIONS and state in RICH and state in STATE_ORDER, state


def test_states_read_and_write_as_their_names():
    import json

    assert StepState.CACHED == "CACHED" and json.dumps(StepState.SUCCESS) == '"SUCCESS"'
    assert StepState("FAILED") is StepState.FAILED and f"{StepState.STALE}" == "STALE"


def test_the_table_is_closed_and_final_states_stay_final():
    for state, nexts in TRANSITIONS.items():
        assert all(isinstance(s, StepState) for s in nexts)
    for final in (StepState.SUCCESS, StepState.FAILED, StepState.BLOCKED, StepState.CACHED, StepState.SKIPPED):
        assert TRANSITIONS.get(final, frozenset()) == frozenset(), final
    check_transition("s", StepState.PENDING, StepState.RUNNING)
    with pytest.raises(InvalidTransition, match="s: SUCCESS -> RUNNING"):
        check_transition("s", StepState.SUCCESS, StepState.RUNNING)


def test_an_input_without_output_blocks_its_consumer():
    from executor.state import Gate, gate

    assert gate([(StepState.CACHED, True), (StepState.SUCCESS, True)]) is Gate.READY
    assert gate([(StepState.CACHED, True), (StepState.RUNNING, False)]) is Gate.WAIT
    assert gate([(StepState.SKIPPED, False)]) is Gate.BLOCK
    assert gate([(StepState.CACHED, False)]) is Gate.BLOCK
    assert gate([(StepState.FAILED, False), (StepState.PENDING, False)]) is Gate.BLOCK


def test_plan_and_run_states_are_step_states(tmp_path, ray_local):
    from dataclasses import dataclass

    from executor import Step, plan_steps, run_steps, step_type

    @dataclass(frozen=True)
    class S:
        v: int = 0

    @step_type(version="1", name="state_noop")
    def noop(config: S, ctx) -> None:
        with ctx.open("x", "w") as f:
            f.write("x")

    steps = [Step("a", noop, S(1))]
    plan = plan_steps(steps, str(tmp_path))
    assert all(isinstance(d.state, StepState) for d in plan.decisions)
    _, summary = run_steps(steps, str(tmp_path))
    assert all(isinstance(o.state, StepState) for o in summary.outcomes.values())
    from executor.storage.store import Store

    status = Store(str(tmp_path)).read_status(plan["a"].node.dirname)
    assert status.state is StepState.SUCCESS
