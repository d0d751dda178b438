"""Helpers for the drawing, explain, report and live-page tests (not a test module).

`run_inline` carries out a plan in this process through the real runner and worker, with a
backend that runs each task as it is submitted: real records, statuses, STALE and FAILED states,
in milliseconds and without Ray.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from executor import Step, output_of, run_only, step_type
from executor.api import plan_steps
from executor.plan import Plan, Selection
from executor.testing import InlineBackend, run_inline  # noqa: F401  (re-exported for the tests)


def replan(steps, prefix, selection=None) -> Plan:
    return plan_steps(steps, prefix, selection)


# -- small step types ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Make:
    value: str
    note: str = ""
    salt_file: str = run_only(default="")  # when set, the output changes with this file's content


@step_type(version="1")
def make(config: Make, ctx) -> None:
    """Write a value (plus the salt file's content)."""
    salt = open(config.salt_file).read() if config.salt_file else ""
    with ctx.open("value.txt", "w") as f:
        f.write(config.value + salt)


@dataclass(frozen=True)
class Join:
    parts: tuple
    fail: bool = False


@step_type(version="1")
def join(config: Join, ctx) -> None:
    """Join the parts; fail on purpose when asked."""
    import fsspec

    if config.fail:
        raise RuntimeError("this step fails on purpose")
    text = "+".join(fsspec.open(p, "r").open().read() for p in config.parts)
    with ctx.open("joined.txt", "w") as f:
        f.write(text)


@dataclass(frozen=True)
class Train:
    data: str
    steps: int = 50


@step_type(version="1", resumable=True)
def train(config: Train, ctx) -> None:
    """Write a trainer's metrics.jsonl: loss, lr, tokens/s and expert load per step."""
    with ctx.open("metrics.jsonl", "w") as f:
        for s in range(1, config.steps + 1):
            f.write(json.dumps({"step": s * 10, "loss": 4.0 / (1 + 0.1 * s), "lr": 3e-4 * min(1.0, s / 10),
                                "tokens_per_s": 1.0e6 + 1e4 * (s % 7), "expert_load_max": 1.2 + 0.5 / s,
                                "expert_load_min": 0.8 - 0.5 / s, "time": 1.7e9 + s, "note": "text"}) + "\n")


def small_voyage(salt_file="", fail=False, note="", value="A"):
    """a, b -> ab -> abc; ab -> model (a trainer); `lone` on its own."""
    a = Step("data/a", make, Make(value, note=note, salt_file=salt_file))
    b = Step("data/b", make, Make("B"))
    ab = Step("join/ab", join, Join((output_of(a, "value.txt"), output_of(b, "value.txt"))))
    abc = Step("join/abc", join, Join((output_of(ab, "joined.txt"), output_of(b, "value.txt")), fail=fail))
    model = Step("model", train, Train(output_of(ab, "joined.txt")))
    lone = Step("lone", make, Make("L"))
    return [abc, model, lone]


def _bench():
    from bench import viz

    return viz


def synthetic_plan(n: int, prefix: str) -> Plan:
    """bench/viz.py's voyage-shaped plan of about `n` steps with mixed states."""
    return _bench().synthetic_plan(n, prefix)


__all__ = ["InlineBackend", "Join", "Make", "Selection", "Train", "join", "make", "replan", "run_inline",
           "small_voyage", "synthetic_plan", "train"]
