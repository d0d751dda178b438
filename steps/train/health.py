"""MoE health, per layer, for the metrics row: is the routing still sound?

An MoE run's health is its routing; these are cheap to compute and logged at every metrics row
(`trainer.log_every` steps), as lists with one value per MoE layer:

    load_max_mean   the busiest expert's tokens over the mean expert's (1 = perfectly balanced;
                    top-k of E experts can reach E / k): the expert-load heatmap of the live page
    router_entropy  mean over tokens of the entropy of the router's distribution over experts,
                    in nats (log E: undecided; near 0: each token's choice is certain)
    bias_spread     max - min of the selection bias (expert_bias_E): how hard the load balancer
                    is pushing; a spread that keeps growing means balancing is losing
    dropped         token-expert assignments dropped past a capacity (the rank capacity under
                    expert parallelism, or the per-expert capacity), summed over ranks, and
    dropped_share   their share of the assignments routed; both only where a bound applies

Router entropy needs the router's probabilities, which the MoE layer does not keep: `Entropy`
hooks each MoE layer's forward during the micro-batches of a logged step only and recomputes
the router logits from the layer's input (one D x E matmul per token, a few percent of the
layer, on one step in `log_every`). `bench/train_ops.py health` measures the whole cost.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist


class Entropy:
    """Sums the router entropy of each MoE layer while `active`; a context manager."""

    def __init__(self, layers: Sequence[torch.nn.Module]) -> None:
        self.layers = list(layers)
        self.sum_L = None
        self.count = 0.0
        self.handles: list[Any] = []

    def __enter__(self) -> "Entropy":
        dev = self.layers[0].expert_bias_E.device if self.layers else torch.device("cpu")
        self.sum_L = torch.zeros(len(self.layers), device=dev)
        self.count = 0.0
        self.handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(self.layers)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, i: int):
        def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
            w = module.router.weight
            if hasattr(w, "full_tensor"):
                w = w.full_tensor()
            with torch.no_grad():
                x_TD = args[0].reshape(-1, args[0].shape[-1]).detach()
                logits_TE = x_TD.float() @ w.detach().float().t()
                if getattr(module.cfg, "score_func", "softmax") == "sigmoid":
                    p_TE = torch.sigmoid(logits_TE)
                    p_TE = p_TE / p_TE.sum(-1, keepdim=True).clamp_min(1e-20)
                else:
                    p_TE = torch.softmax(logits_TE, dim=-1)
                h_T = -(p_TE * torch.log(p_TE.clamp_min(1e-20))).sum(-1)
                self.sum_L[i] += h_T.sum()
                if i == 0:
                    self.count += h_T.numel()
        return hook

    def mean(self) -> torch.Tensor:
        """Mean entropy per layer over the tokens seen (all ranks when distributed)."""
        sums = torch.cat([self.sum_L, torch.tensor([self.count], device=self.sum_L.device)])
        if dist.is_initialized():
            dist.all_reduce(sums)
        return sums[:-1] / sums[-1].clamp_min(1)


def row(load_LE: torch.Tensor, layers: Sequence[torch.nn.Module], entropy_L: torch.Tensor | None,
        dropped_L2: torch.Tensor | None = None) -> dict[str, Any]:
    """The health part of a metrics row (load_LE and dropped_L2, [layer, (routed, dropped)] from
    expert_parallel.take_dropped_layers, already summed over ranks)."""
    mean_L = load_LE.mean(-1).clamp_min(1e-9)
    bias_LE = torch.stack([m.expert_bias_E for m in layers]).float()
    out: dict[str, Any] = {
        "load_max_mean": [round(v, 4) for v in (load_LE.max(-1).values / mean_L).tolist()],
        "bias_spread": [round(v, 6) for v in (bias_LE.max(-1).values - bias_LE.min(-1).values).tolist()],
    }
    if entropy_L is not None:
        out["router_entropy"] = [round(v, 4) for v in entropy_L.tolist()]
        out["router_entropy_max"] = math.log(load_LE.shape[-1])
    if dropped_L2 is not None and bool(dropped_L2[:, 0].sum() > 0):
        routed_L, dropped_L = dropped_L2[:, 0].float(), dropped_L2[:, 1].float()
        out["dropped"] = [int(v) for v in dropped_L.tolist()]
        out["dropped_share"] = [round(v, 6) for v in (dropped_L / routed_L.clamp_min(1)).tolist()]
    return out
