"""The rank capacity of the expert-parallel dispatch (issue 22 item 2), on 2 gloo processes:
every token routed to one rank's experts. Unbounded, that rank takes 2N rows (one rank can take
P*N); bounded at 1.25x the mean, it takes at most ceil(1.25 N), the rest is dropped and counted,
tokens whose slots were all kept come out as they would dropless, and a bound the routing does
not reach changes no bit."""

import math
import os
import sys

import pytest
import torch

from kits.capkit import skewed_moe  # noqa: E402

from steps.moe.config import PRESETS  # noqa: E402
from steps.train.launch import spawn  # noqa: E402


def test_all_tokens_to_one_expert_group_stay_within_the_bound_and_drops_are_counted(tmp_path):
    spawn(skewed_moe, (str(tmp_path), (0.0, 1.25, 10.0)), 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    N = 2 * 24 * PRESETS["tiny"].top_k  # slots a rank sends
    free, bound, loose = (0.0, 1.25, 10.0)
    # dropless: rank 0 takes every slot of both ranks, rank 1 none
    assert [r[free]["received"] for r in ranks] == [2 * N, 0]
    assert all(r[free]["dropped"] == 0 and r[free]["routed"] == 0 for r in ranks)  # counted only when bounded
    # bounded: within ceil(1.25 N) rows, the rest dropped, counted by the senders
    cap = math.ceil(1.25 * N)
    assert N < ranks[0][bound]["received"] <= cap and ranks[1][bound]["received"] == 0
    assert [r[bound]["routed"] for r in ranks] == [N, N]
    dropped = sum(r[bound]["dropped"] for r in ranks)
    assert dropped == 2 * N - ranks[0][bound]["received"] and dropped >= 2 * N - cap
    for r in ranks:
        y, ref = r[bound]["y"].flatten(0, 1), r[free]["y"].flatten(0, 1)
        same = (y == ref).all(-1)
        assert 0 < same.sum() < len(same)  # the first tokens keep their experts, the last lose some
        # the drops are the last tokens of each expert's group: a token that lost one comes after
        # every token that lost none
        assert not same[int(torch.nonzero(~same)[0]):].all()
        assert torch.isfinite(r[bound]["dx"]).all()
    # a bound the routing never reaches: bitwise the dropless result, gradients included
    for r in ranks:
        assert r[loose]["received"] == r[free]["received"] and r[loose]["dropped"] == 0
        assert torch.equal(r[loose]["y"], r[free]["y"]) and torch.equal(r[loose]["dx"], r[free]["dx"])


def _expert_bounded(factor: float, bias: float = 0.0, mode: str | None = None, seed: int = 0):
    """One tiny block (local experts) at a per-expert capacity factor: output, input gradient,
    weight gradients and the counted slots."""
    import dataclasses as dc

    from steps.moe.model import Block, rope_tables
    from steps.train.recompute import context_fn

    cfg = dc.replace(PRESETS["tiny"], expert_capacity_factor=factor)
    torch.manual_seed(seed)
    block = Block(cfg, 1)
    for p in block.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    with torch.no_grad():
        block.moe.expert_bias_E.copy_(bias * torch.linspace(1, -1, cfg.n_experts))
    block.recompute = context_fn(mode) if mode else None
    x = torch.randn(2, 24, cfg.dim, generator=torch.Generator().manual_seed(seed + 1), requires_grad=True)
    cos, sin = rope_tables(24, cfg.head_dim, cfg.rope_theta, "cpu")
    y, loss = block(x, cos, sin)
    (y.square().sum() + loss).backward()
    grads = {n: p.grad.clone() for n, p in block.named_parameters()}
    return y.detach(), x.grad, grads, int(block.moe.routed_slots), int(block.moe.dropped_slots)


def test_per_expert_capacity_drops_the_last_slots_and_counts_them():
    """Issue 31 item 4: each expert takes at most ceil(f N / E) slots, the first in token order;
    the rest are dropped and counted per layer; a bound never reached changes no bit."""
    free = _expert_bounded(0.0, bias=0.5)
    loose = _expert_bounded(100.0, bias=0.5)
    tight = _expert_bounded(1.0, bias=0.5)  # a skewed router: the favoured experts overflow
    N = 2 * 24 * PRESETS["tiny"].top_k
    assert free[3:] == (0, 0)  # not counted without a bound
    assert loose[3:] == (N, 0) and torch.equal(loose[0], free[0]) and torch.equal(loose[1], free[1])
    assert all(torch.equal(loose[2][n], free[2][n]) for n in free[2])
    routed, dropped = tight[3:]
    assert routed == N and 0 < dropped < N
    same = (tight[0] == free[0]).all(-1).flatten()
    assert 0 < same.sum() < len(same)  # the first tokens keep their experts, later ones lose some
    assert not same[int(torch.nonzero(~same)[0]):].all()
    assert torch.isfinite(tight[1]).all()


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_per_expert_capacity_is_the_same_under_checkpointing(mode):
    """Outputs, gradients and counts equal with and without recomputation (the recompute counts
    nothing twice)."""
    base = _expert_bounded(1.0, bias=0.5)
    again = _expert_bounded(1.0, bias=0.5, mode=mode)
    assert torch.equal(base[0], again[0]) and torch.equal(base[1], again[1])
    assert all(torch.allclose(base[2][n], again[2][n], rtol=0, atol=0) for n in base[2])
    assert base[3:] == again[3:]
