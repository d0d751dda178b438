"""The router weights applied on the expert side, right after w2 (MoEConfig.router_weights_on_experts),
against the older formulation (applied after the combine): the same outputs and gradients, the
router's included (no z-loss here: its gradient comes only through the weights), dropped slots
still contributing nothing; bitwise the same under every checkpointing mode; and the combine's
output neither kept nor sent again by a recompute."""

import pytest
import torch

from kits.capkit import CAPPED_MODES, SIDE_CASES, CombineCount, capped_input, side_block
from steps.moe.config import PRESETS
from steps.moe.model import rope_tables
from steps.train.recompute import context_fn


def _run(on: bool, rank_f: float, expert_f: float, bias: str, mode, x_parts=(0,)):
    """One process, the experts local: output, input and parameter gradients, drops."""
    from steps.moe.expert_parallel import take_dropped_layers

    cfg = PRESETS["tiny"]
    block = side_block(on, rank_f, expert_f, bias, 2)
    block.recompute = context_fn(mode) if mode else None
    x = torch.cat([capped_input(r) for r in x_parts]).requires_grad_(True)
    cos, sin = rope_tables(x.shape[1], cfg.head_dim, cfg.rope_theta, "cpu")
    y, loss = block(x, cos, sin)
    (y.square().sum() + loss).backward()
    return {"y": y.detach(), "dx": x.grad, "grads": {n: p.grad.clone() for n, p in block.named_parameters()},
            "drops": take_dropped_layers([block.moe])}


def _close(a, b):
    """The existing tolerance of the expert-parallel tables (test_moe_capacity.py): within 2e-6
    of the reference's largest magnitude."""
    return bool((a - b).abs().max() <= 2e-6 * b.abs().max().clamp_min(1))


@pytest.mark.parametrize("case", SIDE_CASES[:2], ids=lambda c: c[0])
def test_local_experts_weights_after_w2_equal_the_older_formulation(case):
    name, rank_f, expert_f, bias = case
    new = _run(True, rank_f, expert_f, bias, None)
    old = _run(False, rank_f, expert_f, bias, None)
    routed, dropped = new["drops"][0].tolist()
    assert dropped == 0 if name == "free" else 0 < dropped < routed  # the per-expert cut binds
    assert torch.equal(new["drops"], old["drops"])
    assert _close(new["y"], old["y"]) and _close(new["dx"], old["dx"])
    for n, g in old["grads"].items():
        assert _close(new["grads"][n], g), n
    router = new["grads"]["moe.router.weight"]
    assert router.abs().max() > 0  # the router learns through its weights alone (no z-loss)
    for mode in CAPPED_MODES[1:]:  # bitwise under recomputation
        again = _run(True, rank_f, expert_f, bias, mode)
        assert torch.equal(again["y"], new["y"]) and torch.equal(again["dx"], new["dx"]), mode
        assert all(torch.equal(again["grads"][n], g) for n, g in new["grads"].items()), mode


@pytest.fixture(scope="module")
def side(tmp_path_factory):
    from kits.capkit import router_side
    from steps.train.launch import spawn

    out = tmp_path_factory.mktemp("side")
    spawn(router_side, (str(out),), 2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.slow_tier  # 2 gloo processes, 18 forward and backward passes each
def test_expert_parallel_weights_after_w2_equal_the_older_formulation(side):
    """2 ranks, every case: the new formulation within the existing tolerance of the old one
    (outputs, input gradients, every parameter gradient, the router's included) and of one
    process on the two micro-batches end to end where no rank bound cuts; bitwise across
    checkpointing modes; the combine sent once a pass, never again by a recompute (the older
    formulation keeps its output and does not go through it)."""
    for name, rank_f, expert_f, bias in SIDE_CASES:
        for r in side:
            new, old = r[name, True, None], r[name, False, None]
            assert torch.equal(new["drops"], old["drops"]), name
            assert _close(new["y"], old["y"]) and _close(new["dx"], old["dx"]), name
            assert all(_close(new["grads"][n], g) for n, g in old["grads"].items()), name
            for mode in CAPPED_MODES:
                again = r[name, True, mode]
                assert torch.equal(again["y"], new["y"]) and torch.equal(again["dx"], new["dx"]), (name, mode)
                assert all(torch.equal(again["grads"][n], g) for n, g in new["grads"].items()), (name, mode)
                assert again["combines"] == {"sent": 1, "skipped": 0 if mode is None else 1}, (name, mode)
                assert r[name, False, mode]["combines"] == {"sent": 0, "skipped": 0}
        drops = sum(r[name, True, None]["drops"] for r in side)[0].tolist()
        assert (drops[1] > 0) == (name != "free"), (name, drops)
        if name == "rank":
            continue  # the rank bound has no one-process counterpart
        one = _run(False, rank_f, expert_f, bias, None, x_parts=(0, 1))  # the older formulation, one process
        half = one["y"].shape[0] // 2
        e = PRESETS["tiny"].n_experts // 2
        for rank, r in enumerate(side):
            got = r[name, True, None]
            assert _close(got["y"], one["y"][rank * half:(rank + 1) * half]), name
            assert _close(got["dx"], one["dx"][rank * half:(rank + 1) * half]), name
        for n, ref in one["grads"].items():
            if n.endswith(("_EFD", "_EDF")):
                assert all(_close(r[name, True, None]["grads"][n], ref[k * e:(k + 1) * e]) for k, r in enumerate(side)), n
            else:
                assert _close(side[0][name, True, None]["grads"][n] + side[1][name, True, None]["grads"][n], ref), n


def test_the_recompute_skips_the_combine_on_a_one_rank_group():
    """In process (a 1-rank gloo group): with the weights on the expert side, full and selective
    recomputes go through the combine without sending; the same numbers as without recompute."""
    import torch.distributed as dist

    from steps.moe.expert_parallel import AllToAllExperts

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        seen = {}
        for mode in CAPPED_MODES:
            block = side_block(True, 0.0, 0.0, "slope", 1)
            block.moe.experts = AllToAllExperts(dist.group.WORLD, block.moe.cfg.n_experts)
            block.recompute = context_fn(mode) if mode else None
            x = capped_input(0).requires_grad_(True)
            cos, sin = rope_tables(x.shape[1], block.moe.cfg.head_dim, block.moe.cfg.rope_theta, "cpu")
            count = CombineCount()
            with count.mode:
                y, _ = block(x, cos, sin)
                y.square().sum().backward()
            seen[mode] = (y.detach(), x.grad, block.moe.router.weight.grad.clone(), count.counts)
    finally:
        dist.destroy_process_group()
    base = seen[None]
    assert base[3] == {"sent": 1, "skipped": 0} and base[2].abs().max() > 0
    for mode in CAPPED_MODES[1:]:
        y, dx, router, counts = seen[mode]
        assert counts == {"sent": 1, "skipped": 1}, mode
        assert torch.equal(y, base[0]) and torch.equal(dx, base[1]) and torch.equal(router, base[2]), mode
