"""Verified success and spike handling on the tiny preset, in-process: a non-finite loss or
gradient norm ends the attempt before any update and no checkpoint holds a non-finite value; a
checkpoint counts only once it reads back (metadata, sampled checksums); eval refuses non-finite
results; a poisoned stretch of data is skipped and rewound over, deterministically, and the run
ends close to a clean one."""

import dataclasses
import json
import math
import os

import pytest
import torch

from kits.trainkit import make_mixture, run_step  # noqa: E402

from executor import NonFinite  # noqa: E402
from executor.failures import NON_FINITE, classify  # noqa: E402
from steps.train import checkpoint, saving  # noqa: E402
from steps.train.checkpoint_policy import CheckpointConfig  # noqa: E402
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from steps.train.loop import Killed, build_model, build_optimizer  # noqa: E402
from steps.train.pretrain import pretrain  # noqa: E402
from steps.train.spikes import SpikeConfig, trained_ranges  # noqa: E402


@pytest.fixture(scope="module")
def mix(tokens, tmp_path_factory):
    # 448 sequences of 33 tokens at batch 16: 28 steps, pretrain 0..21
    return make_mixture(tokens, tmp_path_factory.mktemp("mix") / "mix", sequences=448)


SPIKES = SpikeConfig(z=4.0, window=12, min_samples=8, sustained=3)


@pytest.fixture(scope="module")
def clean(mix, tmp_path_factory):
    """A clean pretrain run with the spike guard on (shared: eval poisons a copy of it)."""
    return run_step(pretrain, _config(mix), tmp_path_factory.mktemp("clean") / "pre", name="pre")


def _config(mix, lr=1e-2, grad_clip=1.0, spikes=SPIKES, **trainer):
    base = dict(log_every=1, checkpoint_every=5, keep_last=3, tracker=TrackerConfig(kind="none"))
    return TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                       optimizer=OptimizerConfig(lr=lr, warmup_steps=5, grad_clip=grad_clip, spikes=spikes),
                       trainer=TrainerConfig(**{**base, **trainer}))


def _state(output, step=None):
    from steps.moe.model import PRESETS, MoETransformer

    found = [f for f in checkpoint.list_checkpoints(output) if step is None or f.step == step][-1]
    model = MoETransformer(dataclasses.replace(PRESETS["tiny"], vocab_size=512))
    checkpoint.load(found.url, model, None)
    return found.step, model.state_dict()


def test_a_diverging_run_never_succeeds_and_never_checkpoints_non_finite_values(mix, tmp_path):
    cfg = _config(mix, lr=100.0, grad_clip=0.0, checkpoint_every=3)  # diverges within a few steps
    with pytest.raises(NonFinite, match=r"step \d+: loss .*gradient norm .*no update") as e:
        run_step(pretrain, cfg, tmp_path / "pre", name="pre")
    assert classify(e.value) == NON_FINITE
    found = checkpoint.list_checkpoints(str(tmp_path / "pre"))
    for f in found:  # whatever counts is finite, everywhere
        _, weights = _state(str(tmp_path / "pre"), f.step)
        assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())
    rows = [json.loads(line) for line in open(tmp_path / "pre/metrics.jsonl")]
    assert all(math.isfinite(r["loss"]) for r in rows)


def test_a_checkpoint_with_non_finite_state_is_refused_and_never_marked(tmp_path):
    from steps.moe.model import PRESETS

    model = build_model(dataclasses.replace(PRESETS["tiny"], vocab_size=512), 0, torch.device("cpu"))
    opt = build_optimizer(model, OptimizerConfig(), torch.device("cpu"))
    saver = saving.Saver(str(tmp_path), CheckpointConfig(every=1, final_step=10, keep_last=2), async_save=False,
                         device=torch.device("cpu"))
    saver.save(3, model, opt, {"step": 3}, {"step": 3}, None)
    assert [f.step for f in checkpoint.list_checkpoints(str(tmp_path))] == [3]
    with torch.no_grad():
        next(model.parameters()).view(-1)[7] = float("nan")
    with pytest.raises(NonFinite, match="non-finite values in 1 tensors"):
        saver.save(4, model, opt, {"step": 4}, {"step": 4}, None)
    assert [f.step for f in checkpoint.list_checkpoints(str(tmp_path), complete=False)] == [3]


@pytest.mark.parametrize("damage", ["truncate", "flip", "metadata"])
def test_a_checkpoint_that_does_not_read_back_does_not_count(tmp_path, damage):
    from steps.moe.model import PRESETS

    model = build_model(dataclasses.replace(PRESETS["tiny"], vocab_size=512), 0, torch.device("cpu"))
    opt = build_optimizer(model, OptimizerConfig(), torch.device("cpu"))
    url = str(tmp_path / "ck")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    sd = dict(zip(("model", "optim"), get_state_dict(model, opt)))
    flat = saving._tensors(sd)
    keys = sorted(flat)[:2] + ["model.embed.weight"]
    sums = {k: saving.checksum(flat[k]) for k in keys}
    expected = {k: torch.empty_like(t) for k, t in flat.items()}
    with checkpoint._single_process_ok():
        dcp.save(sd, storage_writer=checkpoint.Writer(url, sync_files=False), no_dist=True)
        saving.verify(url, expected, sums)  # intact: reads back
        data = tmp_path / "ck" / "__0_0.distcp"
        blob = bytearray(data.read_bytes())
        if damage == "truncate":
            data.write_bytes(bytes(blob[: len(blob) // 2]))
        elif damage == "flip":
            meta = checkpoint.FsspecReader(url).read_metadata()
            item = meta.storage_data[next(i for i in meta.storage_data if i.fqn == "model.embed.weight")]
            blob[item.offset + item.length // 2] ^= 0xFF
            data.write_bytes(bytes(blob))
        else:
            (tmp_path / "ck" / ".metadata").write_bytes(b"not a pickle")
        with pytest.raises(Exception):
            saving.verify(url, expected, sums)


def test_eval_refuses_a_checkpoint_that_gives_non_finite_results(clean, tmp_path):
    import shutil

    shutil.copytree(clean.output, tmp_path / "pre")
    # A poisoned checkpoint (written behind the trainer's back with the plain save): NaN weights.
    from steps.moe.model import PRESETS

    found = checkpoint.list_checkpoints(str(tmp_path / "pre"))[-1]
    model = build_model(dataclasses.replace(PRESETS["tiny"], vocab_size=512), 0, torch.device("cpu"))
    opt = build_optimizer(model, OptimizerConfig(), torch.device("cpu"))
    state = checkpoint.load(found.url, model, opt)
    meta = {k: v for k, v in checkpoint.read_meta(found.url).items() if k != "files"}  # no digests recorded
    with torch.no_grad():  # finite weights whose logits overflow
        model.head.weight.copy_((torch.rand_like(model.head.weight) * 2 - 1) * 3e38)
    checkpoint.save(found.url, model, opt, {k: v for k, v in state.items() if k != "rng"}, meta)
    with pytest.raises(NonFinite, match=r"non-finite results at .*loss"):
        run_step(evaluate, EvalConfig(checkpoint=str(tmp_path / "pre"), max_sequences=16), tmp_path / "eval", name="eval")
    assert not (tmp_path / "eval/results.json").exists()
    with torch.no_grad():  # NaN weights: refused on load, before any result
        model.head.weight.fill_(float("nan"))
    checkpoint.save(found.url, model, opt, {k: v for k, v in state.items() if k != "rng"}, meta)
    with pytest.raises(checkpoint.CorruptCheckpoint, match=r"refused: .*finiteness check: model\.head\.weight"):
        run_step(evaluate, EvalConfig(checkpoint=str(tmp_path / "pre"), max_sequences=16), tmp_path / "eval", name="eval")


def test_a_poisoned_stretch_is_skipped_step_by_step_and_the_run_ends_near_a_clean_one(mix, clean, tmp_path):
    assert "spike_events" not in clean.results  # no false alarm on a clean run
    run = run_step(pretrain, _config(mix, poison_steps=(14, 17)), tmp_path / "poisoned", name="pre")
    events = run.results["spike_events"]
    kinds = [(e["step"], e["kind"]) for e in events]
    # only the poisoned steps, each judged against the window from before the stretch; nothing of
    # them reached the weights, so no rewind throws good steps away
    assert kinds == [(14, "skip"), (15, "skip"), (16, "skip")], kinds
    assert abs(run.results["loss"] - clean.results["loss"]) < 0.3, (run.results["loss"], clean.results["loss"])
    assert run.provenance["tokens"]["skipped_steps"] == [[14, 14, "skip"], [15, 15, "skip"], [16, 16, "skip"]]
    rows = [json.loads(line) for line in open(tmp_path / "poisoned/metrics.jsonl")]
    assert any(r.get("events") for r in rows)  # marked in the curve the live page draws
    from steps.provenance.which_saw import skipped_steps

    newest = checkpoint.list_checkpoints(run.output)[-1].url
    assert skipped_steps(newest, [13, 14, 16, 17]) == [(14, "skip"), (16, "skip")]


def test_a_spike_that_goes_on_is_rewound_its_data_dropped_and_the_good_steps_trained_again(mix, clean, tmp_path):
    poisoned = _config(mix, poison_steps=(12, 18))  # 6 steps: 2 x sustained outliers in a row
    run = run_step(pretrain, poisoned, tmp_path / "poisoned", name="pre")
    events = run.results["spike_events"]
    kinds = [(e["step"], e["kind"]) for e in events]
    assert kinds == [(n, "skip") for n in range(12, 17)] + [(17, "rewind")], kinds
    # back to step-10; step 10 trained again, the data of 11 (the last update before the spike)
    # through 17 dropped, nothing more
    assert events[-1]["to_step"] == 10 and events[-1]["skipped"] == [11, 17]
    assert trained_ranges(0, 21, events) == [(0, 11), (18, 21)]
    assert abs(run.results["loss"] - clean.results["loss"]) < 0.3, (run.results["loss"], clean.results["loss"])
    from steps.provenance.which_saw import skipped_steps

    newest = checkpoint.list_checkpoints(run.output)[-1].url
    assert skipped_steps(newest, [10, 11, 14, 17, 18]) == [(11, "rewind"), (14, "rewind"), (17, "rewind")]

    # deterministic: killed after the rewind, resumed from step-20: the same events, the same bits
    killed = dataclasses.replace(poisoned, trainer=dataclasses.replace(poisoned.trainer, fail_after_steps=27))
    with pytest.raises(Killed):
        run_step(pretrain, killed, tmp_path / "resumed", name="pre")
    assert checkpoint.list_checkpoints(str(tmp_path / "resumed"))[-1].step == 20
    again = run_step(pretrain, poisoned, tmp_path / "resumed", name="pre")
    assert again.results["spike_events"] == events
    (s1, w1), (s2, w2) = _state(run.output), _state(again.output)
    assert s1 == s2 == 21 and all(torch.equal(w1[k], w2[k]) for k in w1)

    # the rewind, its retraining of step 10 and the skips leave exactly what dropping 11..17 would
    # (`trainer.drop_steps`, bench/train_poison.py's same-steps controls): the same bits
    dropped = dataclasses.replace(poisoned, trainer=dataclasses.replace(poisoned.trainer, drop_steps=tuple(range(11, 18))))
    plain = run_step(pretrain, dropped, tmp_path / "dropped", name="pre")
    assert "spike_events" not in plain.results  # nothing poisoned was read, no decision taken
    s3, w3 = _state(plain.output)
    assert s3 == 21 and all(torch.equal(w1[k], w3[k]) for k in w1)


def _corrupt(url):
    """Four weights' worth of bytes (16) in the middle of a checkpoint's data file set to 1e30,
    written from outside."""
    import struct

    with open(f"{url}/__0_0.distcp", "r+b") as f:
        f.seek(os.path.getsize(f"{url}/__0_0.distcp") // 2)
        f.write(struct.pack("<4f", *[1e30] * 4))


def test_a_corrupt_newest_checkpoint_is_refused_and_the_run_resumes_from_the_previous_one(mix, clean, tmp_path, caplog):
    cfg = _config(mix)
    killed = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, fail_after_steps=16))
    with pytest.raises(Killed):
        run_step(pretrain, killed, tmp_path / "pre", name="pre")
    assert [f.step for f in checkpoint.list_checkpoints(str(tmp_path / "pre"))] == [5, 10, 15]
    _corrupt(checkpoint.folder(str(tmp_path / "pre"), 15))
    with caplog.at_level("INFO", logger="marin"):
        again = run_step(pretrain, cfg, tmp_path / "pre", name="pre")
    said = [r.getMessage() for r in caplog.records]
    refused = [m for m in said if "refused" in m]
    assert len(refused) == 1 and "step-15 refused: __0_0.distcp: digest check" in refused[0], refused
    assert any("resumed from" in m and m.rstrip().endswith("(step 10)") for m in said), said
    (s1, w1), (s2, w2) = _state(clean.output), _state(again.output)
    assert s1 == s2 == 21 and all(torch.equal(w1[k], w2[k]) for k in w1)  # as if nothing had happened


def test_a_refused_checkpoint_is_never_tried_twice(mix, clean, tmp_path, caplog):
    import shutil

    from executor.testing import build_context
    from steps.train.loop import Trainer
    from steps.train.pretrain import prepare

    shutil.copytree(clean.output, tmp_path / "pre")
    _corrupt(checkpoint.folder(str(tmp_path / "pre"), 20))
    ctx = build_context(str(tmp_path / "pre"), name="pre", digest="0" * 64)
    trainer = Trainer(prepare(_config(mix), ctx, "pretrain"))
    try:
        found = [f for f in checkpoint.list_checkpoints(ctx.output) if f.step <= 20]  # what a rewind at 20 may use
        with caplog.at_level("INFO", logger="marin"):
            first = trainer.restore(found)
            second = trainer.restore(found)
        assert first[0].step == second[0].step == 15 and trainer.refused == {20}
        assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1  # verified once, refused once
    finally:
        trainer.close()
