"""The MoE router: a plain torch reference, the fused Triton op, and the choice between them.

Shape legend: T tokens, E routed experts, K experts chosen per token.

Both paths share one meaning. From fp32 logits_TE: scores are softmax or sigmoid of the logits;
the selection key is score + bias_E, where the bias (no gradient) only decides where a token goes;
the top K keys are taken in descending order, ties to the lowest expert index; the weights are the
chosen experts' unbiased scores, divided by their sum (plus 1e-20) when `renormalize`, times
`scale`. Alongside: per-expert token counts (for the bias update), the log-sum-exp of each row
(z-loss) and the per-expert sums of scores over tokens (auxiliary loss).

The fused path is registered with torch.library.custom_op, so torch.compile treats it as one
opaque node, and register_autograd gives it the Triton backward. It keeps for backward only the
logits, the chosen indices and the log-sum-exp.
"""
import os
from typing import NamedTuple

import torch
from torch import Tensor

# The kernels import lazily, inside the op, so the model imports on machines without Triton.
SCORE_FUNCS = {"softmax": 0, "sigmoid": 1}  # the kernels' SCORE constexpr
RENORM_EPS = 1e-20


def _score(score_func: str) -> int:
    """The kernels' SCORE code of a score function (the kernels take it, and RENORM_EPS, as arguments)."""
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"score_func must be one of {sorted(SCORE_FUNCS)}, got {score_func!r}")
    return SCORE_FUNCS[score_func]


class RouterOutput(NamedTuple):
    weights_TK: Tensor  # fp32
    indices_TK: Tensor  # int32
    counts_E: Tensor  # int32, tokens sent to each expert
    lse_T: Tensor  # fp32, log-sum-exp of each row of logits
    score_sums_E: Tensor  # fp32, scores summed over tokens


def scores_of(logits_TE: Tensor, score_func: str) -> Tensor:
    """The unbiased router scores."""
    if score_func == "softmax":
        return torch.softmax(logits_TE, dim=-1)
    if score_func == "sigmoid":
        return torch.sigmoid(logits_TE)
    raise ValueError(f"score_func must be one of {sorted(SCORE_FUNCS)}, got {score_func!r}")


def route_reference(logits_TE: Tensor, bias_E: Tensor, k: int, score_func: str,
                    renormalize: bool, scale: float) -> RouterOutput:
    """The router in plain torch ops; autograd gives its backward. The semantics the kernel must match."""
    n_experts = logits_TE.shape[-1]
    s_TE = scores_of(logits_TE, score_func)
    idx_TK = torch.topk(s_TE.detach() + bias_E.float(), k, dim=-1, sorted=True).indices
    s_TK = s_TE.gather(-1, idx_TK)
    if renormalize:
        w_TK = s_TK / (s_TK.sum(-1, keepdim=True) + RENORM_EPS) * scale
    else:
        w_TK = s_TK * scale
    flat_N = idx_TK.reshape(-1)
    # scatter_add rather than bincount: its output size does not depend on the data, so it compiles.
    counts_E = torch.zeros(n_experts, dtype=torch.int32, device=logits_TE.device)
    counts_E = counts_E.scatter_add(0, flat_N, torch.ones_like(flat_N, dtype=torch.int32))
    return RouterOutput(w_TK, idx_TK.to(torch.int32), counts_E,
                        torch.logsumexp(logits_TE, dim=-1), s_TE.sum(0))


@torch.library.custom_op("marin_voyage::moe_router", mutates_args=())
def moe_router(logits_TE: Tensor, bias_E: Tensor, k: int, score_func: str, renormalize: bool,
               scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The fused router forward (one Triton kernel); outputs as in RouterOutput."""
    from steps.moe.router_kernel import router_forward

    return router_forward(logits_TE, bias_E, k, _score(score_func), renormalize, scale, RENORM_EPS)


@moe_router.register_fake
def _(logits_TE, bias_E, k, score_func, renormalize, scale):
    n_tokens, n_experts = logits_TE.shape
    return (logits_TE.new_empty(n_tokens, k), logits_TE.new_empty(n_tokens, k, dtype=torch.int32),
            logits_TE.new_empty(n_experts, dtype=torch.int32), logits_TE.new_empty(n_tokens),
            logits_TE.new_empty(n_experts))


@torch.library.custom_op("marin_voyage::moe_router_backward", mutates_args=())
def moe_router_backward(logits_TE: Tensor, lse_T: Tensor, indices_TK: Tensor, dweights_TK: Tensor,
                        dlse_T: Tensor, dsums_E: Tensor, score_func: str, renormalize: bool,
                        scale: float) -> Tensor:
    """The fused router backward (one Triton kernel): the gradient with respect to the logits."""
    from steps.moe.router_kernel import router_backward

    return router_backward(logits_TE, lse_T, indices_TK, dweights_TK, dlse_T, dsums_E,
                           _score(score_func), renormalize, scale, RENORM_EPS)


@moe_router_backward.register_fake
def _(logits_TE, lse_T, indices_TK, dweights_TK, dlse_T, dsums_E, score_func, renormalize, scale):
    return torch.empty_like(logits_TE)


def _setup_context(ctx, inputs, output):
    logits_TE, _bias, _k, score_func, renormalize, scale = inputs
    _w, indices_TK, _counts, lse_T, _sums = output
    ctx.save_for_backward(logits_TE, indices_TK, lse_T)
    ctx.spec = (score_func, renormalize, scale)


def _backward(ctx, dweights_TK, _dindices, _dcounts, dlse_T, dsums_E):
    # Autograd hands zeros for outputs the loss did not use, so all three gradients are tensors.
    logits_TE, indices_TK, lse_T = ctx.saved_tensors
    dlogits_TE = moe_router_backward(logits_TE, lse_T, indices_TK, dweights_TK, dlse_T, dsums_E,
                                     *ctx.spec)
    return dlogits_TE, None, None, None, None, None


moe_router.register_autograd(_backward, setup_context=_setup_context)


def route_fused(logits_TE: Tensor, bias_E: Tensor, k: int, score_func: str, renormalize: bool,
                scale: float) -> RouterOutput:
    """The router through the fused op. CUDA tensors, or CPU tensors under TRITON_INTERPRET=1."""
    if not logits_TE.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the fused router runs on CUDA, or on the CPU only with TRITON_INTERPRET=1")
    return RouterOutput(*moe_router(logits_TE, bias_E.float(), k, score_func, renormalize, scale))


ROUTERS = {"reference": route_reference, "fused": route_fused}


def least_traffic(n_tokens: int, n_experts: int, k: int) -> tuple[int, int]:
    """The fewest bytes the router's forward and backward can move (what the benchmarks divide
    by): forward reads logits and bias, writes weights, indices, lse, counts and sums; backward
    reads logits, lse, indices and the three incoming gradients, writes the logit gradient."""
    T, E, K = n_tokens, n_experts, k
    fwd = 4 * T * E + 4 * E + 8 * T * K + 4 * T + 8 * E
    bwd = 4 * T * E + 4 * T + 8 * T * K + 4 * T + 4 * E + 4 * T * E
    return fwd, bwd


def route(logits_TE: Tensor, bias_E: Tensor, k: int, score_func: str, renormalize: bool,
          scale: float, impl: str = "auto") -> RouterOutput:
    """Route with the implementation named by `impl`; "auto" is the fused kernel on CUDA and the
    reference elsewhere."""
    if impl == "auto":
        impl = "fused" if logits_TE.is_cuda else "reference"
    return ROUTERS[impl](logits_TE, bias_E, k, score_func, renormalize, scale)


def untied_logits(n_tokens: int, n_experts: int, k: int, score_func: str, bias_E: Tensor,
                  generator: torch.Generator, min_gap: float = 1e-4) -> Tensor:
    """Random fp32 logits whose selection keys have no near-ties among each row's top k + 1, so
    that any correct router must pick the same experts in the same order. Rows that fail the gap
    (relative to the row's largest key) are drawn again."""
    logits_TE = torch.randn(n_tokens, n_experts, generator=generator, device=generator.device) * 2
    for _ in range(100):
        key_TE = scores_of(logits_TE.double(), score_func) + bias_E.double()
        top_TJ = torch.topk(key_TE, min(k + 1, n_experts), dim=-1).values
        gap_T = (top_TJ[:, :-1] - top_TJ[:, 1:]).min(-1).values if top_TJ.shape[1] > 1 else None
        if gap_T is None:
            return logits_TE
        bad_T = gap_T < min_gap * top_TJ[:, 0].abs().clamp_min(1e-3)
        if not bad_T.any():
            return logits_TE
        fresh = torch.randn(int(bad_T.sum()), n_experts, generator=generator, device=generator.device)
        logits_TE[bad_T] = fresh * 2
    raise RuntimeError("could not draw untied logits; lower min_gap")
