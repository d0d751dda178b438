"""Reading a checkpoint one tensor at a time and writing one lazily: the single-chunk fast path
reads what dcp.load reads, and the lazy writer's checkpoint is what the trainer loads."""

import json

import torch

from steps.export.dcp_io import CheckpointTensors, write_checkpoint
from steps.train import checkpoint


def test_fast_path_and_dcp_load_read_the_same(laptop, monkeypatch):
    reader = CheckpointTensors(checkpoint.resolve(laptop["midtrain"], "x").url)
    fast = {k: reader._load_whole_chunk(k) for k in reader.entries}
    assert all(v is not None for v in fast.values())  # a one-worker trainer checkpoint: one chunk each
    monkeypatch.setattr(CheckpointTensors, "_load_whole_chunk", lambda self, fqn: None)
    for k, v in fast.items():
        slow = reader.load(k)
        assert slow.dtype == v.dtype and torch.equal(slow, v), k


def test_lazy_writer_makes_a_checkpoint_the_trainer_loads(tmp_path):
    from steps.moe.model import PRESETS, MoETransformer

    model = MoETransformer(PRESETS["tiny"])
    model.init_weights(torch.Generator().manual_seed(3))
    want = model.state_dict()
    made = []

    def produce(fqn):
        made.append(fqn)
        return want[fqn].clone()

    write_checkpoint(str(tmp_path / "ck"), {k: (tuple(v.shape), v.dtype) for k, v in want.items()}, produce)
    assert sorted(made) == sorted(want)  # each tensor made exactly once
    # the marker that makes a folder a checkpoint, as import_hf writes it: loads verify its files
    meta = {"step": 0, "weights_only": True, checkpoint.FILES: checkpoint.folder_digests(str(tmp_path / "ck"))}
    (tmp_path / "ck" / checkpoint.META).write_text(json.dumps(meta))
    fresh = MoETransformer(PRESETS["tiny"])
    checkpoint.load(str(tmp_path / "ck"), fresh, None)
    assert all(torch.equal(fresh.state_dict()[k], want[k]) for k in want)
