"""Load balancing for the MoE router: the expert-bias update, an optional auxiliary loss, and
the z-loss.

Shape legend: T tokens, E routed experts, L MoE layers.

The main lever is auxiliary-loss-free: each MoE layer keeps a bias that is added to the scores
only to choose experts. Once per optimizer step, every expert's bias moves by a fixed `rate`
toward balance: up if the expert got fewer tokens than the layer's mean load, down if more (the
sign of the load's deviation from its mean). The step is then centred (its mean over experts
is subtracted) so the biases keep a zero mean and cannot drift together; a shift common to all
experts changes no choice anyway. Loads are summed over every micro-batch of the step and, when
torch.distributed is initialized, over all ranks, so every rank applies the same update.
"""
from typing import Protocol, Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class HasExpertBias(Protocol):
    expert_bias_E: Tensor  # fp32, added to the scores for selection only
    expert_load_E: Tensor  # fp32, tokens routed to each expert since the last update


def z_loss(lse_T: Tensor) -> Tensor:
    """Mean squared log-sum-exp of the router logits; keeps the logits from growing."""
    return lse_T.float().square().mean()


def aux_balance_loss(counts_E: Tensor, score_sums_E: Tensor, k: int) -> Tensor:
    """E * sum_e f_e * P_e, with f_e the share of the T*K routed slots that went to expert e (no
    gradient) and P_e the mean score of expert e over the T tokens. With softmax scores it is 1
    when the load is uniform and grows with imbalance; the gradient flows through P only."""
    n_experts = counts_E.numel()
    slots = counts_E.sum().clamp_min(1).float()
    f_E = counts_E.float() / slots
    p_E = score_sums_E / (slots / k)
    return n_experts * (f_E * p_E).sum()


@torch.no_grad()
def update_expert_bias(layers: Sequence[HasExpertBias], rate: float, group=None) -> Tensor:
    """Apply the centred sign rule to every layer's expert bias from the loads gathered since the
    last call, then clear the loads. One all-reduce for all layers when distributed. Returns each
    layer's max violation before the update, (max load - mean load) / mean load, as [L]."""
    load_LE = torch.stack([layer.expert_load_E for layer in layers])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(load_LE, op=dist.ReduceOp.SUM, group=group)
    mean_L1 = load_LE.mean(-1, keepdim=True)
    step_LE = rate * torch.sign(mean_L1 - load_LE)
    step_LE -= step_LE.mean(-1, keepdim=True)
    for layer, step_E in zip(layers, step_LE):
        layer.expert_bias_E += step_E.to(layer.expert_bias_E.dtype)
        layer.expert_load_E.zero_()
    mean_L = mean_L1.squeeze(-1)
    return torch.where(mean_L > 0, load_LE.max(-1).values / mean_L.clamp_min(1e-12) - 1, 0.0)
