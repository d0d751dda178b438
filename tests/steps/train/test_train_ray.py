"""Training on Ray through the executor: pretrain on two Ray Train workers (DDP over gloo:
`ParallelConfig(dp_replicate=-1, dp_shard=1)`) is killed part-way, run again, resumes from its
checkpoint and ends bitwise equal to an uninterrupted one-worker run of the same batches; midtrain
and eval then chain on its output."""

import dataclasses
import json
import os
import sys

import pytest
import torch

from kits.trainkit import make_mixture, run_step  # noqa: E402

from executor import Resources, Step, output_of  # noqa: E402
from executor.api import run_steps  # noqa: E402
from executor.storage.store import Store  # noqa: E402
from steps.train import checkpoint  # noqa: E402
from steps.train.config import (DataConfig, ModelSpec, OptimizerConfig, ParallelConfig, TrackerConfig,  # noqa: E402
                                TrainConfig, TrainerConfig)
from steps.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from steps.train.pretrain import midtrain, pretrain  # noqa: E402

# the slower tier (`--tier slow`: fault injection on real processes), which .ci/run runs after the
# README's command (tests/conftest.py)
pytestmark = pytest.mark.slow_tier


def _weights(output):
    from steps.moe.model import PRESETS, MoETransformer

    found = checkpoint.list_checkpoints(output)[-1]
    model = MoETransformer(dataclasses.replace(PRESETS["tiny"], vocab_size=512))
    checkpoint.load(found.url, model, None)
    return found.step, model.state_dict()


def test_two_ray_workers_killed_resumed_bitwise_then_midtrain_and_eval(ray_local, tokens, tmp_path):
    mix = make_mixture(tokens, tmp_path / "mix", sequences=1000)
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                      optimizer=OptimizerConfig(lr=1e-2, warmup_steps=5),
                      trainer=TrainerConfig(log_every=5, checkpoint_every=7, tracker=TrackerConfig(kind="none"),
                                            parallel=ParallelConfig(dp_replicate=-1, dp_shard=1)))
    two = Resources(cpus=1, workers=2)
    killed = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, fail_after_steps=17))
    prefix = str(tmp_path / "prefix")

    plan, summary = run_steps([Step("pretrain", pretrain, killed, resources=two)], prefix)
    assert summary.exit_code == 1 and "fail_after_steps" in summary.failed[0].error
    dirname = plan.decisions[0].node.dirname  # the failed attempt's folder: nothing is committed yet
    out = os.path.join(prefix, Store(prefix).read_status(dirname).data_dir(dirname))
    assert [f.step for f in checkpoint.list_checkpoints(out)] == [7, 14]

    pre = Step("pretrain", pretrain, cfg, resources=two)  # the knob is run-only: same digest, same folder
    mid = Step("midtrain", midtrain, dataclasses.replace(cfg, init_from=output_of(pre)))
    ev = Step("eval", evaluate, EvalConfig(checkpoint=output_of(mid), max_sequences=32))
    plan, summary = run_steps([ev], prefix)
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    paths = {d.name: plan.path(d.node) for d in plan.decisions}
    assert paths["pretrain"] == out
    record = json.load(open(os.path.join(out, ".step.json")))
    assert len(record["attempts"]) == 2 and record["results"]["workers"] == 2

    # the same batches on one worker in two micro-batches of 8: the same sums, so the same bits
    one = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, microbatch=8))
    ref = run_step(pretrain, one, tmp_path / "one", name="one")
    (s1, w1), (s2, w2) = _weights(ref.output), _weights(out)
    assert s1 == s2 == 46 and all(torch.equal(w1[k], w2[k]) for k in w1)

    res = json.load(open(os.path.join(paths["eval"], "results.json")))
    assert res["step"] == 62 and res["loss"] < res["unigram_loss"]
