"""The rank capacity of the expert-parallel dispatch, on 2 gloo processes:
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
    """Each expert takes at most ceil(f N / E) slots, the first in token order;
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


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """The capped dispatch on 2 gloo processes (tests/kits/capkit.py capped_modes): every case
    under every checkpointing mode, each rank's results."""
    from kits.capkit import capped_modes

    out = tmp_path_factory.mktemp("capped")
    spawn(capped_modes, (str(out),), 2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def _reference(rank_f: float, expert_f: float, bias: str):
    """One process, the experts local, on the two ranks' micro-batches laid end to end."""
    from kits.capkit import capped_block, capped_input
    from steps.moe.expert_parallel import take_dropped_layers
    from steps.moe.model import rope_tables

    cfg = PRESETS["tiny"]
    block = capped_block(cfg, 0.0, expert_f, bias, 2)
    x = torch.cat([capped_input(0), capped_input(1)]).requires_grad_(True)
    cos, sin = rope_tables(x.shape[1], cfg.head_dim, cfg.rope_theta, "cpu")
    y, loss = block(x, cos, sin)
    (y.square().sum() + loss).backward()
    return y.detach(), x.grad, {n: p.grad for n, p in block.named_parameters()}, take_dropped_layers([block.moe])


def _close(a, b):
    """Equal up to float summation order: within 2e-6 of the reference's largest magnitude (the
    ranks sum a gradient's token contributions in two parts, one process in one)."""
    return bool((a - b).abs().max() <= 2e-6 * b.abs().max().clamp_min(1))


def test_expert_parallel_per_expert_capacity_is_one_process_on_the_whole_batch(capped):
    """The per-expert cut under expert parallelism keeps the first ceil(f P N / E) slots
    of each expert in (rank, token) order, so, with no rank bound reached, 2 ranks compute what
    one process computes on their micro-batches end to end: outputs, input gradients, each rank's
    expert-weight gradients (its slice), the other gradients summed over ranks, and the drops."""
    from kits.capkit import CAPPED_CASES

    e = PRESETS["tiny"].n_experts // 2  # experts a rank holds
    for name, rank_f, expert_f, bias in CAPPED_CASES[:2]:
        y, dx, grads, drops = _reference(rank_f, expert_f, bias)
        routed, dropped = drops[0].tolist()
        assert routed == y.shape[0] * y.shape[1] * PRESETS["tiny"].top_k and 0 < dropped < routed  # the cut binds
        got = [r[name, None] for r in capped]
        assert sum(g["drops"] for g in got).tolist() == drops.tolist()
        half = y.shape[0] // 2
        for rank, g in enumerate(got):
            assert _close(g["y"], y[rank * half:(rank + 1) * half]) and _close(g["dx"], dx[rank * half:(rank + 1) * half])
        for n, ref in grads.items():
            if n.endswith(("_EFD", "_EDF")):
                assert all(_close(g["grads"][n], ref[rank * e:(rank + 1) * e]) for rank, g in enumerate(got)), n
            else:
                assert _close(got[0]["grads"][n] + got[1]["grads"][n], ref), n


def test_expert_parallel_capacity_is_the_same_under_checkpointing(capped):
    """Outputs, gradients and per-layer drop counts bitwise equal under none, selective and full
    checkpointing for the per-expert cut and for both cuts with the rank one binding; the
    recompute counts nothing twice; one host read (the split sizes) a block and pass: one with
    the activations kept, two when the block is recomputed."""
    from kits.capkit import CAPPED_CASES, capped_modes_of

    for name, *_ in CAPPED_CASES:
        for r in capped:
            base = r[name, None]
            assert base["reads"] == 1, (name, base["reads"])
            for mode in capped_modes_of(name)[1:]:
                again = r[name, mode]
                assert torch.equal(again["y"], base["y"]) and torch.equal(again["dx"], base["dx"]), (name, mode)
                assert all(torch.equal(again["grads"][n], g) for n, g in base["grads"].items()), (name, mode)
                assert torch.equal(again["drops"], base["drops"]) and again["received"] == base["received"]
                assert again["reads"] == 2, (name, mode, again["reads"])
    # a rank bound the routing never reaches changes no bit of the per-expert cut
    for r in capped:
        assert torch.equal(r["both", None]["y"], r["expert", None]["y"])
        assert torch.equal(r["both", None]["drops"], r["expert", None]["drops"])
    # the rank bound binding: rank 0 takes at most ceil(1.0 N) rows, the senders drop the rest
    from kits.capkit import CAPPED_SHAPE

    N = CAPPED_SHAPE[0] * CAPPED_SHAPE[1] * PRESETS["tiny"].top_k  # slots a rank sends
    assert capped[0]["rank", None]["received"] <= math.ceil(1.0 * N) < 2 * N
    assert capped[1]["rank", None]["received"] == 0
    routed, dropped = sum(r["rank", None]["drops"] for r in capped)[0].tolist()
    assert routed == 2 * N and dropped == 2 * N - capped[0]["rank", None]["received"]
