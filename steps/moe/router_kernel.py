"""Triton kernels for the fused MoE router: one forward kernel and one backward kernel.

Shape legend: T tokens, E experts (a compile-time constant: one model has one E), K experts
chosen per token, BT tokens in one tile, CW columns in a chunk (128: 32 lanes x 4 consecutive
fp32, or the whole padded row when narrower), NC chunks (E padded to a power of two, over CW:
384 -> 512 -> 4; with E constant the all-padding chunk compiles away), KP = K padded to a power
of two.

Layout. A tile is [NC, BT, CW] and, by default, one token handled by one warp: each lane holds 4
consecutive experts of every chunk (one 16-byte load per chunk), so every per-token reduction is
a reduction over the chunk axis in registers, then a warp shuffle over the lanes: no shared
memory, no barrier. (A [BT, E] tile, the obvious shape, lets Triton spread one row over several
warps, and then each of the forward's 2K+2 row reductions goes through shared memory and a
barrier: that first design compiled to 2,200 instructions a warp for 4 tokens, 66 of them
barriers, and an issue-bound floor of ~140 us at T = 32k, E = 384 against ~12 us to read the
logits.)

Forward, per token, in one pass over the fp32 logits: log-sum-exp, scores (softmax or sigmoid),
selection key = score + bias, then K rounds of: the largest key, the lowest expert holding it
(ties go to the lowest index), that expert out of the running. A round costs about six
instructions a held element plus two 5-step shuffles. The chosen expert's unbiased score is recomputed from its one logit
(a load that hits the cache) rather than gathered from the row by another reduction, then
renormalised and scaled into the weight. Each program walks a strided set of tiles keeping its
per-expert token counts and score sums in registers, then adds them to the zeroed outputs with
one atomic add per expert.

Backward recomputes the softmax from the saved logits and log-sum-exp, forms the dense part of
the gradient (from the score sums and the lse) for every column, and then rewrites the K chosen
columns of each row, whose gradient also has the weights' term, from values recomputed at those
columns alone. Nothing else of the forward is kept (see docs/moe.md, "Memory").

The machine code for sm_90, compiled here without a GPU: bench/router_sass.py; figures in
docs/moe.md.

These launchers take fp32 contiguous tensors and allocate nothing but outputs; autograd and the
op registration live in router.py.
"""
import torch
import triton
import triton.language as tl

# The score function arrives as the kernels' SCORE code (0 softmax, 1 sigmoid) and the
# renormalisation's epsilon as an argument: steps/moe/router.py owns both meanings (its
# SCORE_FUNCS and RENORM_EPS), and this module imports nothing of it (no import circle).
SCORES = (0, 1)


def tile_config(n_tokens: int, n_experts: int, device: torch.device | None = None) -> tuple[int, int]:
    """(tokens per tile, warps) of both kernels. On a GPU: one token, one warp. A token's row then
    never spans warps whatever layout Triton picks for the tile (Triton 3.6 puts the warps of a
    [NC, BT, CW] tile on the chunk axis, 3.9 on the token axis), so no reduction needs shared
    memory or a barrier; bench/router_sass.py shows the machine code, bench/router.py --sweep
    times other shapes. Under the interpreter (CPU), 16 tokens a tile: it runs programs one
    after another, and one a token would spend the tests' time on program overhead."""
    if device is not None and device.type == "cpu":
        return min(16, triton.next_power_of_2(max(n_tokens, 1))), 1
    return 1, 1


def chunk_width(n_experts: int) -> int:
    """Columns of one chunk: 32 lanes x 4 consecutive fp32 (one 16-byte load each), or the whole
    padded row when it is narrower."""
    return min(128, triton.next_power_of_2(n_experts))


def programs_per_sm(num_warps: int) -> int:
    """Forward programs a SM: 16 warps, as many as stay resident at the forward's ~128 registers
    a thread, and no more, since each program adds its counts and sums once per expert at its end."""
    return max(1, 16 // num_warps)


def max_programs(device: torch.device, num_warps: int = 1) -> int:
    """Programs of the forward grid."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * programs_per_sm(num_warps)
    return 4  # the interpreter runs programs one after another; a few keep the strided loop tested


@triton.jit
def _token_max(x):
    """[NC, BT, CW] -> [BT]: chunk axis first (in registers), then the lanes."""
    return tl.max(tl.max(x, axis=0), axis=1)


@triton.jit
def _token_sum(x):
    return tl.sum(tl.sum(x, axis=0), axis=1)


@triton.jit
def _token_min(x):
    return tl.min(tl.min(x, axis=0), axis=1)


@triton.jit
def _expert_ids(NC: tl.constexpr, CW: tl.constexpr):
    """[NC, 1, CW]: expert e = c * CW + j sits at [c, ., j] (lanes hold 4 consecutive columns of
    each chunk)."""
    c_C = tl.arange(0, NC)
    j_J = tl.arange(0, CW)
    return tl.expand_dims(tl.expand_dims(c_C, 1), 2) * CW + tl.expand_dims(tl.expand_dims(j_J, 0), 0)


@triton.jit
def _per_token(v):
    """[BT] -> [1, BT, 1], the inverse of the reductions above, so no layout conversion is needed."""
    return tl.expand_dims(tl.expand_dims(v, 1), 0)


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)) with the fast reciprocal (div.full, within 2 ulp) rather than IEEE
    division, whose slow path costs branches on every element. Both kernels use this one."""
    return tl.fdiv(1.0, 1.0 + tl.exp(-x), ieee_rounding=False)


@triton.jit
def _router_fwd_kernel(
    logits_ptr, bias_ptr, weights_ptr, indices_ptr, lse_ptr, counts_ptr, sums_ptr,
    T, n_tiles, scale, eps,
    E: tl.constexpr, K: tl.constexpr, NC: tl.constexpr, CW: tl.constexpr, BT: tl.constexpr,
    SCORE: tl.constexpr, RENORM: tl.constexpr,
):
    e_C1J = _expert_ids(NC, CW)
    real_C1J = e_C1J < E
    bias_C1J = tl.load(bias_ptr + e_C1J, mask=real_C1J, other=0.0)
    slot_1J = tl.expand_dims(tl.arange(0, CW), 0)  # the K chosen experts go to slots j < K of a [BT, CW] row
    counts_CBJ = tl.zeros([NC, BT, CW], dtype=tl.int32)
    sums_CBJ = tl.zeros([NC, BT, CW], dtype=tl.float32)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        t_B = tile * BT + tl.arange(0, BT)
        real_B = t_B < T
        row_B = t_B.to(tl.int64) * E
        l_CBJ = tl.load(logits_ptr + _per_token(row_B) + e_C1J,
                        mask=_per_token(real_B) & real_C1J, other=0.0)
        l_CBJ = tl.where(real_C1J, l_CBJ, -float("inf"))  # padding experts: p = 0, never chosen
        m_B = _token_max(l_CBJ)
        p_CBJ = tl.exp(l_CBJ - _per_token(m_B))
        z_B = _token_sum(p_CBJ)
        tl.store(lse_ptr + t_B, m_B + tl.log(z_B), mask=real_B)
        rz_B = 1.0 / z_B
        if SCORE == 0:
            s_CBJ = p_CBJ * _per_token(rz_B)
        else:
            s_CBJ = _sigmoid(l_CBJ)
        key_CBJ = tl.where(real_C1J, s_CBJ + bias_C1J, -float("inf"))

        idx_BJ = tl.zeros([BT, CW], dtype=tl.int32)
        for k in tl.static_range(K):
            # The largest key, then the lowest expert holding it; that expert drops out.
            top_B = _token_max(key_CBJ)
            i_B = _token_min(tl.where(key_CBJ == _per_token(top_B), e_C1J, NC * CW))
            key_CBJ = tl.where(e_C1J == _per_token(i_B), -float("inf"), key_CBJ)
            idx_BJ = tl.where(slot_1J == k, tl.expand_dims(i_B, 1), idx_BJ)
        # The chosen experts' unbiased scores, recomputed from their K logits (one load that hits
        # the cache) rather than gathered from the row by K more reductions.
        t_B1 = tl.expand_dims(t_B, 1)
        mask_BJ = tl.expand_dims(real_B, 1) & (slot_1J < K)
        lk_BJ = tl.load(logits_ptr + tl.expand_dims(row_B, 1) + idx_BJ, mask=mask_BJ & (idx_BJ < E),
                        other=0.0)
        if SCORE == 0:
            sk_BJ = tl.exp(lk_BJ - tl.expand_dims(m_B, 1)) * tl.expand_dims(rz_B, 1)
        else:
            sk_BJ = _sigmoid(lk_BJ)
        sk_BJ = tl.where(mask_BJ, sk_BJ, 0.0)
        if RENORM:
            w_BJ = sk_BJ * tl.expand_dims(scale / (tl.sum(sk_BJ, axis=1) + eps), 1)
        else:
            w_BJ = sk_BJ * scale
        out_BJ = t_B1 * K + slot_1J
        tl.store(weights_ptr + out_BJ, w_BJ, mask=mask_BJ)
        tl.store(indices_ptr + out_BJ, idx_BJ, mask=mask_BJ)
        # Chosen experts are exactly the real ones now keyed -inf; padding is never counted, as
        # only real experts are added to the outputs below.
        real_1B1 = _per_token(real_B)
        counts_CBJ += ((key_CBJ == -float("inf")) & real_1B1).to(tl.int32)
        sums_CBJ += tl.where(real_1B1, s_CBJ, 0.0)
    # Across the program's warps once, then one atomic add per expert for the whole program.
    # ([NC, 1, CW] -> [NC, CW] by a reduction over the size-1 axis keeps the sums' layout.)
    e_CJ = tl.max(e_C1J, axis=1)
    tl.atomic_add(counts_ptr + e_CJ, tl.sum(counts_CBJ, axis=1), mask=e_CJ < E, sem="relaxed")
    tl.atomic_add(sums_ptr + e_CJ, tl.sum(sums_CBJ, axis=1), mask=e_CJ < E, sem="relaxed")


@triton.jit
def _router_bwd_kernel(
    logits_ptr, lse_ptr, indices_ptr, dweights_ptr, dlse_ptr, dsums_ptr, dlogits_ptr,
    T, scale, eps,
    E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, NC: tl.constexpr, CW: tl.constexpr, BT: tl.constexpr,
    SCORE: tl.constexpr, RENORM: tl.constexpr,
):
    e_C1J = _expert_ids(NC, CW)
    real_C1J = e_C1J < E
    t_B = tl.program_id(0) * BT + tl.arange(0, BT)
    real_B = t_B < T
    row_B = t_B.to(tl.int64) * E
    mask_CBJ = _per_token(real_B) & real_C1J
    l_CBJ = tl.load(logits_ptr + _per_token(row_B) + e_C1J, mask=mask_CBJ, other=0.0)
    lse_B = tl.load(lse_ptr + t_B, mask=real_B, other=0.0)
    dlse_B = tl.load(dlse_ptr + t_B, mask=real_B, other=0.0)
    # Loaded once per token (from L1), so that it takes the logits' layout: a [NC, 1, CW] load
    # gets a layout of its own, and the products with it then convert whole tiles.
    dsums_CBJ = tl.load(dsums_ptr + e_C1J + _per_token(t_B * 0), mask=mask_CBJ, other=0.0)
    p_CBJ = tl.exp(l_CBJ - _per_token(lse_B))  # the softmax of the row, recomputed

    # The chosen experts, [BT, KP]: their scores, again from their logits alone, and the
    # gradient reaching each chosen score through the weights.
    # w_k = scale * s_k / D with D = sum_j s_j + eps, so dL/ds_k = scale / D * (dw_k - sum_j dw_j s_j / D).
    k_1K = tl.expand_dims(tl.arange(0, KP), 0)
    t_B1 = tl.expand_dims(t_B, 1)
    mask_BK = tl.expand_dims(real_B, 1) & (k_1K < K)
    i_BK = tl.load(indices_ptr + t_B1 * K + k_1K, mask=mask_BK, other=0)
    dw_BK = tl.load(dweights_ptr + t_B1 * K + k_1K, mask=mask_BK, other=0.0)
    row_B1 = tl.expand_dims(row_B, 1)
    lk_BK = tl.load(logits_ptr + row_B1 + i_BK, mask=mask_BK, other=0.0)
    pk_BK = tl.exp(lk_BK - tl.expand_dims(lse_B, 1))
    if SCORE == 0:
        sk_BK = pk_BK
    else:
        sk_BK = _sigmoid(lk_BK)
    sk_BK = tl.where(mask_BK, sk_BK, 0.0)
    if RENORM:
        den_B = tl.sum(sk_BK, axis=1) + eps
        inner_B = tl.sum(dw_BK * sk_BK, axis=1) / den_B
        g_BK = (dw_BK - tl.expand_dims(inner_B, 1)) * tl.expand_dims(scale / den_B, 1)
    else:
        g_BK = dw_BK * scale
    g_BK = tl.where(mask_BK, g_BK, 0.0)
    dsk_BK = tl.load(dsums_ptr + i_BK, mask=mask_BK, other=0.0)

    # dL/ds_e = dsums_e, plus g_k on the K chosen columns. The dense part goes out first; the
    # chosen columns are then rewritten whole, from values recomputed at those columns.
    dlse_1B1 = _per_token(dlse_B)
    if SCORE == 0:
        # softmax: dl_e = p_e * (dS_e - sum_j dS_j p_j) + dlse * p_e
        c_B = _token_sum(dsums_CBJ * p_CBJ) + tl.sum(g_BK * sk_BK, axis=1)
        dl_CBJ = p_CBJ * (dsums_CBJ - _per_token(c_B) + dlse_1B1)
        dlk_BK = pk_BK * (dsk_BK + g_BK - tl.expand_dims(c_B, 1) + tl.expand_dims(dlse_B, 1))
    else:
        # sigmoid: dl_e = dS_e * s_e * (1 - s_e) + dlse * p_e
        s_CBJ = _sigmoid(l_CBJ)
        dl_CBJ = dsums_CBJ * s_CBJ * (1.0 - s_CBJ) + dlse_1B1 * p_CBJ
        dlk_BK = (dsk_BK + g_BK) * sk_BK * (1.0 - sk_BK) + tl.expand_dims(dlse_B, 1) * pk_BK
    tl.store(dlogits_ptr + _per_token(row_B) + e_C1J, dl_CBJ, mask=mask_CBJ)
    tl.debug_barrier()  # the dense stores land before the chosen columns are rewritten
    tl.store(dlogits_ptr + row_B1 + i_BK, dlk_BK, mask=mask_BK)


def _check(logits_TE: torch.Tensor, k: int, score: int) -> tuple[int, int]:
    if logits_TE.dtype != torch.float32 or logits_TE.dim() != 2:
        raise ValueError("the router kernel takes 2-D fp32 logits, "
                         f"got {logits_TE.dtype} {tuple(logits_TE.shape)}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES} (0 softmax, 1 sigmoid), got {score!r}")
    n_tokens, n_experts = logits_TE.shape
    if not 1 <= k <= min(n_experts, chunk_width(n_experts)):
        raise ValueError(f"k={k} must lie in [1, {min(n_experts, chunk_width(n_experts))}]")
    return n_tokens, n_experts


def _shape(logits_TE: torch.Tensor, block_t: int | None, num_warps: int | None):
    n_tokens, n_experts = logits_TE.shape
    bt, warps = tile_config(n_tokens, n_experts, logits_TE.device)
    cw = chunk_width(n_experts)
    return dict(NC=triton.next_power_of_2(n_experts) // cw, CW=cw, BT=block_t or bt), num_warps or warps


def router_forward(
    logits_TE: torch.Tensor, bias_E: torch.Tensor, k: int, score: int, renormalize: bool,
    scale: float, eps: float, *, block_t: int | None = None, num_warps: int | None = None,
    programs: int | None = None, out: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel (`score`: 0 softmax, 1 sigmoid; `eps` added to the chosen scores'
    sum before renormalising). Returns (weights_TK fp32, indices_TK int32, counts_E int32,
    lse_T fp32, score_sums_E fp32). `out` = (weights, indices, lse) lets a test hand in buffers
    pre-filled with sentinels; counts and sums are always zeroed here, since the kernel adds to them."""
    n_tokens, n_experts = _check(logits_TE, k, score)
    logits_TE = logits_TE.contiguous()
    bias_E = bias_E.to(torch.float32).contiguous()
    shape, warps = _shape(logits_TE, block_t, num_warps)
    if out is None:
        weights_TK = logits_TE.new_empty(n_tokens, k)
        indices_TK = logits_TE.new_empty(n_tokens, k, dtype=torch.int32)
        lse_T = logits_TE.new_empty(n_tokens)
    else:
        weights_TK, indices_TK, lse_T = out
    # Separate buffers, not two views of one: a custom op's outputs may not alias each other.
    counts_E = torch.zeros(n_experts, dtype=torch.int32, device=logits_TE.device)
    sums_E = torch.zeros(n_experts, dtype=torch.float32, device=logits_TE.device)
    n_tiles = triton.cdiv(n_tokens, shape["BT"])
    grid = (max(1, min(n_tiles, programs or max_programs(logits_TE.device, warps))),)
    _router_fwd_kernel[grid](
        logits_TE, bias_E, weights_TK, indices_TK, lse_T, counts_E, sums_E,
        n_tokens, n_tiles, float(scale), float(eps),
        E=n_experts, K=k, **shape, SCORE=score, RENORM=bool(renormalize), num_warps=warps,
    )
    return weights_TK, indices_TK, counts_E, lse_T, sums_E


def router_backward(
    logits_TE: torch.Tensor, lse_T: torch.Tensor, indices_TK: torch.Tensor,
    dweights_TK: torch.Tensor, dlse_T: torch.Tensor, dsums_E: torch.Tensor,
    score: int, renormalize: bool, scale: float, eps: float, *, block_t: int | None = None,
    num_warps: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the backward kernel: the gradient of the loss with respect to the fp32 logits,
    given the gradients of the weights, the log-sum-exp and the per-expert score sums."""
    n_tokens, n_experts = _check(logits_TE, indices_TK.shape[1], score)
    k = indices_TK.shape[1]
    shape, warps = _shape(logits_TE, block_t, num_warps)
    dlogits_TE = torch.empty_like(logits_TE) if out is None else out
    grid = (triton.cdiv(n_tokens, shape["BT"]),)
    _router_bwd_kernel[grid](
        logits_TE.contiguous(), lse_T.contiguous(), indices_TK.contiguous(),
        dweights_TK.to(torch.float32).contiguous(), dlse_T.to(torch.float32).contiguous(),
        dsums_E.to(torch.float32).contiguous(), dlogits_TE,
        n_tokens, float(scale), float(eps),
        E=n_experts, K=k, KP=triton.next_power_of_2(k), **shape,
        SCORE=score, RENORM=bool(renormalize), num_warps=warps,
    )
    return dlogits_TE
