"""Activation checkpointing per block: what a block keeps from its forward for the backward.

- `none`: everything autograd saves (the fastest, the most memory).
- `full`: a block keeps only its input; its whole forward runs again in the backward (one more
  forward of compute, all-to-alls included; the least memory).
- `selective`: a block keeps the outputs of its costly ops and recomputes the cheap ones. Saved:
  matrix products (`mm`, `addmm`, `_grouped_mm`: q, k, v, the router logits, the gate and up
  projections of the shared and routed experts), attention (`scaled_dot_product_*`) and the
  expert-parallel dispatch all-to-alls (so a recomputed block never sends its tokens again; the
  combine, `steps.moe.expert_parallel.expert_combine`, is neither kept nor sent again: with the
  router weights applied on the expert side no backward reads its output). Recomputed:
  norms, rotary embedding, SiLU and products, the router's top-k, token copies into the
  expert-sorted buffer, and the output projections (attention's wo, the w2 of the shared and
  routed experts, marked by `steps.moe.model.output_projection`): their outputs only feed a sum,
  so keeping them would cost D values per token-slot for one more matmul (about 0.7% of a
  block's forward at 535B) in the backward.

The block's forward runs inside `torch.utils.checkpoint.checkpoint(use_reentrant=False)`
(`Block.recompute` holds the context function), inside its FSDP2 unit, so the unit's parameters
are gathered once for both the recompute and the backward. Expert loads are counted only in the
first pass (steps/moe/model.py).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

MODES = ("none", "selective", "full")


def _saved_ops() -> set:
    ops = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten._grouped_mm.default,
           torch.ops.aten._scaled_dot_product_efficient_attention.default,
           torch.ops.aten._scaled_dot_product_flash_attention.default,
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops._c10d_functional.all_to_all_single.default}
    for name in ("_scaled_dot_product_cudnn_attention", ):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            ops.add(op.default)
    autograd_a2a = getattr(getattr(torch.ops, "_c10d_functional_autograd", None), "all_to_all_single", None)
    if autograd_a2a is not None:
        ops.add(autograd_a2a.default)
    return ops


def selective_policy(saved: frozenset) -> Callable:
    from torch.utils.checkpoint import CheckpointPolicy

    from steps.moe.model import MARKS

    def policy(ctx, op, *args, **kwargs):
        keep = op in saved and not MARKS.output_projection
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def context_fn(mode: str) -> Callable | None:
    """The `context_fn` a block's checkpoint runs with, or None for no checkpointing."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts, noop_context_fn

    if mode == "none":
        return None
    if mode == "full":
        return noop_context_fn
    if mode == "selective":
        return functools.partial(create_selective_checkpoint_contexts, selective_policy(frozenset(_saved_ops())))
    raise ValueError(f"activation checkpointing must be one of {MODES}, got {mode!r}")


def apply_checkpointing(model: nn.Module, mode: str) -> None:
    """Set every block of `model` to recompute per `mode` (no wrapper modules: FQNs unchanged)."""
    fn = context_fn(mode)
    for block in model.blocks:
        block.recompute = fn
