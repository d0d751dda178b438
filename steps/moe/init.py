"""Initialization by parameter name and seed, one shard at a time.

Every value of a parameter is a function of the seed, the parameter's fully qualified name (FQN)
and its global shape, never of the mesh: a model built on `meta`, sharded, then materialized with
`to_empty` gets the same initial weights on 1 rank or 792, and no rank draws more than the rows
its own shard overlaps (the 535B model is never whole anywhere).

The scheme. A parameter's dim 0 is cut into blocks of `rows_per_block(shape)` rows, about
`BLOCK_VALUES` values each (one expert of a [E, F, D] weight is one block whenever F x D exceeds
it; 535B: one block per expert, 9.4M values). Block b is drawn on the CPU as standard normals from
a `torch.Generator` seeded with the first 8 bytes of sha256("{seed}/{fqn}/{b}"), then scaled by
the parameter's standard deviation. A rank draws only the blocks its shard's rows overlap and
copies its slice (all dims) to its device: the CPU draw makes a GPU run start from the very
values a CPU test checks. 1-D parameters (norm gains) are ones; the rule that maps an FQN to its
standard deviation belongs to the model (`MoETransformer.init_std`).

The shard's place in the global tensor comes from DTensor's own layout rule
(`compute_local_shape_and_global_offset`, which DCP also uses to write checkpoints), so plain
FSDP2 `Shard(0)`, HSDP and expert parameters that are `Shard(0)` over `ep` then FSDP-sharded over
`efsdp` (`_StridedShard`) all land right.
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

BLOCK_VALUES = 1 << 20  # values drawn per block (4 MiB in fp32)
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_fqn(name: str) -> str:
    """The FQN a checkpoint keys a parameter by: wrapper modules' names removed."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def block_seed(seed: int, fqn: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}/{fqn}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def rows_per_block(shape: tuple[int, ...]) -> int:
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    return max(1, BLOCK_VALUES // max(row, 1))


def local_part(p: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """This rank's values of `p` (a view to write into) and their offset in the global tensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = p.to_local()
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        if tuple(local.shape) != tuple(shape):
            raise RuntimeError(f"a shard of shape {tuple(local.shape)} where its layout says {tuple(shape)}")
        return local, tuple(offset)
    return p, (0,) * p.dim()


def global_blocks(fqn: str, shape: tuple[int, ...], seed: int, std: float, rows: tuple[int, int]
                  ) -> Iterator[tuple[int, Tensor]]:
    """(first row, values) of each block of the full tensor that overlaps rows [lo, hi)."""
    per = rows_per_block(shape)
    lo, hi = rows
    for b in range(lo // per, (hi - 1) // per + 1):
        first = b * per
        n = min(per, shape[0] - first)
        gen = torch.Generator().manual_seed(block_seed(seed, fqn, b))
        yield first, torch.randn((n, *shape[1:]), generator=gen, dtype=torch.float32).mul_(std)


@torch.no_grad()
def fill_normal(p: Tensor, fqn: str, seed: int, std: float) -> None:
    """Write N(0, std) values into this rank's shard of `p`, the same values whatever the mesh."""
    local, offset = local_part(p)
    if local.numel() == 0:
        return
    shape = tuple(p.shape)
    lo, hi = offset[0], offset[0] + local.shape[0]
    inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], local.shape[1:]))
    for first, block in global_blocks(fqn, shape, seed, std, (lo, hi)):
        a, b = max(lo, first), min(hi, first + block.shape[0])
        local[a - lo:b - lo].copy_(block[(slice(a - first, b - first), *inner)], non_blocking=True)


@torch.no_grad()
def init_by_name(model: nn.Module, seed: int, std_of: Callable[[str, tuple[int, ...]], float | None]) -> None:
    """Initialize every parameter of `model` (plain or sharded, on any device) by its clean FQN:
    `std_of(fqn, global shape)` is the standard deviation, or None for ones."""
    for name, p in model.named_parameters():
        fqn = clean_fqn(name)
        std = std_of(fqn, tuple(p.shape))
        if std is None:
            local_part(p)[0].fill_(1.0)
        else:
            fill_normal(p, fqn, seed, std)
