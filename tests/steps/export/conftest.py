"""The export tests' shared checkpoint: the bundled corpus tokenized (512-id BPE), a mixture, a few
pretrain and midtrain steps of the `tiny` preset through the real step functions, and its export,
once per session. transformers writes the remote code it imports under HF_MODULES_CACHE: a
session folder, not the home directory."""

import os
import sys

import pytest

from kits.trainkit import build_tokens, make_mixture, run_step  # noqa: E402


@pytest.fixture(scope="session")
def laptop(tmp_path_factory):
    """{'tokens': {...}, 'mixture': url, 'pretrain': url, 'midtrain': url, 'config': TrainConfig}."""
    import dataclasses

    from steps.train.config import DataConfig, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig
    from steps.train.pretrain import midtrain, pretrain

    root = tmp_path_factory.mktemp("export-laptop")
    tokens = build_tokens(root / "data")
    # 480 sequences of 33 tokens at batch 16: pretrain steps 0..22, midtrain 22..30
    mix = make_mixture(tokens, root / "mix", sequences=480)
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=16), optimizer=OptimizerConfig(lr=1e-2, warmup_steps=3),
                      trainer=TrainerConfig(checkpoint_every=100, tracker=TrackerConfig(kind="none")))
    pre = run_step(pretrain, cfg, root / "pre", name="pre").output
    mid = run_step(midtrain, dataclasses.replace(cfg, init_from=pre), root / "mid", name="mid").output
    return {"tokens": tokens, "mixture": mix, "pretrain": pre, "midtrain": mid, "config": cfg, "root": root}


@pytest.fixture(scope="session")
def exported(laptop, tmp_path_factory):
    """The midtrain checkpoint exported (fp32, shards of at most 200 kB: several files)."""
    from steps.export.to_hf import HF_DIR, ExportHFConfig, export_hf

    out = tmp_path_factory.mktemp("export") / "hf"
    ctx = run_step(export_hf, ExportHFConfig(checkpoint=laptop["midtrain"], pad_token="<|pad|>",
                                             max_shard_bytes=200_000), out, name="export")
    return {"path": str(out / HF_DIR), "results": ctx.results}


@pytest.fixture(scope="session", autouse=True)
def hf_modules(tmp_path_factory):
    """Set before these tests import transformers, which reads it once, at import."""
    old = os.environ.get("HF_MODULES_CACHE")
    os.environ["HF_MODULES_CACHE"] = str(tmp_path_factory.mktemp("hf-modules"))
    yield os.environ["HF_MODULES_CACHE"]
    if old is None:
        os.environ.pop("HF_MODULES_CACHE", None)
    else:
        os.environ["HF_MODULES_CACHE"] = old


@pytest.fixture(scope="session")
def hf_model(exported, hf_modules):
    """(model, tokenizer) of the export through transformers' Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(exported["path"], trust_remote_code=True)
    return model.eval(), AutoTokenizer.from_pretrained(exported["path"], trust_remote_code=True)
