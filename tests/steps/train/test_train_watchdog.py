"""The hang watchdog through the executor on a real Ray: a pretrain attempt that blocks forever
mid-step is ended by the watchdog (every thread's stack in the step's logs), classified `hang`,
retried by the policy and resumed from its last checkpoint to SUCCESS."""

import json
import os
import sys

from kits.trainkit import make_mixture  # noqa: E402

from executor import RetryPolicy, Step  # noqa: E402
from executor.api import run_steps  # noqa: E402
from executor.failures import Budget  # noqa: E402
from steps.train import checkpoint  # noqa: E402
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.train.pretrain import pretrain  # noqa: E402
from steps.train.watchdog import WatchdogConfig  # noqa: E402


def test_a_hung_attempt_is_ended_logged_and_resumed_to_success(ray_local, tokens, tmp_path):
    mix = make_mixture(tokens, tmp_path / "mix", sequences=256)  # 16 steps, pretrain 0..12
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                      optimizer=OptimizerConfig(lr=1e-2, warmup_steps=2),
                      trainer=TrainerConfig(log_every=4, checkpoint_every=4, tracker=TrackerConfig(kind="none"),
                                            hang_at_step=6, watchdog=WatchdogConfig(timeout_s=4.0, first_step_s=120.0, grace_s=10.0)))
    step = Step("pretrain", pretrain, cfg, retry=RetryPolicy(budgets={"hang": Budget(1, backoff_s=0.1)}))
    plan, summary = run_steps([step], str(tmp_path / "prefix"))
    outcome = summary.outcomes["pretrain"]
    assert summary.exit_code == 0, outcome
    out = plan.path(plan.decisions[0].node)
    record = json.load(open(os.path.join(out, ".step.json")))
    first, second = record["attempts"]
    assert (first["state"], first["failure"]) == ("FAILED", "hang"), first
    assert first["error"].startswith("Hang: no optimizer step finished within 4s (after 6 steps")
    assert second["state"] == "SUCCESS" and record["results"]["final_step"] == 12
    stacks = open(os.path.join(out, "logs/hang-attempt1-rank0.txt")).read()
    assert "train_step" in stacks and "Thread" in stacks  # where it hung, every thread
    assert [f.step for f in checkpoint.list_checkpoints(out)][-1] == 12
    # it resumed from step-4 rather than starting over: metrics rows of 4 come from attempt 1 only once
    rows = [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))]
    assert rows == [4, 8, 12]
    # the hang log is a log: an identical rerun would cut off downstream
    assert any(e["path"] == "logs/hang-attempt1-rank0.txt" and e["log"] for e in record["manifest"])
