"""The ladder's step types: `ladder_fit` (the law over the rungs' eval results), `ladder_predict`
(the sealed prediction for a target) and `ladder_check` (the target's verdict), and the law as a
reference for any training step (docs/ladder.md).

    fit = Step("ladder/fit", ladder_fit, FitConfig(rungs=(RungResult("rung1", 4.5e10, evals=(output_of(ev),)), ...),
                                                   target="ladder/9.5e11flops", target_compute=9.5e11))
    pred = Step("ladder/predict", ladder_predict, PredictConfig(fit=output_of(fit), flops_per_token=...))
    # the target's training step takes the prediction as an input: TrainConfig(law=output_of(pred), ...)
    check = Step("ladder/check", ladder_check, CheckConfig(prediction=output_of(pred),
                 training=output_of(target_pretrain, data=False), evaluation=output_of(target_eval, data=False)))

A fit that fails or does not converge, or a rung result that is missing or not finite, fails the
fit step with the reason (a VoyageError, in its record), and then nothing is sealed. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from executor import InputPath, StepContext, VoyageError, step_type
from executor import served_url as served
from steps.data.formats import join, read_json, write_bytes

FIT_JSON, PREDICTION_JSON, VERDICT_JSON = "fit.json", "prediction.json", "verdict.json"
RECORD = ".step.json"


@dataclass(frozen=True)
class RungResult:
    """One rung as the fit reads it: its name and size, its training FLOPs (the trainer's formula
    over the targets it trains), and the eval outputs of its seeds."""

    name: str
    compute: float
    evals: tuple[InputPath, ...]  # output_of(eval step, data=False), one per seed
    params: int = 0  # active parameters
    tokens: float = 0.0  # targets trained
    size: str = ""


@dataclass(frozen=True)
class FitConfig:
    """The law L(C) = E + A·C^-α over the rungs (steps/ladder/law.py), predicted at the target."""

    rungs: tuple[RungResult, ...]
    target: str  # what the prediction is for: a held-out rung or the full run
    target_compute: float
    target_tokens: float = 0.0
    metric: str = "loss"  # the eval results' field (dotted: `datasets.heldout.loss`)
    floor: float | None = None  # pins E; None: free
    level: float = 0.9
    rule: str = ""  # the recipe's size rule in words: in the identity and in the record
    # seeds the target's landed loss averages (its band carries that run's own seed noise,
    # sigma / sqrt(target_seeds)): 1 for a single run, the held-out top rung's seeds otherwise
    target_seeds: int = 1

    def __post_init__(self) -> None:
        check_rungs(self.rungs, self.target_compute)
        if not (isinstance(self.target_seeds, int) and self.target_seeds >= 1):
            raise VoyageError(f"ladder: target_seeds must be a whole number >= 1, got {self.target_seeds!r}")


def check_rungs(rungs: tuple[RungResult, ...], target_compute: float = 0.0) -> None:
    """At plan time: at least 3 rungs, each with an eval, compute growing from rung to rung (and
    up to the target); else a VoyageError naming the rung (exit 2)."""
    if len(rungs) < 3:
        raise VoyageError(f"ladder: {len(rungs)} rung(s) to fit; the law L(C) = E + A*C^-alpha needs at least 3")
    for i, r in enumerate(rungs):
        if not (isinstance(r.compute, (int, float)) and math.isfinite(r.compute) and r.compute > 0):
            raise VoyageError(f"ladder: rung {r.name}: compute {r.compute!r} is not a positive number")
        if not r.evals:
            raise VoyageError(f"ladder: rung {r.name}: no eval to read its loss from")
        if i and r.compute <= rungs[i - 1].compute:
            raise VoyageError(f"ladder: compute does not grow from rung {rungs[i - 1].name} ({rungs[i - 1].compute:.3g} "
                              f"FLOPs) to rung {r.name} ({r.compute:.3g})")
    if target_compute and target_compute <= rungs[-1].compute:
        raise VoyageError(f"ladder: the target's compute {target_compute:.3g} does not exceed the top fitted rung's "
                          f"({rungs[-1].compute:.3g}): nothing to predict")


def metric_of(results: dict[str, Any], metric: str, where: str) -> float:
    value: Any = results
    for part in metric.split("."):
        if not isinstance(value, dict) or part not in value:
            raise VoyageError(f"{where}: no {metric!r} in its eval results")
        value = value[part]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise VoyageError(f"{where}: {metric} is {value!r}, not a finite number")
    return float(value)


def rung_losses(config: FitConfig) -> list[tuple[RungResult, list[float]]]:
    out = []
    for r in config.rungs:
        losses = []
        for i, url in enumerate(r.evals):
            try:
                results = read_json(join(served(url), "results.json"))
            except FileNotFoundError:
                raise VoyageError(f"ladder: rung {r.name} seed {i}: no results.json at {url}") from None
            losses.append(metric_of(results, config.metric, f"ladder: rung {r.name} seed {i}"))
        out.append((r, losses))
    return out


@step_type(version="2")
def ladder_fit(config: FitConfig, ctx: StepContext) -> None:
    """Fit the law over the rungs' held-out losses and predict the target; writes fit.json (the
    law's report: parameters with intervals, points, residuals, leave-future-out table, baselines,
    convergence). Fails with the reason when a result is missing or the fit does not converge."""
    from steps.ladder.law import FitError, LadderPoint, fit_report

    found = rung_losses(config)
    points = [LadderPoint(r.name, r.compute, sum(ls) / len(ls), tuple(ls) if len(ls) > 1 else ())
              for r, ls in found]
    try:
        report = fit_report(points, target_compute=config.target_compute, floor=config.floor, level=config.level,
                            target_seeds=config.target_seeds)
    except FitError as e:
        raise VoyageError(f"ladder fit: {e}") from None
    used = report[report["fit_used"]]
    if not used["convergence"]["converged"]:  # fit_report refuses it too; never seal from it
        raise VoyageError(f"ladder fit: did not converge: {used['convergence']['reason']}")
    law = {k: used["parameters"][k]["value"] for k in ("E", "A", "alpha")}
    rungs = [{"name": r.name, "size": r.size, "params": r.params, "tokens": r.tokens, "compute": r.compute,
              "loss": sum(ls) / len(ls), "seed_losses": ls} for r, ls in found]
    record = {"law": law, "floor": config.floor, "metric": config.metric, "rule": config.rule, "rungs": rungs,
              "target": {"name": config.target, "compute": config.target_compute, "tokens": config.target_tokens,
                         **report["target"]},
              "report": report}
    write_bytes(ctx.path(FIT_JSON), canonical(record))
    t = report["target"]
    ctx.results.update(law=law, target=config.target, predicted=t["predicted"], band=t["band"], rungs=len(rungs),
                       beats=report["baselines"]["on_leave_future_out"])
    ctx.logger.info("%s: L(C) = %.4g + %.4g C^-%.4g; %s predicted %.4f [%.4f, %.4f]", ctx.name, law["E"], law["A"],
                    law["alpha"], config.target, t["predicted"], *t["band"])


def canonical(value: Any) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def law_at(law: dict[str, float], compute: float) -> float:
    return law["E"] + law["A"] * compute ** -law["alpha"]


@dataclass(frozen=True)
class PredictConfig:
    """Seal the fit's prediction for its target: the final held-out loss with its band, and the
    law's curve over the target's tokens (the final loss a recipe run of that compute lands at:
    the target's own curve lies above it until its end)."""

    fit: InputPath
    flops_per_token: float  # the target's training FLOPs a target token: compute = this x tokens
    curve_points: int = 24


@step_type(version="1")
def ladder_predict(config: PredictConfig, ctx: StepContext) -> None:
    """Write prediction.json: the target, its predicted final loss and band, the predicted curve,
    the law, the fit's record digest, and when it was sealed; its `digest` is the SHA-256 of the
    rest (canonical JSON). Refuses a fit that is not converged."""
    fit_url = served(config.fit)
    fit = read_json(join(fit_url, FIT_JSON))
    report = fit.get("report") or {}
    used = report.get(report.get("fit_used", "free")) or {}
    if not report.get("converged") or not (used.get("convergence") or {}).get("converged"):
        raise VoyageError("ladder predict: the fit did not converge; nothing is sealed")
    fit_record = read_json(join(fit_url, RECORD))
    target = fit["target"]
    tokens = float(target.get("tokens") or target["compute"] / config.flops_per_token)
    n = max(2, config.curve_points)
    first = tokens / 100.0
    curve = [[t, law_at(fit["law"], config.flops_per_token * t)]
             for t in (first * (tokens / first) ** (i / (n - 1)) for i in range(n))]
    sealed = {"target": target["name"], "compute": target["compute"], "tokens": tokens,
              "predicted": target["predicted"], "band": target["band"], "level": target.get("level", 0.9),
              "metric": fit["metric"], "law": fit["law"], "floor": fit["floor"], "curve": curve,
              "fit": {"step": fit_record["name"], "digest": fit_record["digest"],
                      "output_digest": fit_record.get("output_digest")},
              "rungs": [{k: r[k] for k in ("name", "compute", "loss")} for r in fit["rungs"]],
              "sealed_at": time.time()}
    record = {"sealed": sealed, "digest": seal_digest(sealed)}
    write_bytes(ctx.path(PREDICTION_JSON), canonical(record))
    ctx.results.update(target=sealed["target"], predicted=sealed["predicted"], band=sealed["band"],
                       seal=record["digest"], sealed_at=sealed["sealed_at"])
    lo, hi = sealed["band"]
    ctx.results["headline"] = {  # the voyage's logbook shows it (docs/logbook.md)
        "kind": "prediction", "target": sealed["target"], "predicted": sealed["predicted"], "band": sealed["band"],
        "seal": record["digest"],
        "text": f"sealed {sealed['target']}: predicted {sealed['predicted']:.4g} [{lo:.4g}, {hi:.4g}], record "
                f"{record['digest'][:12]}"}


def seal_digest(sealed: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(sealed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_prediction(url: str) -> dict[str, Any]:
    """A sealed prediction, its digest checked (a VoyageError if it was edited)."""
    record = read_json(join(served(url), PREDICTION_JSON))
    if seal_digest(record["sealed"]) != record.get("digest"):
        raise VoyageError(f"ladder: the prediction at {url} does not match its digest: it was edited after sealing")
    return record


@dataclass(frozen=True)
class CheckConfig:
    """The verdict on a target: its eval against the sealed prediction its training consumed."""

    prediction: InputPath  # output_of(predict step)
    training: InputPath  # output_of(the target's first training step, data=False): it took the prediction
    evaluation: InputPath  # output_of(the target's eval step, data=False)


@step_type(version="1")
def ladder_check(config: CheckConfig, ctx: StepContext) -> None:
    """Write verdict.json: HIT (the landed loss inside the band) or MISS, the error in %, and the
    line for the card. Refuses a prediction the target did not consume, or one written after the
    target started."""
    pred = read_prediction(config.prediction)
    sealed = pred["sealed"]
    pred_record = read_json(join(served(config.prediction), RECORD))
    train_record = read_json(join(served(config.training), RECORD))
    consumed = [i for i in train_record.get("inputs") or [] if i.get("name") == pred_record["name"]]
    if not consumed:
        raise VoyageError(f"ladder check: {train_record['name']} did not take the prediction "
                          f"{pred_record['name']} as an input: its prediction was never sealed before it")
    if consumed[0].get("digest") != pred_record["digest"] or \
            (consumed[0].get("output_digest") not in (None, pred_record.get("output_digest"))):
        raise VoyageError(f"ladder check: {train_record['name']} consumed another prediction "
                          f"({consumed[0].get('digest', '')[:10]}) than {pred_record['name']}-{pred_record['digest'][:10]}")
    attempts = [a["started"] for a in train_record.get("attempts") or [] if a.get("started")]
    started = min(attempts) if attempts else None
    if started is None or sealed["sealed_at"] >= started:
        raise VoyageError(f"ladder check: the prediction was sealed at {stamp(sealed['sealed_at'])}, not before "
                          f"{train_record['name']} started ({stamp(started) if started else 'never'})")
    results = read_json(join(served(config.evaluation), "results.json"))
    landed = metric_of(results, sealed["metric"], "ladder check: the target")
    lo, hi = sealed["band"]
    hit = lo is not None and hi is not None and lo <= landed <= hi
    error = 100.0 * (landed - sealed["predicted"]) / sealed["predicted"]
    line = verdict_line(sealed, pred["digest"], landed, error, hit)
    verdict = {"verdict": "HIT" if hit else "MISS", "landed": landed, "error_pct": error, "line": line,
               "prediction": {"digest": pred["digest"], **{k: sealed[k] for k in ("target", "predicted", "band",
                                                                                   "level", "metric", "sealed_at",
                                                                                   "compute")}},
               "target_started": started, "evaluation": results.get("checkpoint")}
    write_bytes(ctx.path(VERDICT_JSON), canonical(verdict))
    ctx.results.update(verdict=verdict["verdict"], landed=landed, error_pct=error, predicted=sealed["predicted"],
                       band=sealed["band"], seal=pred["digest"], line=line)
    ctx.results["headline"] = {  # the voyage's logbook shows it (docs/logbook.md)
        "kind": "verdict", "target": sealed["target"], "verdict": verdict["verdict"], "error_pct": error,
        "landed": landed, "predicted": sealed["predicted"], "seal": pred["digest"],
        "text": f"{verdict['verdict']} {sealed['target']}: landed {landed:.4g}, predicted {sealed['predicted']:.4g}; "
                f"{error:+.1f}%, record {pred['digest'][:12]}"}
    ctx.logger.info("%s: %s %s", ctx.name, verdict["verdict"], line)


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def verdict_line(sealed: dict[str, Any], digest: str, landed: float, error: float, hit: bool) -> str:
    """`HIT: predicted 2.31 [2.28, 2.34] on 2026-12-03, record 1a2b3c4d5e6f; landed 2.30; -0.4%`."""
    lo, hi = sealed["band"]
    day = time.strftime("%Y-%m-%d", time.gmtime(sealed["sealed_at"]))
    err = f"{error:+.1f}%".replace("-", "\u2212")
    return (f"{'HIT' if hit else 'MISS'}: predicted {sealed['predicted']:.4g} [{lo:.4g}, {hi:.4g}] on {day}, record "
            f"{digest[:12]}; landed {landed:.4g}; {err}")


# ---------------------------------------------------------------------------------------------
# The law as a reference for any training step (TrainConfig.law).


def read_law(url: str) -> dict[str, Any]:
    """The law of a fit (fit.json) or of a sealed prediction (prediction.json)."""
    base = served(url)
    for name, get in ((PREDICTION_JSON, lambda r: r["sealed"]), (FIT_JSON, lambda r: r)):
        try:
            rec = get(read_json(join(base, name)))
        except FileNotFoundError:
            continue
        return {"law": rec["law"], "metric": rec.get("metric", "loss"), "floor": rec.get("floor")}
    raise VoyageError(f"law: {url} holds neither a ladder fit ({FIT_JSON}) nor a prediction ({PREDICTION_JSON})")


def against_law(law: dict[str, Any], compute: float, loss: float) -> dict[str, Any]:
    """How far a loss at `compute` lies from the law: `+2.1% above the law at 3e15 FLOPs`."""
    expected = law_at(law["law"], compute)
    pct = 100.0 * (loss - expected) / expected
    side = "above" if pct >= 0 else "below"
    return {"compute": compute, "loss": loss, "law": expected, "pct": pct,
            "text": f"{pct:+.1f}% {side} the law at {compute:.2g} FLOPs".replace("e+", "e")}
