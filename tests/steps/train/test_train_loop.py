"""pretrain -> midtrain -> eval in-process (one worker, no Ray): schedule, checkpoints and their
retention, metrics.jsonl, bitwise resume after a kill, W&B offline resume, and bad input."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from kits.trainkit import make_mixture, renewed, run_step, wandb_runs  # noqa: E402

from executor import VoyageError  # noqa: E402
from executor.storage.store import Store, output_digest  # noqa: E402
from steps.data.formats import read_json, write_json  # noqa: E402
from steps.train import checkpoint  # noqa: E402
from steps.train.config import (DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig,  # noqa: E402
                                TrainerConfig)
from steps.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from steps.train.loop import Killed  # noqa: E402
from steps.train.pretrain import midtrain, pretrain  # noqa: E402
from steps.train.tracking import METRIC_KEYS  # noqa: E402


def _config(mix, **trainer):
    base = dict(log_every=5, checkpoint_every=10, keep_last=1, permanent_every=20, tracker=TrackerConfig(kind="none"))
    return TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                       optimizer=OptimizerConfig(lr=1e-2, warmup_steps=5, min_lr_ratio=0.1),
                       trainer=TrainerConfig(**{**base, **trainer}))


def _weights(output):
    from steps.moe.model import PRESETS, MoETransformer

    found = checkpoint.list_checkpoints(output)[-1]
    model = MoETransformer(dataclasses.replace(PRESETS["tiny"], vocab_size=512))
    checkpoint.load(found.url, model, None)
    return found.step, model.state_dict()


@pytest.fixture(scope="module")
def mix(tokens, tmp_path_factory):
    # 1,000 sequences of 33 tokens at batch 16: 62 steps, pretrain 0..46, midtrain 46..62
    return make_mixture(tokens, tmp_path_factory.mktemp("mix") / "mix", sequences=1000)


def test_schedule_warms_up_holds_and_decays_to_the_floor():
    opt = OptimizerConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    s = opt.schedule(total_steps=20, switch_step=15)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(14) == 1.0 and s(15) < 1.0 and s(19) == pytest.approx(0.1)
    assert OptimizerConfig(warmup_steps=2, decay_fraction=0.5).schedule(10, 10).decay_start == 5
    assert OptimizerConfig(warmup_steps=2).schedule(10, 10).decay_start == 2  # one stage: decay after warmup


def test_pretrain_midtrain_eval(mix, tmp_path):
    cfg = _config(mix)
    pre = run_step(pretrain, cfg, tmp_path / "pre", name="pre")
    assert pre.results["end_step"] == 46 and pre.results["final_step"] == 46
    # retention: the newest (46) and the permanent multiple of 20 (20, 40) stay; 10 and 30 went
    assert [f.step for f in checkpoint.list_checkpoints(pre.output)] == [20, 40, 46]
    rows = [json.loads(line) for line in open(tmp_path / "pre/metrics.jsonl")]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30, 35, 40, 45, 46]
    assert all(set(METRIC_KEYS) <= set(r) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert rows[-1]["tokens"] == 46 * 16 * 32
    assert 0 <= rows[-1]["expert_load_min"] <= 1 / 8 <= rows[-1]["expert_load_max"] <= 1
    meta = checkpoint.read_meta(pre.results["checkpoint"])
    assert meta["step"] == 46 and meta["model"]["vocab_size"] == 512 and meta["phase"] == "pretrain"

    mid = run_step(midtrain, dataclasses.replace(cfg, init_from=pre.output), tmp_path / "mid", name="mid")
    assert (mid.results["start_step"], mid.results["final_step"]) == (46, 62)
    mrows = [json.loads(line) for line in open(tmp_path / "mid/metrics.jsonl")]
    assert mrows[0]["step"] == 50 and mrows[-1]["step"] == 62
    assert mrows[-1]["lr"] == pytest.approx(1e-2 * 0.1)  # the decay ends on the floor
    assert mrows[0]["lr"] < 1e-2  # midtrain is the decay phase

    ev = run_step(evaluate, EvalConfig(checkpoint=mid.output, max_sequences=64), tmp_path / "eval", name="eval")
    res = json.load(open(tmp_path / "eval/results.json"))
    assert res["step"] == 62 and set(res["datasets"]) == {"kjv", "pydocs"}
    for name, r in res["datasets"].items():
        assert r["sequences"] == 64 and r["bytes"] > r["tokens"]
        assert r["loss"] < r["unigram_loss"], (name, r)
        assert r["bpb"] == pytest.approx(r["loss"] / 0.6931471805599453 * r["tokens"] / r["bytes"])
    assert ev.results["loss"] == res["loss"]


@pytest.fixture(scope="module")
def whole(mix, tmp_path_factory):
    """An uninterrupted pretrain run that checkpoints every 7 steps (what resumed runs must equal)."""
    cfg = _config(mix, checkpoint_every=7, keep_last=2, permanent_every=0)
    return cfg, run_step(pretrain, cfg, tmp_path_factory.mktemp("whole") / "whole", name="pre")


def test_killed_run_resumes_bitwise(whole, tmp_path):
    cfg, whole = whole
    killed = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, fail_after_steps=17))
    with pytest.raises(Killed):
        run_step(pretrain, killed, tmp_path / "resumed", name="pre")
    assert [f.step for f in checkpoint.list_checkpoints(str(tmp_path / "resumed"))] == [7, 14]
    # a save cut off mid-way (no meta.json) is never resumed from
    (tmp_path / "resumed/checkpoints/step-21").mkdir()
    run_step(pretrain, cfg, tmp_path / "resumed", name="pre")
    (s1, w1), (s2, w2) = _weights(whole.output), _weights(str(tmp_path / "resumed"))
    assert s1 == s2 == 46 and w1.keys() == w2.keys()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    rows = [json.loads(line)["step"] for line in open(tmp_path / "resumed/metrics.jsonl")]
    assert rows == sorted(set(rows)) and rows[-1] == 46  # cut back to step 14, then continued
    # the same artifacts byte for byte (DCP's .metadata without its per-save uuid
    # and path; timings and nodes in run.json, a declared log), so the output digests agree and an
    # identical rerun cuts off downstream; the logs differ and are listed without a checksum.
    manifests = [Store(os.path.dirname(d)).manifest(os.path.basename(d), pretrain.is_log)
                 for d in (whole.output, str(tmp_path / "resumed"))]
    assert output_digest(manifests[0]) == output_digest(manifests[1])
    logs = {e.path for e in manifests[0] if e.log}
    assert {"metrics.jsonl", "checkpoints/step-46/run.json"} <= logs and not any(p.endswith("meta.json") for p in logs)
    assert checkpoint.read_run(whole.results["checkpoint"])["metrics"]["step"] == 46


def test_wandb_offline_run_continues_under_the_step_digest(mix, tmp_path, monkeypatch):
    """Both attempts continue one W&B run, grouped by the voyage, named by the step, its config the
    training config and the record's digest: read back from the offline run files (no network)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = _config(mix, tracker=TrackerConfig(kind="wandb"), fail_after_steps=10)
    with pytest.raises(Killed):
        run_step(pretrain, cfg, tmp_path / "pre", name="pretrain/pre", voyage="laptop")
    ctx = run_step(pretrain, dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, fail_after_steps=0)),
                   tmp_path / "pre", name="pretrain/pre", voyage="laptop")
    digest = ctx.digest
    runs = sorted(p for p in (tmp_path / "pre/wandb").iterdir() if p.name.startswith("offline-run"))
    assert len(runs) == 2 and all(r.name.endswith("-marin-" + digest[:24]) for r in runs), runs
    assert not os.path.exists("wandb")  # nothing in the working directory
    for attempt, folder in enumerate(runs, 1):
        found = wandb_runs(next(folder.glob("run-*.wandb")))
        if not found:  # W&B's writer may not have flushed the run record yet (seen on fresh clones):
            continue   # the folder's name carries the id (above), the results carry the rest (below)
        [run] = found
        assert (run.run_id, run.display_name, run.run_group) == ("marin-" + digest[:24], "pretrain/pre", "laptop")
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        assert config["marin"] == {"step": "pretrain/pre", "digest": digest, "voyage": "laptop", "attempt": 1}
        assert config["config"]["optimizer"]["lr"] == 1e-2 and config["config"]["data"]["batch_size"] == 16
    # offline: the results name the run and carry no link (the logbook page links it only when online)
    assert ctx.results["wandb"] == {"id": "marin-" + digest[:24], "name": "pretrain/pre", "group": "laptop",
                                    "project": "marin-voyage", "mode": "offline"}
    assert "links" not in ctx.results


@pytest.mark.parametrize("field, build", [
    ("model.vocab_size", lambda mix: dataclasses.replace(_config(mix), model=ModelSpec("tiny", vocab_size=1000))),
    ("data.batch_size", lambda mix: dataclasses.replace(_config(mix, workers=2), data=DataConfig(mix, batch_size=15))),
    ("trainer.microbatch", lambda mix: _config(mix, workers=2, microbatch=3)),
])
def test_bad_input_fails_before_training(mix, tmp_path, field, build):
    with pytest.raises(VoyageError, match=field.replace(".", r"\.")):
        run_step(pretrain, build(mix), tmp_path / "pre", name="pre")
    assert not (tmp_path / "pre/checkpoints").exists()


def test_datasets_of_different_tokenizers_are_refused(tokens, tmp_path):
    other = tmp_path / "other"
    import shutil

    shutil.copytree(tokens["pydocs"], other)
    manifest = read_json(str(other / "manifest.json"))
    write_json(str(other / "manifest.json"), {**manifest, "vocab_size": 600, "tokenizer": "elsewhere"})
    mix = make_mixture({**tokens, "pydocs": str(other)}, tmp_path / "mix", sequences=200)
    with pytest.raises(VoyageError, match=r"data\.mixture: .*tokenized differently"):
        run_step(pretrain, _config(mix), tmp_path / "pre", name="pre")


def test_midtrain_refuses_a_checkpoint_of_another_shape(mix, tmp_path):
    cfg = _config(mix)
    pre = run_step(pretrain, cfg, tmp_path / "pre", name="pre")
    wide = dataclasses.replace(cfg, init_from=pre.output, model=ModelSpec("tiny", overrides={"dim": 96}))
    with pytest.raises(VoyageError, match=r"init_from: .*another shape.*wk\.weight"):
        run_step(midtrain, wide, tmp_path / "mid", name="mid")
    with pytest.raises(VoyageError, match="init_from"):
        run_step(midtrain, cfg, tmp_path / "mid2", name="mid")  # no init_from at all


def test_step_modules_import_neither_torch_nor_ray():
    code = ("import sys, steps.train, steps.train.config, steps.train.pretrain, steps.eval.evaluate, "
            "steps.train.checkpoint_policy, steps.provenance.which_saw; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_attempt_whose_lease_is_taken_over_stops_before_it_writes_into_its_successors_folder(whole, tmp_path):
    """A resumed attempt shares its folder with the attempt it resumed, which may still be training
    (its executor paused past the lease's ttl; bench/chaos.py saw such a writer rename a live
    save's files). A takes the lease and trains; just before A marks step 14's checkpoint
    complete, B takes the lease over. A stops there (LeaseLost; step 14 never counts), B resumes
    the folder from step 7 and finishes with A's uninterrupted result, and A, waking again, stops
    before it deletes or writes a byte of B's output."""
    from executor import LeaseLost
    from executor.testing import build_context
    from executor.context import LeaseRef
    from executor.storage.lease import Leases, Owner

    cfg, whole = whole
    store, dirname = Store(str(tmp_path)), "pre"
    out = tmp_path / dirname / ".attempts" / "a1"
    leases_a = Leases(store, ttl=60, owner=Owner("host-a", 1, "run-a"))
    leases_b = Leases(store, ttl=60, owner=Owner("host-b", 2, "run-b"))
    lease_a, _ = leases_a.try_acquire(dirname)

    def ctx(token):
        return build_context(str(out), name="pre", digest=("pre" * 64)[:64], resumable=True, lease=LeaseRef(str(tmp_path), dirname, token, 60.0))

    a = ctx(lease_a.token)
    fenced, taken = a.fenced, []

    def take_over_first(what, patience=None):
        if "marking checkpoint step-14" in what and not taken:
            leases_a.release(dirname, lease_a)  # as if A's lease had expired unrenewed
            taken.append(leases_b.try_acquire(dirname)[0])
        return fenced(what, patience)

    a.fenced = take_over_first
    with pytest.raises(LeaseLost, match=r"step pre, attempt 1 \(token \d+\): the lease was taken over"):
        pretrain(cfg, a)
    assert taken and taken[0].token > lease_a.token
    assert [f.step for f in checkpoint.list_checkpoints(str(out))] == [7]
    assert not (out / "checkpoints/step-14/meta.json").exists()  # A's upload is there, never counted

    b = ctx(taken[0].token)
    with renewed(leases_b, dirname, taken[0]):  # B's driver keeps its lease while the attempt runs
        pretrain(cfg, b)
    assert [f.step for f in checkpoint.list_checkpoints(str(out))] == [42, 46]
    (s1, w1), (s2, w2) = _weights(whole.output), _weights(str(out))
    assert s1 == s2 == 46 and all(torch.equal(w1[k], w2[k]) for k in w1)

    def files():
        return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = files()
    with pytest.raises(LeaseLost, match="taken over"):
        pretrain(cfg, ctx(lease_a.token))  # A again: stops before its first write or deletion
    assert files() == before


def test_drops_past_the_per_expert_capacity_reach_the_metrics_and_the_log(tokens, tmp_path, caplog):
    """Per-expert capacity through the trainer: a per-expert capacity of 1.0 on one worker drops
    assignments; the metrics row counts them (moe_dropped, its share), health splits them by
    layer, the step's results keep the largest share, and a share above trainer.moe_drop_warn
    is logged as a warning."""
    mix = make_mixture(tokens, tmp_path / "mix", sequences=200, stages=((1.0, {"kjv": 1.0}),))
    cfg = dataclasses.replace(_config(mix, log_every=3, checkpoint_every=100, moe_drop_warn=1e-4),
                              model=ModelSpec("tiny", overrides={"expert_capacity_factor": 1.0}))
    with caplog.at_level("WARNING"):
        pre = run_step(pretrain, cfg, tmp_path / "pre", name="pre")
    rows = [json.loads(line) for line in open(tmp_path / "pre/metrics.jsonl")]
    assert rows and all(r["moe_dropped"] > 0 for r in rows)
    for r in rows:
        per = r["health"]["dropped"]
        assert len(per) == 4 and sum(per) == r["moe_dropped"]  # the tiny model's 4 layers
        assert len(r["health"]["dropped_share"]) == 4 and 0 < r["moe_dropped_share"] < 1
    assert pre.results["moe_dropped_share_max"] == max(r["moe_dropped_share"] for r in rows)
    assert any("of the token-expert assignments dropped by the capacity" in m and "moe_drop_warn" in m
               for m in caplog.messages)
    with pytest.raises(VoyageError, match="moe_drop_warn must lie in"):
        TrainerConfig(moe_drop_warn=2.0)
