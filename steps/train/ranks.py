"""The few distributed helpers the training modules share: one process (no process group) reads
as rank 0 of a world of one."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def is_main() -> bool:
    """Rank 0, or the only process."""
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """This process's RNG state as bytes (CPU, and CUDA when there is one)."""
    state = {"cpu": torch.get_rng_state().numpy().tobytes()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().numpy().tobytes()
    return state


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def reduce_int(value: int, op: Any = None) -> int:
    """`value` reduced over every rank (`op`: dist.ReduceOp, SUM by default), on the group's
    device (CUDA for nccl); `value` itself with no process group."""
    if not dist.is_initialized():
        return int(value)
    flag = torch.tensor([int(value)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=op if op is not None else dist.ReduceOp.SUM)
    return int(flag.item())
