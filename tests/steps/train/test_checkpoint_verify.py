"""Checkpoints verified on load (steps/train/checkpoint.py): each corruption of the table in
docs/operations.md, written into the files on disk from outside, is refused on load with one
line naming the file and the check; a clean checkpoint loads."""

import dataclasses
import json
import shutil
import struct

import pytest
import torch

from steps.train import checkpoint, saving
from steps.train.checkpoint import CorruptCheckpoint
from steps.train.checkpoint_policy import CheckpointConfig, size_problem
from steps.train.config import OptimizerConfig
from steps.train.loop import build_model, build_optimizer

DATA = "__0_0.distcp"


def _fresh():
    from steps.moe.model import PRESETS

    model = build_model(dataclasses.replace(PRESETS["tiny"], vocab_size=512), 0, torch.device("cpu"))
    return model, build_optimizer(model, OptimizerConfig(), torch.device("cpu"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint written by the trainer's Saver (digests recorded), and the embedding it holds."""
    out = tmp_path_factory.mktemp("verify") / "pre"
    model, opt = _fresh()
    saver = saving.Saver(str(out), CheckpointConfig(every=1, final_step=3), async_save=False, device=torch.device("cpu"))
    saver.save(3, model, opt, {"step": 3}, {"step": 3}, None)
    return checkpoint.folder(str(out), 3), model.embed.weight.detach().clone()


def _copy(saved, tmp_path):
    url = str(tmp_path / "step-3")
    shutil.copytree(saved[0], url)
    return url


def _span(url, weight):
    """Where the embedding's float bytes lie in the data file (torch.save stores them verbatim)."""
    meta = checkpoint.FsspecReader(url).read_metadata()
    item = next(i for k, i in meta.storage_data.items() if k.fqn == "model.embed.weight")
    blob = open(f"{url}/{DATA}", "rb").read()
    at = blob.index(weight.numpy().tobytes()[:64], item.offset, item.offset + item.length)
    return item, at


def _patch(url, at, data):
    with open(f"{url}/{DATA}", "r+b") as f:
        f.seek(at)
        f.write(data)


def _refused(url, check):
    with pytest.raises(CorruptCheckpoint) as e:
        checkpoint.load(url, *_fresh())
    line = str(e.value)
    assert "\n" not in line and url in line and check in line, line
    return line


def test_a_clean_checkpoint_loads_and_records_every_file(saved, tmp_path):
    url = _copy(saved, tmp_path)
    files = checkpoint.read_meta(url)["files"]
    assert set(files) == {DATA, ".metadata"} and all(len(f["sha256"]) == 64 for f in files.values())
    model, opt = _fresh()
    assert checkpoint.load(url, model, opt)["step"] == 3
    assert torch.equal(model.embed.weight, saved[1])


@pytest.mark.parametrize("corruption", ["nan", "low_bits", "zip_header", "huge", "truncated"])
def test_each_corruption_on_disk_is_refused_with_one_line(saved, tmp_path, corruption):
    url = _copy(saved, tmp_path)
    item, at = _span(url, saved[1])
    if corruption == "nan":  # a weight set to NaN
        _patch(url, at + 4 * 5, struct.pack("<f", float("nan")))
    elif corruption == "low_bits":  # 64 low bits flipped: one per weight, in 64 weights
        blob = bytearray(open(f"{url}/{DATA}", "rb").read())
        for i in range(64):
            blob[at + 4 * i] ^= 1
        open(f"{url}/{DATA}", "wb").write(bytes(blob))
    elif corruption == "zip_header":  # a byte of the item's zip header (torch.save's archive)
        blob = bytearray(open(f"{url}/{DATA}", "rb").read())
        assert blob[item.offset:item.offset + 2] == b"PK"
        blob[item.offset + 6] ^= 0xFF
        open(f"{url}/{DATA}", "wb").write(bytes(blob))
    elif corruption == "huge":  # four weights set to 1e30
        _patch(url, at + 4 * 100, struct.pack("<4f", *[1e30] * 4))
    else:  # a truncated shard
        blob = open(f"{url}/{DATA}", "rb").read()
        open(f"{url}/{DATA}", "wb").write(blob[: len(blob) * 2 // 3])
    line = _refused(url, f"{DATA}: size check" if corruption == "truncated" else f"{DATA}: digest check")
    if corruption == "truncated":  # the cheap check (a listing) finds it too: what --dry-run can afford
        with pytest.raises(CorruptCheckpoint, match="size check"):
            checkpoint.verify_files(url, digests=False)
        assert size_problem(url)[0] == DATA  # torch-free
    else:
        checkpoint.verify_files(url, digests=False)  # the same size: only the digest sees it
        assert size_problem(url) is None
    assert "refused" in line


def test_without_recorded_digests_a_nan_weight_is_refused_by_finiteness(saved, tmp_path):
    url = _copy(saved, tmp_path)
    meta = checkpoint.read_meta(url)
    del meta["files"]  # a checkpoint written before digests (or its digests rewritten)
    open(f"{url}/meta.json", "w").write(json.dumps(meta))
    _, at = _span(url, saved[1])
    _patch(url, at, struct.pack("<f", float("inf")))
    line = _refused(url, "finiteness check: model.embed.weight")
    assert DATA in line
