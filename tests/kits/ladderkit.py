"""A synthetic ladder for the seal, check and page tests (not a test module): rungs whose eval
results are drawn from a known law with noise, the real fit, predict and check step types, and
a target step that takes the sealed prediction as its input, run by the real runner and worker
in this process (tests/kits/vizkit.py's InlineBackend: records, statuses, no Ray).

The rung and target steps stand in for training and eval only: they write the `results.json`
an eval writes and, for the target, read the law it is held against as a training step does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from executor import InputPath, Step, output_of, step_type
from steps.ladder.steps import (CheckConfig, FitConfig, PredictConfig, RungResult, against_law, ladder_check,
                                ladder_fit, ladder_predict, read_law)

from kits.vizkit import run_inline  # noqa: F401  (re-exported)

E, A, ALPHA = 1.6, 40.0, 0.12
COMPUTE = (1e10, 4e10, 1.6e11, 6.4e11)
TARGET_COMPUTE = 2.6e12
NOISE = (0.004, -0.003, 0.002, -0.004, 0.003, -0.002)  # relative, fixed: no tuning to the prediction
FPT = 1e6  # FLOPs a token of the target


def law(c: float) -> float:
    return E + A * c ** -ALPHA


@dataclass(frozen=True)
class Result:
    """A rung's (or a target's) eval result: its held-out loss."""

    loss: float
    rung: str = ""
    after: InputPath | None = None  # the target's eval comes after its training, as a real eval reads it
    write: bool = True  # False: an output without results.json (a rung result that is missing)
    nan: bool = False  # True: the result is NaN (a diverged rung; NaN itself has no identity in a config)


@step_type(version="1", name="ladderkit_result")
def result(config: Result, ctx) -> None:
    if not config.write:
        with ctx.open("other.json", "w") as f:
            f.write("{}")
        return
    with ctx.open("results.json", "w") as f:
        json.dump({"loss": float("nan") if config.nan else config.loss, "checkpoint": config.rung}, f)


@dataclass(frozen=True)
class Target:
    """The target's training: it takes the sealed prediction (as TrainConfig.law does)."""

    law: InputPath
    loss: float


@step_type(version="1", name="ladderkit_target", resumable=True)
def target(config: Target, ctx) -> None:
    reference = read_law(config.law)
    with ctx.open("metrics.jsonl", "w") as f:  # a training curve that lands at its loss (the live page draws it)
        tokens = TARGET_COMPUTE / FPT
        for k in range(1, 11):
            t = tokens * k / 10
            f.write(json.dumps({"step": k, "tokens": t, "loss": config.loss * (1 + 0.3 * (1 - k / 10) ** 2)}) + "\n")
    with ctx.open("results.json", "w") as f:
        json.dump({"loss": config.loss}, f)
    ctx.results["law"] = against_law(reference, TARGET_COMPUTE, config.loss)


def ladder(landed: float | None = None, losses: tuple[float, ...] | None = None, seeds: int = 2, write: bool = True,
           floor: float | None = None, compute: tuple[float, ...] = COMPUTE) -> dict[str, Step]:
    """The synthetic ladder's steps by role: rung results, fit, predict, target, its eval, check."""
    losses = losses or tuple(law(c) for c in compute)
    rungs, evals = [], []
    for k, (c, loss) in enumerate(zip(compute, losses)):
        outs = []
        for s in range(seeds):
            ev = Step(f"eval/r{k}/s{s}", result, Result(loss * (1 + NOISE[(k + s) % len(NOISE)]) if math.isfinite(loss) else 0.0,
                                                    f"r{k}", write=write, nan=not math.isfinite(loss)))
            evals.append(ev)
            outs.append(output_of(ev, data=False))
        rungs.append(RungResult(f"r{k}", c, tuple(outs), params=int(c ** 0.5), tokens=c ** 0.5))
    fit = Step("ladder/fit", ladder_fit, FitConfig(rungs=tuple(rungs), target="target", target_compute=TARGET_COMPUTE,
                                                   target_tokens=TARGET_COMPUTE / FPT, floor=floor))
    predict = Step("ladder/predict", ladder_predict, PredictConfig(fit=output_of(fit, data=False), flops_per_token=FPT))
    value = law(TARGET_COMPUTE) * 1.002 if landed is None else landed
    train = Step("pretrain/target", target, Target(law=output_of(predict, data=False), loss=value))
    ev = Step("eval/target", result, Result(value, "target", after=output_of(train, data=False)))
    check = Step("ladder/check", ladder_check, CheckConfig(prediction=output_of(predict, data=False),
                                                          training=output_of(train, data=False),
                                                          evaluation=output_of(ev, data=False)))
    return {"evals": evals, "fit": fit, "predict": predict, "train": train, "eval": ev, "check": check}


def all_steps(parts: dict) -> list[Step]:
    return [*parts["evals"], parts["fit"], parts["predict"], parts["train"], parts["eval"], parts["check"]]
