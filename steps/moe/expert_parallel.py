"""Expert parallelism: the routed experts spread over an `ep` group, tokens sent to them with a
dropless all-to-all.

Shape legend: T tokens on this rank, K experts per token, N = T*K token-expert slots, D model
width, E routed experts, P ranks of the ep group, e = E/P experts per rank, R rows received from
the group, Q rows of the received buffer after each local expert's padding.

Rank p of the group holds experts p*e .. p*e+e-1 (whole experts, `Shard(0)` over `ep`). One MoE
forward on every rank of the group:

1. route locally (the fused router on CUDA), sort the N slots by expert (stable: a token's order
   within an expert is kept), copy each token to its K slots of the send buffer: since experts
   are numbered rank by rank, the buffer is already grouped by destination rank;
2. exchange per-expert counts with one `all_to_all_single` ([P, e] each way) and move the split
   sizes, sent and received together, to the host (the one device-to-host sync of a block);
3. send the tokens with a second `all_to_all_single` of variable splits (autograd: its backward
   is the reverse all-to-all);
4. regroup the received rows (source rank major) by local expert, each group padded to
   `expert_align`, run the three grouped GEMMs on the local expert weights, gather the rows back;
5. scale each row by its router weight right after w2, on the expert side (the weights are sent
   with the tokens in step 3: a second all-to-all of one fp32 value a row, whose backward returns
   their gradients), so that the backward never reads the combine's output: no checkpointing
   mode keeps it (N*D bf16 a block, about 18 GiB at 535B under selective checkpointing), and a
   recompute does not send it again (`MoEConfig.router_weights_on_experts`; False: the weights
   applied after the combine, as torchtitan does, kept for comparison);
6. return every row to the rank it came from with the reverse all-to-all, and compute the shared
   experts while it is in flight (the collective is issued asynchronously and waited for only
   when its rows are read, as torchtitan overlaps them); then un-sort, sum each token's K rows
   in a fixed order, and add the shared experts' output.

Capacity (`MoEConfig.rank_capacity_factor`, f > 0): dropless up to f times the mean rows a rank
receives (every rank sends N slots, so the mean is N), bounded past it. Step 2 then all-gathers
every rank's per-expert counts ([P, E] from each, P*E integers) instead of exchanging them, so
every rank takes the same decision from the same numbers: a rank offered R > C = ceil(f*N)
rows keeps floor(count * C / R) of each (source, expert) group (at most C in all), and the
sender drops the rest of each group from its end (the last tokens of the micro-batch, as a
capacity factor does). A dropped slot's output is zero: its token keeps its other experts and
the shared experts. The buffers are then at most C rows; the drops are counted on the sending
rank (`MoE.dropped_slots`, `take_dropped`) and reported in the metrics. f = 0: unbounded, the
buffers as large as the routing makes them (one rank can receive P*N rows).

Per-expert capacity (`MoEConfig.expert_capacity_factor`, f > 0; the anchor's 1.15): also on the
all-gathered counts, before the rank cut, each expert keeps its first ceil(f*P*N/E) slots in
(source rank, token) order, the group's micro-batches laid end to end: the same cut as
`LocalExperts` on that whole batch, so with the rank bound not reached the group computes what
one process computes on the concatenated batch (tests/steps/moe/test_moe_capacity.py).
The collectives are functional collectives (`torch.distributed._functional_collectives`), whose
outputs selective activation checkpointing can save, so a recomputed block does not send its
tokens again (steps/train/recompute.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from steps.moe.model import (
    MoE,
    _Dispatch,
    _Place,
    _recomputing,
    expert_capacity,
    expert_ffn,
    expert_layout,
    local_weight,
    weighted_sum,
)


@torch.library.custom_op("marin_voyage::expert_combine", mutates_args=())
def expert_combine(y_RD: Tensor, send: list[int], recv: list[int], group_name: str, again: bool) -> Tensor:
    """The combine all-to-all: every row back to the rank it came from (`send` rows come back,
    `recv` go out), issued and not waited for (torch.ops._c10d_functional.wait_tensor when its rows
    are read). One opaque op, so that selective checkpointing sees the same op sequence in the
    recompute as in the forward; `again` (the block recomputed in the backward) sends nothing and
    returns zeros of the shape, which is right where no backward reads the output: the router
    weights applied on the expert side. The backward returns the gradients with the reverse
    all-to-all."""
    if again:
        return y_RD.new_zeros(sum(send), y_RD.shape[1])
    return torch.ops._c10d_functional.all_to_all_single(y_RD.contiguous(), send, recv, group_name)


@expert_combine.register_fake
def _(y_RD, send, recv, group_name, again):
    return y_RD.new_empty(sum(send), y_RD.shape[1])


def _combine_setup(ctx, inputs, output):
    _y, ctx.send, ctx.recv, ctx.group_name, _again = inputs


def _combine_backward(ctx, dy_ND):
    dy_RD = torch.ops._c10d_functional.all_to_all_single(dy_ND.contiguous(), ctx.recv, ctx.send, ctx.group_name)
    return torch.ops._c10d_functional.wait_tensor(dy_RD), None, None, None, None


expert_combine.register_autograd(_combine_backward, setup_context=_combine_setup)


def _splits(sent_Pe: Tensor, got_Pe: Tensor) -> tuple[list[int], list[int]]:
    """Rows sent to and received from each rank, moved to the host in one sync (one a
    block and micro-batch, where there were two)."""
    both = torch.cat([sent_Pe.sum(1), got_Pe.sum(1)]).tolist()
    return both[:len(both) // 2], both[len(both) // 2:]


def all_gather_rows(x: Tensor, group) -> Tensor:
    """Every rank's `x` stacked along dim 0 (a functional collective; wait with wait_tensor).
    `all_gather_single` is torch 2.13's name; older torch (the H200 device's 2.11) lacks it, and
    this falls back to the op under it, `_c10d_functional.all_gather_into_tensor` (torch >= 2.2),
    not to a Python wrapper whose name also moved between versions."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as fc

    if hasattr(fc, "all_gather_single"):
        return fc.all_gather_single(x, 0, group)
    return torch.ops._c10d_functional.all_gather_into_tensor(x, dist.get_world_size(group), group.group_name)


class AllToAllExperts:
    """The routed-expert path of `MoE` when its expert weights are `Shard(0)` over `group`."""

    def __init__(self, group: torch.distributed.ProcessGroup, n_experts: int) -> None:
        import torch.distributed as dist

        self.group = group
        self.size = dist.get_world_size(group)
        if n_experts % self.size:
            raise ValueError(f"{n_experts} routed experts do not divide over an expert-parallel group of {self.size}")
        self.per_rank = n_experts // self.size

    def __call__(self, moe: MoE, x_TD: Tensor, w_TK: Tensor, idx_TK: Tensor, counts_E: Tensor,
                 beside=None) -> Tensor:
        from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd

        T, K = idx_TK.shape
        P, e = self.size, self.per_rank
        flat_N = idx_TK.reshape(-1)
        N = flat_N.numel()
        order_N = torch.argsort(flat_N, stable=True)
        pos_N = torch.empty_like(order_N)
        rank_f, expert_f = moe.cfg.rank_capacity_factor, moe.cfg.expert_capacity_factor
        on_experts = moe.cfg.router_weights_on_experts
        factor = rank_f or expert_f
        if factor:
            sent_Pe, got_Pe = self._bounded_counts(counts_E, math.ceil(rank_f * N) if rank_f else 0,
                                                   expert_capacity(expert_f, P * N, moe.cfg.n_experts))
            # keep the first `sent` slots of each expert's group (in token order), drop the rest
            start_E = torch.cumsum(counts_E, 0) - counts_E
            sorted_N = flat_N[order_N]
            kept_N = (torch.arange(N, device=flat_N.device) - start_E[sorted_N]) < sent_Pe.reshape(-1)[sorted_N]
            # the one host sync of the block: what is sent and received, read together (the plan's
            # trace answers it evenly)
            send, recv = _splits(sent_Pe, got_Pe)
            n_kept = sum(send)
            pos_N[order_N] = torch.where(kept_N, torch.cumsum(kept_N, 0) - 1, n_kept)  # dropped: a spare row
            x_ND = _Dispatch.apply(x_TD, pos_N.view(T, K), n_kept + 1)[:n_kept]
            # a dropped slot's weight lands on the spare row, cut off: not sent, no gradient
            w_N = _Place.apply(w_TK.reshape(-1), pos_N, n_kept + 1)[:n_kept] if on_experts else None
            if moe.training and not _recomputing():
                moe.routed_slots += N
                moe.dropped_slots += N - n_kept
        else:
            sent_Pe = counts_E.view(P, e)
            pos_N[order_N] = torch.arange(N, device=flat_N.device)  # slot -> row of the send buffer
            x_ND = _Dispatch.apply(x_TD, pos_N.view(T, K), N)
            w_N = _Place.apply(w_TK.reshape(-1), pos_N, N) if on_experts else None
            got_Pe = all_to_all_single(sent_Pe.contiguous(), None, None, group=self.group)
            got_Pe = torch.ops._c10d_functional.wait_tensor(got_Pe)
            send, recv = _splits(sent_Pe, got_Pe)
        self.received = sum(recv)  # rows this rank's experts took in its last forward
        x_RD = all_to_all_single_autograd(x_ND, recv, send, self.group)
        # the router weights travel with the tokens (fp32, one value a row; the backward sends their
        # gradients home), so the experts scale their rows after w2
        w_R = all_to_all_single_autograd(w_N, recv, send, self.group) if on_experts else None

        expert_R = torch.repeat_interleave(torch.arange(e, device=x_TD.device).repeat(P), got_Pe.reshape(-1),
                                           output_size=sum(recv))
        row_R, offs_e, n_rows = expert_layout(expert_R[:, None], got_Pe.sum(0), moe.cfg.expert_align)
        x_QD = _Dispatch.apply(x_RD, row_R[:, None], n_rows)
        w_Q = _Place.apply(w_R, row_R, n_rows) if on_experts else None
        y_QD = expert_ffn(x_QD, local_weight(moe.w1_EFD), local_weight(moe.w3_EFD), local_weight(moe.w2_EDF), offs_e,
                          w_Q)
        if on_experts:
            # No backward reads the combine's output (the weights were applied before it; a gather
            # and a sum need no values): selective checkpointing does not keep it, and a recompute
            # does not send the rows again (expert_combine)
            y_ND = expert_combine(y_QD[row_R], send, recv, self.group.group_name, _recomputing())
        else:  # kept for the weights' gradient (selective: as a collective's output)
            y_ND = all_to_all_single_autograd(y_QD[row_R], send, recv, self.group)  # issued, not waited for
        shared_TD = beside() if beside is not None else None  # overlaps the combine all-to-all
        if on_experts:
            y_ND = torch.ops._c10d_functional.wait_tensor(y_ND)
        if factor:  # a zero row for the dropped slots
            y_ND = torch.nn.functional.pad(y_ND, (0, 0, 0, 1))
        out_TD = weighted_sum(y_ND, pos_N.view(T, K), None if on_experts else w_TK)  # the wait
        return out_TD if shared_TD is None else out_TD + shared_TD


    def _bounded_counts(self, counts_E: Tensor, capacity: int, per_expert: int = 0) -> tuple[Tensor, Tensor]:
        """(what this rank sends to each rank's experts [P, e], what it receives from each rank
        for its experts [P, e]): every rank's counts all-gathered, and the same cuts computed
        everywhere. First the per-expert one (`per_expert` > 0): each expert keeps its first
        `per_expert` slots in (source rank, token) order, which is the order of the group's
        micro-batches laid end to end, so it cuts as LocalExperts does on that whole batch. Then
        the rank one (`capacity` > 0): no rank receives more than `capacity` rows, the
        floor(count * C / R) cut of what the first left."""
        import torch.distributed as dist

        P, e = self.size, self.per_rank
        every = all_gather_rows(counts_E.to(torch.int64).contiguous(), self.group)
        every_SDe = torch.ops._c10d_functional.wait_tensor(every).view(P, P, e)  # source, destination, expert
        if per_expert:
            every_SE = every_SDe.reshape(P, P * e)
            before_SE = torch.cumsum(every_SE, 0) - every_SE  # the expert's slots from earlier sources
            every_SDe = torch.minimum(every_SE, (per_expert - before_SE).clamp_min(0)).view(P, P, e)
        keep_SDe = every_SDe
        if capacity:
            offered_D = every_SDe.sum((0, 2))
            keep_SDe = torch.where((offered_D > capacity).view(1, P, 1),
                                   every_SDe * capacity // offered_D.clamp_min(1).view(1, P, 1), every_SDe)
        me = dist.get_rank(self.group)
        return keep_SDe[me], keep_SDe[:, me]


def take_dropped_layers(layers) -> Tensor:
    """[layer, (routed, dropped)] token-expert assignments of `layers` (MoE modules) since the
    last call, and reset (the sending rank counts them; sum over ranks). Counted where a bound
    applies: the rank capacity (here) or the per-expert capacity (model.LocalExperts)."""
    out = torch.stack([torch.stack([m.routed_slots, m.dropped_slots]) for m in layers])
    for m in layers:
        m.routed_slots.zero_()
        m.dropped_slots.zero_()
    return out


def take_dropped(layers) -> Tensor:
    """[routed, dropped] of `layers` since the last call, summed over the layers, and reset."""
    return take_dropped_layers(layers).sum(0)


EXPERT_WEIGHTS = ("w1_EFD", "w3_EFD", "w2_EDF")


def shard_experts(moe: MoE, ep_mesh) -> None:
    """Make `moe`'s expert weights `Shard(0)` DTensors over the 1-D `ep_mesh` and route its tokens
    through `AllToAllExperts`. No communication: each rank keeps its own slice (on `meta` too)."""
    from torch import nn
    from torch.distributed.tensor import Shard, distribute_tensor

    for name in EXPERT_WEIGHTS:
        weight = getattr(moe, name)
        moe.register_parameter(name, nn.Parameter(distribute_tensor(weight.data, ep_mesh, [Shard(0)],
                                                                    src_data_rank=None)))
    moe.experts = AllToAllExperts(ep_mesh.get_group(), moe.cfg.n_experts)
