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


# (name, rank_capacity_factor, expert_capacity_factor, router bias) of the checkpointing test:
# "expert" cuts per expert only; "both" adds a rank bound the routing never reaches (so it is
# "expert" again: run without checkpointing only); "rank" sends every token to rank 0's experts,
# where the rank bound cuts.
CAPPED_CASES = (("expert", 0.0, 1.0, "slope"), ("both", 10.0, 1.0, "slope"), ("rank", 1.0, 2.0, "rank0"))
CAPPED_MODES = (None, "selective", "full")


def capped_modes_of(name: str) -> tuple:
    return (None,) if name == "both" else CAPPED_MODES
CAPPED_SHAPE = (2, 12)  # a rank's micro-batch: sequences, tokens


def capped_block(cfg, rank_f: float, expert_f: float, bias: str, world: int):
    """The tiny block of the checkpointing test, the same weights in every process (the expert
    weights whole: shard them for expert parallelism)."""
    import torch

    from steps.moe.model import Block

    cfg = dataclasses.replace(cfg, rank_capacity_factor=rank_f, expert_capacity_factor=expert_f)
    torch.manual_seed(0)
    block = Block(cfg, 1)
    for p in block.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    with torch.no_grad():
        if bias == "slope":  # the first experts favoured: they overflow a per-expert bound
            block.moe.expert_bias_E.copy_(0.5 * torch.linspace(1, -1, cfg.n_experts))
        else:  # every token to the experts of rank 0
            block.moe.expert_bias_E.zero_()
            block.moe.expert_bias_E[:cfg.n_experts // world] = 100.0
    return block


def capped_input(rank: int):
    import torch

    from steps.moe.config import PRESETS

    return torch.randn(*CAPPED_SHAPE, PRESETS["tiny"].dim, generator=torch.Generator().manual_seed(100 + rank))


def capped_modes(out: str) -> None:
    """On each rank (ep = world): the tiny block through the capped dispatch, for each case and
    checkpointing mode one forward and backward; writes the output, input and parameter gradients
    (this rank's expert shards), the per-layer drop counts, the rows received and the host reads
    (Tensor.tolist / item calls) of the forward and backward."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from steps.moe.config import PRESETS
    from steps.moe.expert_parallel import shard_experts, take_dropped_layers
    from steps.moe.model import rope_tables
    from steps.train.recompute import context_fn

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    cfg = PRESETS["tiny"]
    cos, sin = rope_tables(CAPPED_SHAPE[1], cfg.head_dim, cfg.rope_theta, "cpu")
    reads = [0]
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item

    def tolist(t):
        reads[0] += 1
        return real_tolist(t)

    def item(t):
        reads[0] += 1
        return real_item(t)

    seen = {}
    for name, rank_f, expert_f, bias in CAPPED_CASES:
        for mode in capped_modes_of(name):
            block = capped_block(cfg, rank_f, expert_f, bias, world)
            shard_experts(block.moe, mesh)
            block.recompute = context_fn(mode) if mode else None
            x = capped_input(rank).requires_grad_(True)
            reads[0] = 0
            torch.Tensor.tolist, torch.Tensor.item = tolist, item
            try:
                y, loss = block(x, cos, sin)
                (y.square().sum() + loss / world).backward()  # the router loss is a mean over the group's tokens
            finally:
                torch.Tensor.tolist, torch.Tensor.item = real_tolist, real_item
            grads = {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                     for n, p in block.named_parameters()}
            seen[name, mode] = {"y": y.detach(), "dx": x.grad, "grads": grads,
                                "drops": take_dropped_layers([block.moe]), "received": block.moe.experts.received,
                                "reads": reads[0]}
    torch.save(seen, f"{out}/rank{rank}.pt")


# (name, rank_capacity_factor, expert_capacity_factor, router bias) of the router-side test:
# dropless, the per-expert cut binding, the rank cut binding.
SIDE_CASES = (("free", 0.0, 0.0, "slope"), ("expert", 0.0, 1.0, "slope"), ("rank", 1.0, 2.0, "rank0"))


def side_block(on_experts: bool, rank_f: float, expert_f: float, bias: str, world: int):
    """The block of the router-side test: no z-loss, so the router's gradient comes only through
    the router weights."""
    from steps.moe.config import PRESETS

    cfg = dataclasses.replace(PRESETS["tiny"], router_weights_on_experts=on_experts, z_loss_coef=0.0)
    return capped_block(cfg, rank_f, expert_f, bias, world)


class CombineCount:
    """Counts the combine all-to-alls (steps/moe/expert_parallel.py expert_combine) that reach the
    dispatcher, by whether they send (`again` False) or not (a recompute): the outermost mode, so
    a collective selective checkpointing serves from its store is not counted."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counts = self.counts = {"sent": 0, "skipped": 0}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if "expert_combine" in str(func):
                    counts["skipped" if args[4] else "sent"] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def router_side(out: str) -> None:
    """On each rank (ep = world): the tiny block with the router weights applied on the expert
    side and after the combine, each case and checkpointing mode one forward and backward; writes
    the output, the input and parameter gradients (this rank's expert shards) and the combine
    all-to-alls sent and skipped."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from steps.moe.config import PRESETS
    from steps.moe.expert_parallel import shard_experts, take_dropped_layers
    from steps.moe.model import rope_tables
    from steps.train.recompute import context_fn

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    cfg = PRESETS["tiny"]
    cos, sin = rope_tables(CAPPED_SHAPE[1], cfg.head_dim, cfg.rope_theta, "cpu")
    seen = {}
    for name, rank_f, expert_f, bias in SIDE_CASES:
        for on in (True, False):
            for mode in CAPPED_MODES:
                block = side_block(on, rank_f, expert_f, bias, world)
                shard_experts(block.moe, mesh)
                block.recompute = context_fn(mode) if mode else None
                x = capped_input(rank).requires_grad_(True)
                count = CombineCount()
                with count.mode:
                    y, loss = block(x, cos, sin)
                    (y.square().sum() + loss / world).backward()
                grads = {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                         for n, p in block.named_parameters()}
                seen[name, on, mode] = {"y": y.detach(), "dx": x.grad, "grads": grads,
                                        "drops": take_dropped_layers([block.moe]), "combines": dict(count.counts)}
    torch.save(seen, f"{out}/rank{rank}.pt")
