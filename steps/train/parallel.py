"""How the model is spread over workers, and at what precision: small components picked once by
config, so the training loop has no branches on either.

- `Single`: one process, no torch.distributed.
- `DDP`: torch DistributedDataParallel; buffers are not broadcast (each rank keeps its own
  expert loads until the bias update all-reduces them), gradient sync skipped on all but the last
  micro-batch.
- `FSDP`: FSDP2 (`fully_shard`) per block and at the root, on a 1-D mesh of all workers; with
  bf16 its mixed-precision policy computes in bf16 (parameters gathered in bf16, gradients
  reduced in fp32, fp32 master weights and optimizer state).

Precision: bf16 on the GPU, fp32 on the CPU. bf16 always goes through FSDP2's policy (a 1-rank
process group when there is one worker), never through torch.autocast: autocast casts the matmul
inside the model's fp32 router-logits function to bf16 and its backward then fails on mixed
dtypes, while a module whose parameters are bf16 runs the router in fp32 as designed.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn


class Single:
    """No data parallelism: the model as it is."""

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def sync(self, model: nn.Module, last: bool) -> Iterator[None]:
        yield


class DDP:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def sync(self, model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else model.no_sync()


class FSDP:
    def __init__(self, device: torch.device, bf16: bool) -> None:
        self.device, self.bf16 = device, bf16

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16
                  else MixedPrecisionPolicy())
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model

    @contextlib.contextmanager
    def sync(self, model: nn.Module, last: bool) -> Iterator[None]:
        model.set_requires_gradient_sync(last)
        yield


def build_parallel(kind: str, device: torch.device, precision: str) -> Single | DDP | FSDP:
    """The wrapper for this run: FSDP2 whenever bf16 is asked for (or `kind` is fsdp with
    several workers), DDP with several workers, else none."""
    if precision == "bf16":
        if not dist.is_initialized():  # one worker: a process group of one, for FSDP2's mesh
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return FSDP(device, bf16=True)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Single()
    return DDP(device) if kind == "ddp" else FSDP(device, bf16=False)


def pick_precision(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return choice


def unwrap(model: nn.Module) -> nn.Module:
    """The MoETransformer inside a DDP wrapper (FSDP2 shards in place and wraps nothing)."""
    return getattr(model, "module", model)


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return torch.device("cpu")
