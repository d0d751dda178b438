"""Triton kernels for the fused MoE router: one forward kernel and one backward kernel.

Shape legend: T tokens, E experts, K experts chosen per token, BT tokens in one program's tile,
EP = E padded to a power of two (384 -> 512), KP = K padded to a power of two.

Forward, per tile of BT tokens, in one pass over the fp32 logits: log-sum-exp, scores (softmax or
sigmoid), selection key = score + bias, K rounds of argmax (ties go to the lowest expert index)
that each take one expert out of the running, the unbiased scores of the chosen experts,
renormalised and scaled into weights. Each program walks a strided set of tiles and keeps its
per-expert token counts and score sums in registers, then adds them to the zeroed outputs with
one atomic add per expert, so contention is one add per program, not one per tile.

Backward recomputes the scores from the saved logits and log-sum-exp and writes the full [T, E]
gradient; nothing else of the forward is kept (see docs/moe.md, "Memory").

These launchers take fp32 contiguous tensors and allocate nothing but outputs; autograd and the
op registration live in router.py.
"""
import torch
import triton
import triton.language as tl

from steps.moe.router import RENORM_EPS, SCORE_FUNCS


def tile_config(n_tokens: int, n_experts: int) -> tuple[int, int]:
    """(tokens per tile, warps). Eight warps and 4 to 8 logits per thread: compiled for sm_90 this
    takes 72-80 registers in either kernel and spills none, where 16 or more logits per thread
    took 120-250 registers or spilled. bench/router.py --sweep times the alternatives on a GPU."""
    ep = triton.next_power_of_2(n_experts)
    bt = (2048 if ep >= 512 else 1024) // ep
    return max(1, min(128, bt, triton.next_power_of_2(max(n_tokens, 1)))), 8


def max_programs(device: torch.device) -> int:
    """Programs of the forward grid. Each adds its counts and sums once per expert, so fewer
    programs mean fewer atomics; two per SM all stay resident at 80 registers a thread."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter runs programs one after another; a few keep the strided loop tested


@triton.jit
def _router_fwd_kernel(
    logits_ptr, bias_ptr, weights_ptr, indices_ptr, lse_ptr, counts_ptr, sums_ptr,
    T, E, n_tiles, scale, eps,
    K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr, BT: tl.constexpr,
    SCORE: tl.constexpr, RENORM: tl.constexpr,
):
    e_E = tl.arange(0, EP)
    real_E = e_E < E
    k_K = tl.arange(0, KP)
    bias_E = tl.load(bias_ptr + e_E, mask=real_E, other=0.0)
    counts_E = tl.zeros([EP], dtype=tl.int32)
    sums_E = tl.zeros([EP], dtype=tl.float32)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        t_T = tile * BT + tl.arange(0, BT)
        real_T = t_T < T
        row_T = t_T.to(tl.int64) * E
        l_TE = tl.load(logits_ptr + row_T[:, None] + e_E[None, :],
                       mask=real_T[:, None] & real_E[None, :], other=0.0)
        l_TE = tl.where(real_E[None, :], l_TE, -float("inf"))
        m_T = tl.max(l_TE, axis=1)
        p_TE = tl.exp(l_TE - m_T[:, None])
        z_T = tl.sum(p_TE, axis=1)
        lse_T = m_T + tl.log(z_T)
        if SCORE == 0:
            s_TE = p_TE / z_T[:, None]
        else:
            s_TE = tl.where(real_E[None, :], tl.sigmoid(l_TE), 0.0)
        sel_TE = tl.where(real_E[None, :], s_TE + bias_E[None, :], -float("inf"))

        idx_TK = tl.zeros([BT, KP], dtype=tl.int32)
        s_TK = tl.zeros([BT, KP], dtype=tl.float32)
        for k in tl.static_range(K):
            i_T = tl.argmax(sel_TE, axis=1, tie_break_left=True).to(tl.int32)
            hit_TE = e_E[None, :] == i_T[:, None]
            sk_T = tl.sum(tl.where(hit_TE, s_TE, 0.0), axis=1)
            idx_TK = tl.where(k_K[None, :] == k, i_T[:, None], idx_TK)
            s_TK = tl.where(k_K[None, :] == k, sk_T[:, None], s_TK)
            # A chosen expert drops out; scores are finite, so -inf marks exactly the chosen ones.
            sel_TE = tl.where(hit_TE, -float("inf"), sel_TE)
        if RENORM:
            w_TK = s_TK / (tl.sum(s_TK, axis=1) + eps)[:, None] * scale
        else:
            w_TK = s_TK * scale

        out_TK = t_T[:, None] * K + k_K[None, :]
        mask_TK = real_T[:, None] & (k_K[None, :] < K)
        tl.store(weights_ptr + out_TK, w_TK, mask=mask_TK)
        tl.store(indices_ptr + out_TK, idx_TK, mask=mask_TK)
        tl.store(lse_ptr + t_T, lse_T, mask=real_T)
        chosen_TE = (sel_TE == -float("inf")) & real_E[None, :] & real_T[:, None]
        counts_E += tl.sum(chosen_TE.to(tl.int32), axis=0)
        sums_E += tl.sum(tl.where(real_T[:, None], s_TE, 0.0), axis=0)
    tl.atomic_add(counts_ptr + e_E, counts_E, mask=real_E)
    tl.atomic_add(sums_ptr + e_E, sums_E, mask=real_E)


@triton.jit
def _router_bwd_kernel(
    logits_ptr, lse_ptr, indices_ptr, dweights_ptr, dlse_ptr, dsums_ptr, dlogits_ptr,
    T, E, scale, eps,
    K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr, BT: tl.constexpr,
    SCORE: tl.constexpr, RENORM: tl.constexpr,
):
    e_E = tl.arange(0, EP)
    real_E = e_E < E
    k_K = tl.arange(0, KP)
    t_T = tl.program_id(0) * BT + tl.arange(0, BT)
    real_T = t_T < T
    row_T = t_T.to(tl.int64) * E
    mask_TE = real_T[:, None] & real_E[None, :]
    l_TE = tl.load(logits_ptr + row_T[:, None] + e_E[None, :], mask=mask_TE, other=0.0)
    l_TE = tl.where(real_E[None, :], l_TE, -float("inf"))
    lse_T = tl.load(lse_ptr + t_T, mask=real_T, other=0.0)
    p_TE = tl.exp(l_TE - lse_T[:, None])  # softmax of the logits, 0 on padding
    if SCORE == 0:
        s_TE = p_TE
    else:
        s_TE = tl.where(real_E[None, :], tl.sigmoid(l_TE), 0.0)

    # The chosen experts' unbiased scores, gathered again from the recomputed row.
    s_TK = tl.zeros([BT, KP], dtype=tl.float32)
    for k in tl.static_range(K):
        i_T = tl.load(indices_ptr + t_T * K + k, mask=real_T, other=-1)
        sk_T = tl.sum(tl.where(e_E[None, :] == i_T[:, None], s_TE, 0.0), axis=1)
        s_TK = tl.where(k_K[None, :] == k, sk_T[:, None], s_TK)
    mask_TK = real_T[:, None] & (k_K[None, :] < K)
    dw_TK = tl.load(dweights_ptr + t_T[:, None] * K + k_K[None, :], mask=mask_TK, other=0.0)
    # w_k = scale * s_k / D with D = sum_j s_j + eps, so dL/ds_j = scale / D * (dw_j - sum_k dw_k s_k / D).
    if RENORM:
        den_T = tl.sum(s_TK, axis=1) + eps
        inner_T = tl.sum(dw_TK * s_TK, axis=1) / den_T
        g_TK = (dw_TK - inner_T[:, None]) * (scale / den_T)[:, None]
    else:
        g_TK = dw_TK * scale

    ds_E = tl.load(dsums_ptr + e_E, mask=real_E, other=0.0)
    ds_TE = tl.zeros([BT, EP], dtype=tl.float32) + ds_E[None, :]
    for k in tl.static_range(K):
        i_T = tl.load(indices_ptr + t_T * K + k, mask=real_T, other=-1)
        gk_T = tl.sum(tl.where(k_K[None, :] == k, g_TK, 0.0), axis=1)
        ds_TE += tl.where(e_E[None, :] == i_T[:, None], gk_T[:, None], 0.0)
    if SCORE == 0:
        dl_TE = s_TE * (ds_TE - tl.sum(ds_TE * s_TE, axis=1)[:, None])
    else:
        dl_TE = ds_TE * s_TE * (1.0 - s_TE)
    dlse_T = tl.load(dlse_ptr + t_T, mask=real_T, other=0.0)
    dl_TE += dlse_T[:, None] * p_TE
    tl.store(dlogits_ptr + row_T[:, None] + e_E[None, :], dl_TE, mask=mask_TE)


def _check(logits_TE: torch.Tensor, k: int, score_func: str) -> tuple[int, int]:
    if logits_TE.dtype != torch.float32 or logits_TE.dim() != 2:
        raise ValueError("the router kernel takes 2-D fp32 logits, "
                         f"got {logits_TE.dtype} {tuple(logits_TE.shape)}")
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"score_func must be one of {sorted(SCORE_FUNCS)}, got {score_func!r}")
    n_tokens, n_experts = logits_TE.shape
    if not 1 <= k <= n_experts:
        raise ValueError(f"k={k} must lie in [1, {n_experts}]")
    return n_tokens, n_experts


def router_forward(
    logits_TE: torch.Tensor, bias_E: torch.Tensor, k: int, score_func: str, renormalize: bool,
    scale: float, *, block_t: int | None = None, num_warps: int | None = None,
    programs: int | None = None, out: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. Returns (weights_TK fp32, indices_TK int32, counts_E int32,
    lse_T fp32, score_sums_E fp32). `out` = (weights, indices, lse) lets a test hand in buffers
    pre-filled with sentinels; counts and sums are always zeroed here, since the kernel adds to them."""
    n_tokens, n_experts = _check(logits_TE, k, score_func)
    logits_TE = logits_TE.contiguous()
    bias_E = bias_E.to(torch.float32).contiguous()
    bt, warps = tile_config(n_tokens, n_experts)
    bt, warps = block_t or bt, num_warps or warps
    if out is None:
        weights_TK = logits_TE.new_empty(n_tokens, k)
        indices_TK = logits_TE.new_empty(n_tokens, k, dtype=torch.int32)
        lse_T = logits_TE.new_empty(n_tokens)
    else:
        weights_TK, indices_TK, lse_T = out
    # Separate buffers, not two views of one: a custom op's outputs may not alias each other.
    counts_E = torch.zeros(n_experts, dtype=torch.int32, device=logits_TE.device)
    sums_E = torch.zeros(n_experts, dtype=torch.float32, device=logits_TE.device)
    n_tiles = triton.cdiv(n_tokens, bt)
    grid = (max(1, min(n_tiles, programs or max_programs(logits_TE.device))),)
    _router_fwd_kernel[grid](
        logits_TE, bias_E, weights_TK, indices_TK, lse_T, counts_E, sums_E,
        n_tokens, n_experts, n_tiles, float(scale), RENORM_EPS,
        K=k, KP=triton.next_power_of_2(k), EP=triton.next_power_of_2(n_experts), BT=bt,
        SCORE=SCORE_FUNCS[score_func], RENORM=bool(renormalize), num_warps=warps,
    )
    return weights_TK, indices_TK, counts_E, lse_T, sums_E


def router_backward(
    logits_TE: torch.Tensor, lse_T: torch.Tensor, indices_TK: torch.Tensor,
    dweights_TK: torch.Tensor, dlse_T: torch.Tensor, dsums_E: torch.Tensor,
    score_func: str, renormalize: bool, scale: float, *, block_t: int | None = None,
    num_warps: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the backward kernel: the gradient of the loss with respect to the fp32 logits,
    given the gradients of the weights, the log-sum-exp and the per-expert score sums."""
    n_tokens, n_experts = _check(logits_TE, indices_TK.shape[1], score_func)
    k = indices_TK.shape[1]
    bt, warps = tile_config(n_tokens, n_experts)
    bt, warps = block_t or bt, num_warps or warps
    dlogits_TE = torch.empty_like(logits_TE) if out is None else out
    grid = (triton.cdiv(n_tokens, bt),)
    _router_bwd_kernel[grid](
        logits_TE.contiguous(), lse_T.contiguous(), indices_TK.contiguous(),
        dweights_TK.to(torch.float32).contiguous(), dlse_T.to(torch.float32).contiguous(),
        dsums_E.to(torch.float32).contiguous(), dlogits_TE,
        n_tokens, n_experts, float(scale), RENORM_EPS,
        K=k, KP=triton.next_power_of_2(k), EP=triton.next_power_of_2(n_experts), BT=bt,
        SCORE=SCORE_FUNCS[score_func], RENORM=bool(renormalize), num_warps=warps,
    )
    return dlogits_TE
