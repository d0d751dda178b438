"""import_hf: the mapping read backwards. An exported folder imports to the
same state dict; midtraining starts from the imported weights (fresh optimizer, the run's schedule
at the stage's start) and eval scores them as it scores the original; broken folders are one
clear error each."""

import dataclasses
import json
import shutil

import pytest
import torch

from executor import VoyageError
from steps.export.dcp_io import CheckpointTensors
from steps.export.from_hf import ImportHFConfig, import_hf
from steps.train import checkpoint
from kits.trainkit import run_step  # noqa: E402  (on sys.path through conftest)


def _tensors(url):
    r = CheckpointTensors(checkpoint.resolve(url, "x").url)
    return {k: r.load(k) for k in r.entries}


@pytest.fixture(scope="module")
def imported(exported, tmp_path_factory):
    out = tmp_path_factory.mktemp("import") / "imp"
    return run_step(import_hf, ImportHFConfig(hf=exported["path"]), out, name="import").output


def test_export_then_import_is_the_same_state_dict(laptop, imported):
    want, got = _tensors(laptop["midtrain"]), _tensors(imported)
    assert set(got) == set(want) and len(got) == 59
    for k in want:
        assert got[k].dtype == torch.float32 and torch.equal(got[k], want[k]), k
    meta = checkpoint.read_meta(checkpoint.resolve(imported, "x").url)
    assert meta["weights_only"] and meta["step"] == 0 and meta["model"] == checkpoint.read_meta(
        checkpoint.resolve(laptop["midtrain"], "x").url)["model"]


def test_bf16_round_trip_rounds_only_what_it_stored_in_bf16(laptop, tmp_path):
    from steps.export.to_hf import ExportHFConfig, export_hf

    run_step(export_hf, ExportHFConfig(checkpoint=laptop["midtrain"], dtype="bfloat16"), tmp_path / "hf")
    run_step(import_hf, ImportHFConfig(hf=str(tmp_path / "hf")), tmp_path / "imp")
    want, got = _tensors(laptop["midtrain"]), _tensors(str(tmp_path / "imp"))
    for k in want:
        exact = k.endswith(("router.weight", "expert_bias_E"))
        assert torch.equal(got[k], want[k] if exact else want[k].bfloat16().float()), k


def test_midtrain_and_eval_start_from_the_imported_weights(laptop, imported, tmp_path):
    from steps.eval.evaluate import EvalConfig, evaluate
    from steps.train.loop import Trainer
    from steps.train.pretrain import midtrain, prepare

    cfg = dataclasses.replace(laptop["config"], init_from=imported)
    ctx = run_step(lambda c, x: None, cfg, tmp_path / "probe", name="probe")
    job = prepare(cfg, ctx, "midtrain")
    assert job.init_weights_only and job.start == 22
    trainer = Trainer(job)
    trainer.resume()
    want = _tensors(imported)
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], want[k]) for k in want)
    assert trainer.step == 22 and not trainer.optimizer.state  # a fresh optimizer
    schedule = cfg.optimizer.schedule(job.phases.total, job.phases.switch)
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(cfg.optimizer.lr * schedule(22))
    assert schedule(22) < 1  # midtrain is the decay phase: the schedule did not restart at warmup
    trainer.close()

    mid = run_step(midtrain, cfg, tmp_path / "mid", name="mid")
    assert (mid.results["start_step"], mid.results["final_step"]) == (22, 30)
    rows = [json.loads(line) for line in open(tmp_path / "mid/metrics.jsonl")]
    assert rows[-1]["step"] == 30 and rows[-1]["lr"] == pytest.approx(cfg.optimizer.lr * 0.1)

    # eval of the imported checkpoint (given the mixture) scores what eval of the original scores
    ev_imp = run_step(evaluate, EvalConfig(checkpoint=imported, mixture=laptop["mixture"], max_sequences=16),
                      tmp_path / "ev-imp")
    ev_orig = run_step(evaluate, EvalConfig(checkpoint=laptop["midtrain"], max_sequences=16), tmp_path / "ev-orig")
    assert ev_imp.results["loss"] == pytest.approx(ev_orig.results["loss"], abs=1e-6)


def test_an_imported_model_of_another_function_is_refused(laptop, exported, tmp_path):
    from steps.train.pretrain import prepare

    hf = tmp_path / "hf"
    shutil.copytree(exported["path"], hf)
    cfg_json = json.loads((hf / "config.json").read_text())
    cfg_json["rope_theta"] = cfg_json["marin"]["rope_theta"] = 10_000.0
    (hf / "config.json").write_text(json.dumps(cfg_json))
    imp = run_step(import_hf, ImportHFConfig(hf=str(hf)), tmp_path / "imp").output
    cfg = dataclasses.replace(laptop["config"], init_from=imp)
    ctx = run_step(lambda c, x: None, cfg, tmp_path / "probe", name="probe")
    with pytest.raises(VoyageError, match=r"init_from: the imported model is not the one configured .*rope_theta"):
        prepare(cfg, ctx, "midtrain")


def test_broken_folders_are_one_clear_error(exported, tmp_path):
    def broken(name, edit):
        d = tmp_path / name
        shutil.copytree(exported["path"], d)
        edit(d)
        return str(d)

    index = json.loads(open(f"{exported['path']}/model.safetensors.index.json").read())
    first, last = sorted(set(index["weight_map"].values()))[0], sorted(set(index["weight_map"].values()))[-1]

    def drop_expert(d):  # one expert's tensor gone from its file and from the index
        from safetensors import safe_open
        from safetensors.torch import save_file

        name = "model.layers.1.mlp.experts.3.up_proj.weight"
        idx = json.loads((d / "model.safetensors.index.json").read_text())
        shard = d / idx["weight_map"].pop(name)
        with safe_open(str(shard), framework="pt") as f:
            keep = {k: f.get_tensor(k) for k in f.keys() if k != name}
        save_file(keep, str(shard), metadata={"format": "pt"})
        (d / "model.safetensors.index.json").write_text(json.dumps(idx))

    def misplace(d):
        idx = json.loads((d / "model.safetensors.index.json").read_text())
        idx["weight_map"]["lm_head.weight"] = first if idx["weight_map"]["lm_head.weight"] != first else last
        (d / "model.safetensors.index.json").write_text(json.dumps(idx))

    def truncate(d):
        p = d / last
        p.write_bytes(p.read_bytes()[:-100])

    def remove_shard(d):
        (d / first).unlink()

    def resize(d):
        cfg = json.loads((d / "config.json").read_text())
        cfg["num_key_value_heads"] = cfg["marin"]["n_kv_heads"] = 4
        (d / "config.json").write_text(json.dumps(cfg))

    cases = [(drop_expert, r"lacks experts \[3\] of blocks.1.moe.w3_EFD"), (misplace, "puts lm_head.weight in"), (truncate, "is not a whole safetensors file: .* bytes, its header says"),
             (remove_shard, "is named by model.safetensors.index.json but missing"),
             (resize, "has shape .* the config says")]
    for edit, message in cases:
        src = broken(edit.__name__, edit)
        with pytest.raises(VoyageError, match=message):
            run_step(import_hf, ImportHFConfig(hf=src), tmp_path / f"out-{edit.__name__}")


def test_exporting_the_import_gives_the_same_files(laptop, exported, imported, tmp_path):
    """export(import(export(x))) == export(x), byte for byte (an import names no training data, so
    the tokenizer and its special tokens are given)."""
    import os

    from steps.export.to_hf import ExportHFConfig, export_hf

    with pytest.raises(VoyageError, match="export_hf.tokenizer: the checkpoint names no training data"):
        run_step(export_hf, ExportHFConfig(checkpoint=imported), tmp_path / "no-tokenizer")
    again = tmp_path / "again"
    run_step(export_hf, ExportHFConfig(checkpoint=imported, tokenizer=laptop["tokens"]["tokenizer"],
                                       eos_token="<|eos|>", pad_token="<|pad|>", max_shard_bytes=200_000), again)
    again = again / "hf"
    first = sorted(f for f in os.listdir(exported["path"]) if f != "README.md")
    assert sorted(f for f in os.listdir(again) if f != "README.md") == first
    for name in first:
        assert (again / name).read_bytes() == open(os.path.join(exported["path"], name), "rb").read(), name
