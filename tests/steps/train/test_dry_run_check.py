"""`--dry-run` looks at each cached training output's newest checkpoint (the step types'
`check_output`, steps/train/checkpoint_policy.newest_problem): a shard truncated on disk is
named with its step, file and check; an intact output prints no warning. A real pretrain output,
made by the executor in this process."""

import io
import os

import pytest

from kits.trainkit import make_mixture

from executor import Step
from executor.api import plan_steps
from executor.testing import run_inline
from executor.views import report
from steps.train import checkpoint
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig
from steps.train.pretrain import pretrain


@pytest.fixture(scope="module")
def trained(tokens, tmp_path_factory):
    root = tmp_path_factory.mktemp("drycheck")
    mix = make_mixture(tokens, root / "mix", sequences=128)  # 8 steps of 16, pretrain 0..6
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                      optimizer=OptimizerConfig(lr=1e-2, warmup_steps=2),
                      trainer=TrainerConfig(log_every=2, checkpoint_every=2, tracker=TrackerConfig(kind="none")))
    step = Step("pretrain/small", pretrain, cfg)
    prefix = str(root / "prefix")
    plan, summary = run_inline([step], prefix)
    assert summary.exit_code == 0, summary.outcomes
    return step, prefix, plan.path(plan.decisions[0].node)


def _dry_run(step, prefix):
    plan = plan_steps([step], prefix)
    out = io.StringIO()
    report.print_plan(plan, out)
    return plan.decisions[0], out.getvalue()


def test_an_intact_output_prints_no_warning(trained):
    step, prefix, _ = trained
    d, text = _dry_run(step, prefix)
    assert d.state == "CACHED" and d.output_problem == "", d.reason
    assert "WARNING" not in text


def test_a_truncated_shard_of_the_newest_checkpoint_is_named_by_the_dry_run(trained):
    step, prefix, out = trained
    newest = checkpoint.list_checkpoints(out)[-1]
    older = checkpoint.list_checkpoints(out)[-2]
    # an older checkpoint's damage is not looked at (only the newest is what a load reads)
    shard = next(f for f in sorted(os.listdir(newest.url)) if f.endswith(".distcp"))
    os.truncate(f"{older.url}/{shard}", 10)
    d, text = _dry_run(step, prefix)
    assert d.output_problem == "" and "WARNING" not in text
    size = os.path.getsize(f"{newest.url}/{shard}")
    os.truncate(f"{newest.url}/{shard}", size // 2)
    d, text = _dry_run(step, prefix)
    assert d.state == "CACHED"  # reported, not acted on
    warning = [line for line in text.splitlines() if line.startswith("WARNING pretrain/small:")]
    assert warning == [f"WARNING pretrain/small: newest checkpoint step-{newest.step}: {shard}: size check: "
                       f"{size // 2} bytes, {size} when saved"], text
    from executor.views.viz.graph import draw

    assert draw(plan_steps([step], prefix), records=False).to_json()["steps"][0]["output_problem"] == d.output_problem
    os.remove(f"{newest.url}/{shard}")
    d, _ = _dry_run(step, prefix)
    assert d.output_problem == f"newest checkpoint step-{newest.step}: {shard}: missing"
