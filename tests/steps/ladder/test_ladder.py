"""The recipe at any size, the ladder as steps, the fit/predict/check steps and the seal
(steps/ladder/recipe.py, ladder.py, steps.py; voyages/535b.py --size / --ladder; docs/ladder.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys

import pytest

from executor import VoyageError
from executor.plan import Selection
from executor.storage.store import Store
from kits import ladderkit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VOYAGE = os.path.join(ROOT, "voyages", "535b.py")


@pytest.fixture(scope="module")
def v535():
    spec = importlib.util.spec_from_file_location("voyage_535b_ladder_test", VOYAGE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def dag_of(v535, **kw):
    from executor.dag import build_dag

    return build_dag(v535.voyage(v535.VoyageConfig(**kw)))


def kinds(dag):
    """(step type, its inputs' step types) for every step: the DAG's shape, whatever the names."""
    return {(n.step.type.name, frozenset(d.step.type.name for d in n.deps)) for n in dag}


# -- 1. the recipe at any size -----------------------------------------------------------------


def test_the_rule_through_the_recipe_gives_the_recipe_at_its_own_size(v535):
    """Both recipes are points of their own rules: at its width the rule gives the recipe's
    model, steps, batch, lr and warm-up exactly (the 535B run and the laptop's 400 steps)."""
    for laptop, scale in ((False, v535.FULL), (True, v535.LAPTOP)):
        rule = v535.rule_of(v535.VoyageConfig(laptop=laptop))
        own = rule.at_width(scale.model.dim)
        assert own.model == dataclasses.replace(scale.model, vocab_size=scale.tokenizer_vocab)
        assert own.batch == scale.batch_size and own.lr == scale.optimizer.lr
        assert own.warmup_steps == scale.optimizer.warmup_steps
        # whole optimizer steps (15T is 325,116.2 steps of 11,264 x 4,096: the run takes whole ones)
        assert own.pretrain_tokens == pytest.approx(scale.pretrain_tokens, rel=1e-5)
        assert own.midtrain_tokens == pytest.approx(scale.midtrain_tokens, rel=1e-5)
        assert rule.at(f"{own.active_params}").model == own.model  # the nearest width to its own count


def test_the_laptop_shape_fixes_depth_and_heads_and_grows_every_matrix_with_the_width():
    """The laptop's rule keeps the recipe's 4 layers and 4 heads (2 kv) at every width, a head
    width/4 wide, so attention is 3 x width^2 a layer like the experts' 3 x width^2 (top-2 of
    width/2) and the shared expert's: per-layer parameters are a fixed multiple of width^2, with
    no step where depth or a head count jumps. The full shape still grows depth and heads."""
    from steps.ladder.recipe import FULL_SHAPE, LAPTOP_SHAPE, ShapeRule
    from steps.moe.config import PRESETS, param_counts

    tiny = PRESETS["tiny"]
    assert LAPTOP_SHAPE.shape(tiny, 64) == tiny  # the recipe is a point of its rule
    per_layer = []
    for w in range(16, 129, 8):
        m = LAPTOP_SHAPE.shape(tiny, w)
        assert (m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim * 4) == (4, 4, 2, w)
        one = dataclasses.replace(m, n_layers=1)
        per_layer.append(param_counts(one)[1] - param_counts(dataclasses.replace(m, n_layers=0))[1])
        assert per_layer[-1] == 9 * w * w + 10 * w  # attention 3w^2, 2 experts 3w^2, shared 3w^2, router, norms
    big = [FULL_SHAPE.shape(tiny, w) for w in (1024, 2048)]
    assert [(m.n_layers, m.n_heads) for m in big] == [(8, 8), (16, 16)]
    with pytest.raises(VoyageError, match="width_step 12 must be a multiple of 2 x heads"):
        ShapeRule(head_dim=16, width_per_layer=16, kv_group=2, expert_div=2, shared_mult=1.0, width_step=12, heads=4)


def test_size_follows_declared_rules_and_keeps_the_recipe(v535):
    """--size changes only the shape, tokens, batch, lr and warm-up; routing geometry, the
    mixture's ratios and switch, the tokenizer and the optimizer stay. Tokens are the recipe's
    fixed ratio to the active parameters; batch and lr are DeepSeek's power laws of compute."""
    rule = v535.rule_of(v535.VoyageConfig())
    recipe = rule.at_width(6144)
    one = rule.at("1b")
    assert abs(math.log(one.active_params / 1e9)) < 0.15
    m = one.model
    assert (m.n_experts, m.top_k, m.n_shared_experts, m.score_func, m.sliding_window, m.vocab_size) == \
        (384, 8, 2, "sigmoid", 2048, 128_256)
    assert one.tokens / one.active_params == pytest.approx(rule.tokens_per_param, rel=0.01)
    c = rule.tokens_per_param * one.active_params * one.flops / one.tokens / recipe.flops  # the rule's estimate
    assert one.lr == pytest.approx(recipe.lr * c ** -0.125, rel=1e-4)
    assert one.batch % 64 == 0 and abs(one.batch - recipe.batch * c ** 0.3271) <= 32
    assert one.pretrain_steps / one.steps == pytest.approx(0.8, abs=0.01)
    # the voyage at that size: sized configs, the recipe's mixture and data steps (the same DAG
    # as the full run's: tests/voyages/test_535b.py, whose worker holds the full plan)
    sized = dag_of(v535, size="1b")
    pre = sized["pretrain/size-1b"].step.config
    assert pre.model.overrides["dim"] == one.model.dim and pre.data.batch_size == one.batch
    assert pre.optimizer == dataclasses.replace(v535.FULL.optimizer, lr=one.lr, warmup_steps=one.warmup_steps)
    mix = sized["mixture/size-1b"].step.config
    assert [s.weights for s in mix.stages] == [{s.name: s.pretrain for s in v535.FULL.sources if s.pretrain},
                                               {s.name: s.midtrain for s in v535.FULL.sources if s.midtrain}]
    assert mix.stages[0].fraction == pytest.approx(0.8, abs=0.01)
    # a size is identity: another size, another training step; the data steps are shared
    other = dag_of(v535, size="2b")
    assert other["pretrain/size-2b"].digest != sized["pretrain/size-1b"].digest
    assert {n.name: n.digest for n in sized if n.name.startswith(("raw/", "tokenized/", "tokenizer/"))} == \
        {n.name: n.digest for n in other if n.name.startswith(("raw/", "tokenized/", "tokenizer/"))}
    # at laptop scale: the same DAG as the laptop run, its data steps the same
    laptop, small = dag_of(v535, laptop=True), dag_of(v535, laptop=True, size="100k")
    assert kinds(laptop) == kinds(small)
    assert {n.name: n.digest for n in laptop if n.name.startswith(("raw/", "tokenized/", "tokenizer/"))} == \
        {n.name: n.digest for n in small if n.name.startswith(("raw/", "tokenized/", "tokenizer/"))}


def test_size_dry_run_prints_the_budget_with_gpu_hours(capsys, tmp_path):
    from executor.cli import main

    assert main([VOYAGE, "--size", "1b", "--dry-run", "--prefix", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "the 535B-A23B recipe at size 1b: d=1792 x 14 layers" in out and "384 experts top-8" in out
    assert "GPU-hours at the anchor's 22.9% MFU" in out and "tokens 821.1 per active parameter" in out
    assert "pretrain/size-1b" in out and not (tmp_path / "p").exists()


@pytest.mark.parametrize("flags, message", [
    (["--size", "huge"], "size: 'huge' is neither active parameters"),
    (["--size", "0b"], "size: must be positive"),
    (["--laptop", "--ladder", "--ladder_rungs", "22k,37k,69k"], "ladder: 2 rung(s) to fit (target 'top'); the law "
                                                                 "needs at least 3"),
    (["--laptop", "--ladder", "--ladder_rungs", "69k,37k,111k,216k"], "ladder: compute does not grow from rung 69k"),
    (["--laptop", "--ladder", "--ladder_rungs", "22k,37k,69k,111k", "--ladder_seeds", "1,1"],
     "ladder.seeds: 2 seed counts for 4 rungs"),
    (["--laptop", "--ladder", "--ladder_rungs", "22k,37k,69k,216k,111k", "--ladder_seeds", "1,1,1,1,1"],
     "ladder: compute does not grow from rung 216k"),
])
def test_bad_sizes_and_ladders_exit_2_in_one_line(capsys, tmp_path, flags, message):
    from executor.cli import main

    code = main([VOYAGE, "--dry-run", "--prefix", str(tmp_path / "p"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and message in err, err


# -- 2. the ladder as steps --------------------------------------------------------------------


def test_the_laptop_ladder_shares_the_data_steps_and_holds_out_its_top_rung(v535):
    dag = dag_of(v535, laptop=True, ladder=True)
    plain = dag_of(v535, laptop=True)
    names = {n.name for n in plain}
    assert {n.name: n.digest for n in plain} == {n.name: n.digest for n in dag if n.name in names}  # main run unchanged
    mixtures = [n for n in dag if n.name.startswith("ladder/") and n.name.endswith("/mixture")]
    assert len(mixtures) == 5
    tokenized = {d.name for d in mixtures[0].deps}
    assert all({d.name for d in m.deps} == tokenized for m in mixtures) and tokenized <= names
    fit = dag["ladder/fit"]
    assert fit.step.config.target_seeds == 1  # the band is for the top rung's one run, not a mean of 2
    assert sorted(d.name for d in fit.deps) == sorted(f"eval/ladder/{r}/s{s}" for s in (0, 1) for r in (
        "1.2e10flops", "3.7e10flops", "1.1e11flops", "3.2e11flops"))  # two seeds on every fitted rung
    # the held-out top rung trains after the seal, taking it as an input (its identity includes it)
    top = dag["pretrain/ladder/9.5e11flops/s0"]
    assert "ladder/predict" in {d.name for d in top.deps}
    assert {d.name for d in dag["ladder/check"].deps} == {"ladder/predict", "pretrain/ladder/9.5e11flops/s0",
                                                          "eval/ladder/9.5e11flops/s0"}
    assert "ladder/check" in {d.name for d in dag["card/ladder/9.5e11flops"].deps}  # the target's card carries the verdict
    # every rung's eval scores the windows the top rung's mixture never draws: the same for all
    assert {n.step.config.mixture.step_name for n in dag if n.name.startswith("eval/ladder/")} == {"ladder/9.5e11flops/mixture"}
    # the top rung is the laptop recipe at its own size
    assert top.step.config.model.overrides["dim"] == 64 and top.step.config.data.batch_size == 32
    assert top.step.config.model.overrides["head_dim"] == 16  # 4 heads of 16: the tiny preset's own
    # every rung has the recipe's depth and heads; only the width (and what follows it) grows
    shapes = [dag[f"pretrain/ladder/{r}/s0"].step.config.model.overrides for r in (
        "1.2e10flops", "3.7e10flops", "1.1e11flops", "3.2e11flops", "9.5e11flops")]
    assert [(o["n_layers"], o["n_heads"], o["n_kv_heads"]) for o in shapes] == [(4, 4, 2)] * 5
    assert [o["dim"] for o in shapes] == [16, 24, 32, 48, 64] and all(o["head_dim"] * 4 == o["dim"] for o in shapes)
    # the laptop's lr is the recipe's at every rung (lr_exponent 0); the batch follows compute
    pres = [dag[f"pretrain/ladder/{r}/s0"].step.config for r in (
        "1.2e10flops", "3.7e10flops", "1.1e11flops", "3.2e11flops", "9.5e11flops")]
    assert {c.optimizer.lr for c in pres} == {0.01} and [c.data.batch_size for c in pres] == [8, 11, 15, 23, 32]


def test_a_rung_that_is_not_the_recipe_is_refused_naming_the_field(v535):
    config = v535.VoyageConfig(laptop=True, ladder=True)
    _tok, tokenized, heldout = v535.data_and_heldout(config)

    def build(tamper):
        rungs = v535.rungs_of(config)
        tamper(rungs[1])
        return v535.ladder_steps(config, tokenized, heldout, rungs)

    build(lambda r: None)  # untouched: accepted

    def beta2(r):
        r.mixture = v535.mixture_step(config, tokenized, r.scale.pretrain_tokens + r.scale.midtrain_tokens, r.scale,
                                      name=f"ladder/{r.name}/mixture")
        train, res = v535.train_config(config, r.scale, r.mixture, seed=0, sized=True)
        train = dataclasses.replace(train, optimizer=dataclasses.replace(train.optimizer, beta2=0.99))
        r.runs = [v535.train_eval(config, r.scale, f"ladder/{r.name}/s0", train, res, heldout)]

    with pytest.raises(VoyageError, match=r"rung 3.7e10flops: its training differs from the recipe's in optimizer.beta2 "
                                          r"\(0.99, the recipe at this size has 0.95\)"):
        build(beta2)

    def ratios(r):
        recipe = v535.mixture_step(config, tokenized, r.scale.pretrain_tokens + r.scale.midtrain_tokens, r.scale,
                                   name=f"ladder/{r.name}/mixture")
        stages = (dataclasses.replace(recipe.config.stages[0], weights={"kjv": 0.5, "pydocs": 0.5}),
                  recipe.config.stages[1])
        r.mixture = v535.Step(recipe.name, recipe.type, dataclasses.replace(recipe.config, stages=stages))

    with pytest.raises(VoyageError, match=r"rung 3.7e10flops: its mixture differs from the recipe's in stages\[0\].weights"):
        build(ratios)


def test_editing_the_ladder_after_the_prediction_makes_a_new_target(v535):
    """The target's identity includes its sealed prediction: any edit of the ladder (a rung, a
    seed, the floor) gives the target another digest, so a prediction cannot be swapped under a
    trained target; an unchanged ladder gives the same one."""
    name = "pretrain/ladder/9.5e11flops/s0"
    base = dag_of(v535, laptop=True, ladder=True)[name].digest
    assert dag_of(v535, laptop=True, ladder=True)[name].digest == base
    edits = [dict(ladder_floor=1.5), dict(ladder_seeds="1,2,1,1,1"), dict(
        ladder_rungs="1.2e10flops,3.7e10flops,1.1e11flops,2e11flops,9.5e11flops", ladder_seeds="2,2,2,2,1")]
    digests = {dag_of(v535, laptop=True, ladder=True, **e)[name].digest for e in edits}
    assert base not in digests and len(digests) == len(edits)
    # the full run as the target: tests/voyages/test_535b.py (whose worker holds the full plan)


# -- 3, 4. the fit, the seal and the check on a synthetic ladder -------------------------------


def read(prefix, plan, name, file):
    d = plan[name]
    return json.load(open(os.path.join(prefix, Store(prefix).served_dir(d.node.dirname), file)))


def test_the_seal_before_the_target_and_the_verdict(tmp_path):
    prefix = str(tmp_path / "p")
    parts = ladderkit.ladder()
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(parts), prefix)
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    fit = read(prefix, plan, "ladder/fit", "fit.json")
    assert [r["name"] for r in fit["rungs"]] == ["r0", "r1", "r2", "r3"] and fit["report"]["converged"]
    assert all(len(r["seed_losses"]) == 2 for r in fit["rungs"])
    pred = read(prefix, plan, "ladder/predict", "prediction.json")
    sealed = pred["sealed"]
    truth = ladderkit.law(ladderkit.TARGET_COMPUTE)
    assert abs(sealed["predicted"] / truth - 1) < 0.01 and sealed["band"][0] < sealed["predicted"] < sealed["band"][1]
    assert sealed["curve"][-1][0] == pytest.approx(ladderkit.TARGET_COMPUTE / ladderkit.FPT)
    assert sealed["curve"][-1][1] == pytest.approx(sealed["predicted"], rel=1e-9)
    # sealed before the target started, and the target's record names the prediction it consumed
    train = json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan["pretrain/target"].node.dirname),
                                        ".step.json")))
    assert sealed["sealed_at"] < train["attempts"][0]["started"]
    assert "ladder/predict" in {i["name"] for i in train["inputs"]}
    assert train["results"]["law"]["text"].endswith("the law at 2.6e12 FLOPs")
    verdict = read(prefix, plan, "ladder/check", "verdict.json")
    assert verdict["verdict"] == "HIT" and verdict["prediction"]["digest"] == pred["digest"]
    assert verdict["line"].startswith(f"HIT: predicted {sealed['predicted']:.4g} [") and pred["digest"][:12] in verdict["line"]
    assert verdict["error_pct"] == pytest.approx(100 * (truth * 1.002 - sealed["predicted"]) / sealed["predicted"])
    # the fit step is deterministic: the same bytes on a rerun
    first = open(os.path.join(prefix, Store(prefix).served_dir(plan["ladder/fit"].node.dirname), "fit.json"), "rb").read()
    plan2, s2 = ladderkit.run_inline(ladderkit.all_steps(parts), prefix, Selection(rerun=("ladder/fit",)))
    assert s2.exit_code == 0
    again = open(os.path.join(prefix, Store(prefix).served_dir(plan2["ladder/fit"].node.dirname), "fit.json"), "rb").read()
    assert first == again


def test_a_miss_is_written_with_its_error(tmp_path):
    prefix = str(tmp_path / "p")
    far = ladderkit.law(ladderkit.TARGET_COMPUTE) * 1.08
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(ladderkit.ladder(landed=far)), prefix)
    assert summary.exit_code == 0
    verdict = read(prefix, plan, "ladder/check", "verdict.json")
    assert verdict["verdict"] == "MISS" and 7 < verdict["error_pct"] < 9 and verdict["line"].startswith("MISS: ")


def test_a_check_never_reads_a_prediction_written_after_its_target_started(tmp_path):
    """A prediction rewritten after the target started (sealed later, digest made right) and a
    prediction edited in place (digest wrong) both fail the check, with the reason."""
    from steps.ladder.steps import canonical, seal_digest

    prefix = str(tmp_path / "p")
    parts = ladderkit.ladder()
    steps = [*parts["evals"], parts["fit"], parts["predict"], parts["train"], parts["eval"]]
    plan, summary = ladderkit.run_inline(steps, prefix)
    assert summary.exit_code == 0
    path = os.path.join(prefix, Store(prefix).served_dir(plan["ladder/predict"].node.dirname), "prediction.json")
    record = json.load(open(path))
    train = json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan["pretrain/target"].node.dirname),
                                        ".step.json")))
    late = dict(record["sealed"], sealed_at=train["attempts"][0]["started"] + 1.0, predicted=2.0)
    open(path, "wb").write(canonical({"sealed": late, "digest": seal_digest(late)}))
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(parts), prefix)
    assert [o.name for o in summary.failed] == ["ladder/check"]
    assert "the prediction was sealed at" in summary.failed[0].error and "not before pretrain/target started" in \
        summary.failed[0].error
    edited = dict(record["sealed"], predicted=2.0)  # moved to match, digest left as it was
    open(path, "wb").write(canonical({"sealed": edited, "digest": record["digest"]}))
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(parts), prefix)
    assert [o.name for o in summary.failed] == ["ladder/check"]
    assert "does not match its digest: it was edited after sealing" in summary.failed[0].error


@pytest.mark.parametrize("losses, write, reason", [
    ((3.4, float("nan"), 2.7, 2.5), True, "rung r1 seed 0: loss is nan, not a finite number"),
    ((3.4, 3.0, 2.7, 2.5), False, "rung r0 seed 0: no results.json"),
    ((2.5, 2.7, 3.0, 3.4), True, "ladder fit: "),  # loss rising with compute: no law to seal
])
def test_a_failed_fit_seals_nothing(tmp_path, losses, write, reason):
    """A non-finite or missing rung result, or a fit that fails, fails the fit step with the
    reason; the prediction, the target and the check never run."""
    prefix = str(tmp_path / "p")
    parts = ladderkit.ladder(losses=losses, write=write)
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(parts), prefix)
    failed = {o.name: o.error for o in summary.failed if o.state == "FAILED"}
    assert list(failed) == ["ladder/fit"] and reason in failed["ladder/fit"], failed
    states = {name: o.state for name, o in summary.outcomes.items()}
    assert all(states[n] != "SUCCESS" for n in ("ladder/predict", "pretrain/target", "ladder/check")), states


def test_the_fit_step_refuses_a_target_of_no_seeds():
    from steps.ladder.steps import FitConfig, RungResult

    rungs = tuple(RungResult(f"r{i}", 10.0 ** (10 + i), evals=("gs://x/eval",)) for i in range(3))
    assert FitConfig(rungs=rungs, target="t", target_compute=1e14).target_seeds == 1
    for bad in (0, 1.5):
        with pytest.raises(VoyageError, match="target_seeds must be a whole number >= 1"):
            FitConfig(rungs=rungs, target="t", target_compute=1e14, target_seeds=bad)


def test_the_logbook_entry_shows_the_seal_and_the_verdict_of_the_steps_that_ran(tmp_path):
    """The predict and check steps give a `headline` in their results; the run's logbook entry copies
    it (the executor imports no step type), `--log` lines and the voyage's page show it; a run where
    the prediction stays cached shows only the new verdict."""
    from executor import logbook
    from executor.views.logbook import index_html, line

    prefix = str(tmp_path / "p")
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(ladderkit.ladder()), prefix)
    assert summary.exit_code == 0
    logbook.record_run(plan, summary, "ladder")
    pred = read(prefix, plan, "ladder/predict", "prediction.json")
    verdict = read(prefix, plan, "ladder/check", "verdict.json")
    [entry] = logbook.entries(Store(prefix), "ladder")
    seal, check = entry["steps"]["ladder/predict"]["headline"], entry["steps"]["ladder/check"]["headline"]
    assert (seal["kind"], seal["predicted"], seal["band"], seal["seal"]) == \
        ("prediction", pred["sealed"]["predicted"], pred["sealed"]["band"], pred["digest"])
    assert (check["kind"], check["verdict"], check["error_pct"], check["seal"]) == \
        ("verdict", "HIT", verdict["error_pct"], pred["digest"])
    assert [n for n, r in entry["steps"].items() if "headline" in r] == ["ladder/predict", "ladder/check"]
    text = line(entry)
    lo, hi = pred["sealed"]["band"]
    assert f"ladder/predict: sealed target: predicted {pred['sealed']['predicted']:.4g} [{lo:.4g}, {hi:.4g}], " \
           f"record {pred['digest'][:12]}" in text
    assert f"ladder/check: HIT target: landed {verdict['landed']:.4g}" in text
    assert f"{verdict['error_pct']:+.1f}%" in text
    page = index_html("ladder", [entry])
    assert f"record {pred['digest'][:12]}" in page and "HIT target" in page
    # the target lands far off: target, eval and check run again, the prediction stays sealed and cached
    far = ladderkit.law(ladderkit.TARGET_COMPUTE) * 1.08
    plan2, s2 = ladderkit.run_inline(ladderkit.all_steps(ladderkit.ladder(landed=far)), prefix)
    assert s2.exit_code == 0
    logbook.record_run(plan2, s2, "ladder")
    newest = logbook.entries(Store(prefix), "ladder")[0]
    kept = newest["steps"]["ladder/predict"]
    assert kept["state"] == "cached" and "headline" not in kept
    miss = newest["steps"]["ladder/check"]["headline"]
    assert miss["verdict"] == "MISS" and 7 < miss["error_pct"] < 9 and miss["seal"] == pred["digest"]
    assert "ladder/check: MISS target" in line(newest) and "sealed" not in line(newest)
