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


def test_the_replica_reduce_scatter_writes_into_the_accumulator():
    """The step's reduce-scatter over the replicas (the NCCL path; here the fake backend, which
    moves no data) takes the accumulator as its input and this rank's chunk of it as its output:
    no buffer is allocated for the reduced slice, which the plan no longer counts (4/R bytes a
    parameter: 2.82 GiB at 535B over 11 replicas)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from steps.scale.trace import LiveBytes
    from steps.train.replicas import Replicas

    dist.init_process_group("fake", rank=1, world_size=3, store=FakeStore())
    try:
        model = nn.Sequential(nn.Linear(8, 5), nn.Linear(5, 3))
        shards = ReplicaShards(model, Replicas(dist.group.WORLD, 3, 1), torch.float32)
        for p in shards.params:
            shards.acc[p].copy_(torch.arange(shards.acc[p].numel(), dtype=torch.float32))
            shards.seen.add(p)
        live = LiveBytes(existing=list(shards.acc.values()))
        with live:
            for p in shards.params:
                shards._launch(p)
            shards.finish()
        assert live.created_total() == 0  # nothing allocated: not a slice's buffer, not a copy
        for p in shards.params:
            acc, got = shards.acc[p], shards.grads[p]
            chunk = acc.numel() // 3
            start, stop = min(p.numel(), chunk), min(p.numel(), 2 * chunk)
            assert got.untyped_storage().data_ptr() == acc.untyped_storage().data_ptr()
            assert got.data_ptr() == acc.data_ptr() + chunk * 4 and got.numel() == stop - start
    finally:
        dist.destroy_process_group()
