"""The trainer's side of the plan's memory assumptions: the CUDA allocator's
expandable segments (the 5% fragmentation reserve assumes them) and the fp32 gradient
accumulators of the distributed optimizer allocated before the first forward."""

import torch
from torch import nn

from steps.train.parallel import EXPANDABLE, expandable_segments
from steps.train.replicas import ONE, ReplicaShards


def test_expandable_segments_added_to_the_allocator_settings(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert expandable_segments() == EXPANDABLE
    assert torch.cuda.is_initialized() is False  # nothing started on this CPU machine
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    # a user's other settings are kept, and a user's own word on expandable segments stands
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert expandable_segments() == "max_split_size_mb:512,expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert expandable_segments() == "expandable_segments:False"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_the_gradient_accumulators_exist_before_the_first_forward():
    model = nn.Sequential(nn.Linear(8, 5), nn.Linear(5, 3))
    shards = ReplicaShards(model, ONE, torch.float32)
    sizes = {p: a.numel() for p, a in shards.acc.items()}
    assert sizes == {p: p.numel() for p in model.parameters()}  # one replica: the whole shard, unpadded
    assert all(a.dtype == torch.float32 and not a.any() for a in shards.acc.values())
