"""The worker of the capacity test (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import dataclasses


def skewed_moe(out: str, factors: tuple[float, ...]) -> None:
    """On each rank of the group (ep = world): the tiny MoE with every token routed to the
    experts of rank 0, one forward and backward per capacity factor; writes what each rank saw."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from steps.moe.config import PRESETS
    from steps.moe.expert_parallel import shard_experts, take_dropped
    from steps.moe.model import MoE

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    x = torch.randn(2, 24, PRESETS["tiny"].dim, generator=torch.Generator().manual_seed(rank))
    seen = {}
    for factor in factors:
        torch.manual_seed(0)
        moe = MoE(dataclasses.replace(PRESETS["tiny"], rank_capacity_factor=factor))
        for p in moe.parameters():
            torch.nn.init.normal_(p, std=0.1)
        with torch.no_grad():
            moe.expert_bias_E.zero_()
            moe.expert_bias_E[:moe.cfg.n_experts // world] = 100.0  # every token picks rank 0's experts
            moe.routed_slots.zero_()
            moe.dropped_slots.zero_()
        shard_experts(moe, mesh)
        xi = x.clone().requires_grad_(True)
        y, _ = moe(xi)
        y.square().sum().backward()
        routed, dropped = take_dropped([moe]).tolist()
        seen[factor] = {"y": y.detach(), "dx": xi.grad, "received": moe.experts.received,
                        "routed": routed, "dropped": dropped}
    torch.save(seen, f"{out}/rank{rank}.pt")
