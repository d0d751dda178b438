"""bench/train_poison.py at the test's size: a poisoned source drawn alone for a stretch of a
40-step run. The guard drops what the poison stretch fed it and ends below no guard."""

import pytest

pytestmark = pytest.mark.slow_tier  # five short training runs and five evals


def test_the_guard_drops_the_poisoned_stretch_and_ends_below_no_guard(tmp_path):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[3] / "bench" / "train_poison.py"
    spec = importlib.util.spec_from_file_location("train_poison", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    main = bench.main

    out = main(["--steps", "40", "--poison-at", "28", "--window", "12", "--min-samples", "8", "--checkpoint-every",
                "10", "--warmup", "5", "--lr", "1e-2", "--eval-sequences", "32", "--work", str(tmp_path)])
    control, off, on, control_dropped, poisoned_dropped = out["runs"]
    assert not control["events"] and not off["events"]  # no false alarm on the clean mix; off is off
    flagged = {e["step"] for e in on["events"]}
    assert set(range(28, 34)) <= flagged <= set(range(26, 36)), flagged  # the stretch, and nothing far from it
    dropped = {n for a, b, _ in on["skipped_steps"] for n in range(a, b + 1)}
    assert dropped <= set(range(20, 36)), dropped  # no good step far from the stretch is thrown away
    assert on["held_out"] < off["held_out"], (on["held_out"], off["held_out"])
    # the same steps dropped by the knob, no guard decision taken: the guard's run is exactly that
    assert out["dropped_steps"] == sorted(dropped)
    assert not control_dropped["events"] and not poisoned_dropped["events"]
    assert on["held_out"] == poisoned_dropped["held_out"] and on["train_loss"] == poisoned_dropped["train_loss"]
    assert control_dropped["held_out"] != control["held_out"]  # the knob dropped something
