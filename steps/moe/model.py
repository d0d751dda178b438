"""A mixture-of-experts decoder: its config, its presets and the model, in one file.

Design choices (the reasons are in docs/moe.md):
- Pre-norm blocks with RMSNorm; rotary position embeddings on queries and keys.
- Grouped-query attention through F.scaled_dot_product_attention; most layers see a sliding
  window of past tokens, every `global_every`-th layer sees the whole causal past.
- Every block's feed-forward is an MoE: an fp32 router picks `top_k` of `n_experts` SwiGLU experts
  per token (selection by score + a load-balancing bias, weights from the unbiased scores), plus
  shared SwiGLU experts every token goes through, added to the routed output.
- Routed experts are 3-D weights; tokens are sorted by expert with a stable argsort, each
  expert's rows padded to a multiple of `expert_align`, and run with one torch._grouped_mm per
  projection. The shared experts are one dense SwiGLU of width n_shared * shared_expert_dim,
  which is the same function and parameter count as n_shared separate ones summed.
- Router losses: z-loss on the log-sum-exp of the logits, an optional auxiliary balance loss;
  balance comes mainly from the expert bias, updated once per optimizer step (balance.py).
- Untied input and output embeddings.
- The routed experts run through a pluggable path (`MoE.experts`): `LocalExperts` here, every
  expert on this rank; `steps.moe.expert_parallel.AllToAllExperts` when the experts are spread
  over an expert-parallel group. A block may recompute its forward in the backward
  (`Block.recompute`, set by steps/train/recompute.py); loads are counted only in the first pass.
- Initialization by parameter name and seed (steps/moe/init.py): the same weights on any mesh,
  drawn shard by shard.

Shape legend: B batch, S sequence, D model width, H query heads, G key/value heads, A head width,
R = A/2 rotary frequencies, V vocabulary, T = B*S tokens, E routed experts, K experts per token,
N = T*K token-expert slots, P rows of the expert-sorted buffer (N plus each expert's padding),
F routed expert width.
"""
import contextlib
import math
import threading
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from steps.moe.balance import aux_balance_loss, z_loss
from steps.moe.head import Head
from steps.moe.config import PRESETS, MoEConfig  # noqa: F401  (re-exported)
from steps.moe.init import init_by_name
from steps.moe.router import route


class _Marks(threading.local):
    output_projection = False


MARKS = _Marks()


@contextlib.contextmanager
def output_projection() -> Iterator[None]:
    """Marks the matmuls whose outputs only feed a sum (attention's wo, the experts' and the
    shared experts' w2): no backward reads them, so selective activation checkpointing
    (steps/train/recompute.py) recomputes them rather than keeping them."""
    MARKS.output_projection = True
    try:
        yield
    finally:
        MARKS.output_projection = False


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BSD: Tensor) -> Tensor:
        return F.rms_norm(x_BSD, (x_BSD.shape[-1],), self.weight, self.eps)


def rope_tables(seq_len: int, head_dim: int, theta: float, device) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each [S, R], in fp32."""
    freq_R = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angle_SR = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * freq_R
    return angle_SR.cos(), angle_SR.sin()


def apply_rope(x_BHSA: Tensor, cos_SR: Tensor, sin_SR: Tensor) -> Tensor:
    x1, x2 = x_BHSA.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos_SR - x2 * sin_SR, x1 * sin_SR + x2 * cos_SR], dim=-1)
    return out.to(x_BHSA.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: MoEConfig, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.window = 0 if cfg.is_global(layer) else cfg.sliding_window
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x_BSD: Tensor, cos_SR: Tensor, sin_SR: Tensor) -> Tensor:
        B, S, _ = x_BSD.shape
        q_BHSA = self.wq(x_BSD).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k_BGSA = self.wk(x_BSD).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BGSA = self.wv(x_BSD).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q_BHSA, k_BGSA = apply_rope(q_BHSA, cos_SR, sin_SR), apply_rope(k_BGSA, cos_SR, sin_SR)
        if self.window and self.window < S:
            i_S = torch.arange(S, device=x_BSD.device)
            lag_SS = i_S[:, None] - i_S[None, :]
            mask_SS = (lag_SS >= 0) & (lag_SS < self.window)
            # With a mask, only the memory-efficient kernel avoids the S x S math path, and it
            # takes no grouped heads: repeat K and V to H heads here.
            rep = self.n_heads // self.n_kv_heads
            k_BHSA, v_BHSA = k_BGSA.repeat_interleave(rep, 1), v_BGSA.repeat_interleave(rep, 1)
            o_BHSA = F.scaled_dot_product_attention(q_BHSA, k_BHSA, v_BHSA, attn_mask=mask_SS)
        else:
            o_BHSA = F.scaled_dot_product_attention(q_BHSA, k_BGSA, v_BGSA, is_causal=True,
                                                    enable_gqa=True)
        with output_projection():
            return self.wo(o_BHSA.transpose(1, 2).reshape(B, S, -1))


class FeedForward(nn.Module):
    """A dense SwiGLU feed-forward; the shared experts, fused into one of width n_shared * width."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x_TD: Tensor) -> Tensor:
        h_TF = F.silu(self.w1(x_TD)) * self.w3(x_TD)
        with output_projection():
            return self.w2(h_TF)


def expert_layout(idx_TK: Tensor, counts_E: Tensor, align: int) -> tuple[Tensor, Tensor, int]:
    """Where each token-expert slot (t, k) goes in the expert-sorted buffer, in which every
    expert's group of rows is padded to a multiple of `align` rows. Returns the row of each slot
    [N], the end of each expert's group [E] (grouped_mm's offsets) and a row count that bounds
    the buffer without a device-to-host sync."""
    E = counts_E.numel()
    flat_N = idx_TK.reshape(-1)
    order_N = torch.argsort(flat_N, stable=True)  # stable: tokens keep their order within an expert
    padded_E = (counts_E + align - 1) // align * align
    offs_E = torch.cumsum(padded_E, 0, dtype=torch.int32)
    shift_E = (offs_E - padded_E) - (torch.cumsum(counts_E, 0, dtype=torch.int32) - counts_E)
    row_N = torch.empty_like(order_N)
    row_N[order_N] = torch.arange(flat_N.numel(), device=flat_N.device) + shift_E[flat_N[order_N]]
    return row_N, offs_E, flat_N.numel() + (align - 1) * E


class _Dispatch(torch.autograd.Function):
    """Copy each token to its K rows of the expert-sorted buffer (padding rows stay zero, so they
    add nothing to any gradient). The backward gathers the K rows back and sums them in a fixed
    order, not with the atomic scatter-add of indexing's backward: gradients stay bitwise
    reproducible."""

    @staticmethod
    def forward(ctx, x_TD: Tensor, row_TK: Tensor, n_rows: int) -> Tensor:
        T, D = x_TD.shape
        ctx.save_for_backward(row_TK)
        x_PD = x_TD.new_zeros(n_rows, D)
        x_PD.index_put_((row_TK,), x_TD.unsqueeze(1).expand(T, row_TK.shape[1], D))
        return x_PD

    @staticmethod
    def backward(ctx, dx_PD: Tensor):
        (row_TK,) = ctx.saved_tensors
        return dx_PD[row_TK].sum(1), None, None


class _RouterLogits(torch.autograd.Function):
    """fp32 logits from bf16 activations, keeping the activations as they came for the backward:
    F.linear(x.float(), w) would keep the fp32 copy of x, T*D*4 bytes per layer (805 MB at
    T = 32k, D = 6144), when x itself is already kept by the shared experts."""

    @staticmethod
    def forward(ctx, x_TD: Tensor, w_ED: Tensor) -> Tensor:
        ctx.save_for_backward(x_TD, w_ED)
        return x_TD.float() @ w_ED.float().T

    @staticmethod
    def backward(ctx, dlogits_TE: Tensor):
        x_TD, w_ED = ctx.saved_tensors
        dx_TD = (dlogits_TE @ w_ED.float()).to(x_TD.dtype)
        dw_ED = (dlogits_TE.T @ x_TD.float()).to(w_ED.dtype)
        return dx_TD, dw_ED


def local_weight(w: Tensor) -> Tensor:
    """This rank's rows of an expert weight: the local shard of a DTensor (expert parallelism),
    else the tensor itself. Token counts per rank are dynamic, so the grouped GEMM runs on plain
    local tensors."""
    return w.to_local() if hasattr(w, "to_local") else w


def expert_ffn(x_PD: Tensor, w1_EFD: Tensor, w3_EFD: Tensor, w2_EDF: Tensor, offs_E: Tensor,
               w_P: Tensor | None = None) -> Tensor:
    """SwiGLU of each expert's group of rows of the expert-sorted buffer: three grouped GEMMs;
    with `w_P` (each row's router weight, 0 on padding rows), each output row scaled by it."""
    # grouped_mm wants each expert's matrix column-major: pass [E, D, F] views of [E, F, D].
    h_PF = F.silu(torch._grouped_mm(x_PD, w1_EFD.transpose(-2, -1), offs=offs_E))
    h_PF = h_PF * torch._grouped_mm(x_PD, w3_EFD.transpose(-2, -1), offs=offs_E)
    with output_projection():
        y_PD = torch._grouped_mm(h_PF, w2_EDF.transpose(-2, -1), offs=offs_E)
    # The product reads w2's output in its backward: selective checkpointing recomputes that
    # output anyway (it is an output projection), so nothing more is kept than before.
    return y_PD if w_P is None else y_PD * w_P.to(y_PD.dtype).unsqueeze(-1)


class _Place(torch.autograd.Function):
    """Each slot's value (a router weight) to its row of a buffer of `n_rows`, the other rows
    zero; the backward gathers the rows' gradients back (a permutation: no sum, reproducible).
    Rows past the buffer's useful part (the dropped slots' spare row) get no gradient once cut."""

    @staticmethod
    def forward(ctx, v_N: Tensor, row_N: Tensor, n_rows: int) -> Tensor:
        ctx.save_for_backward(row_N)
        v_P = v_N.new_zeros(n_rows)
        v_P.index_put_((row_N,), v_N)
        return v_P

    @staticmethod
    def backward(ctx, dv_P: Tensor):
        (row_N,) = ctx.saved_tensors
        return dv_P[row_N], None, None


def weighted_sum(y_RD: Tensor, row_TK: Tensor, w_TK: Tensor | None) -> Tensor:
    """Each token's K rows of `y_RD` summed in a fixed order; times the router weights first when
    they were not applied on the expert side (`w_TK`; MoEConfig.router_weights_on_experts False)."""
    y_TKD = y_RD[row_TK]
    if w_TK is not None:
        y_TKD = y_TKD * w_TK.to(y_TKD.dtype).unsqueeze(-1)
    return y_TKD.sum(1)


def expert_capacity(factor: float, slots: int, n_experts: int) -> int:
    """Slots one expert takes at most: ceil(factor x slots / E), `slots` the token-expert slots of
    the micro-batch (under expert parallelism, of the whole group's). 0 when `factor` is 0 (no
    bound). One formula for both paths, so they cut at the same count."""
    return math.ceil(factor * slots / n_experts) if factor else 0


class LocalExperts:
    """Every routed expert on this rank: tokens copied into the expert-sorted, padded buffer,
    three grouped GEMMs, each row scaled by its router weight after w2 (or, with
    `router_weights_on_experts` False, after the rows are gathered back), summed per token. `beside` (the shared experts)
    is computed after and added: routed + shared, in that order on every path."""

    def __call__(self, moe: "MoE", x_TD: Tensor, w_TK: Tensor, idx_TK: Tensor, counts_E: Tensor,
                 beside: Callable[[], Tensor] | None = None) -> Tensor:
        T, K = idx_TK.shape
        factor = moe.cfg.expert_capacity_factor
        if factor:
            return self._bounded(moe, x_TD, w_TK, idx_TK, counts_E, beside, expert_capacity(factor, T * K, counts_E.numel()))
        row_N, offs_E, n_rows = expert_layout(idx_TK, counts_E, moe.cfg.expert_align)
        x_PD = _Dispatch.apply(x_TD, row_N.view(T, K), n_rows)
        on_experts = moe.cfg.router_weights_on_experts
        w_P = _Place.apply(w_TK.reshape(-1), row_N, n_rows) if on_experts else None
        y_PD = expert_ffn(x_PD, local_weight(moe.w1_EFD), local_weight(moe.w3_EFD), local_weight(moe.w2_EDF),
                          offs_E, w_P)
        out_TD = weighted_sum(y_PD, row_N.view(T, K), None if on_experts else w_TK)
        return out_TD if beside is None else out_TD + beside()

    @staticmethod
    def _bounded(moe: "MoE", x_TD: Tensor, w_TK: Tensor, idx_TK: Tensor, counts_E: Tensor,
                 beside: Callable[[], Tensor] | None, capacity: int) -> Tensor:
        """The same path with each expert taking at most `capacity` slots, the first in token
        order; a dropped slot reads a zero row (its token keeps its other experts and the shared
        ones). No host sync: the buffer is sized by its static bound, as unbounded."""
        T, K = idx_TK.shape
        E, align = counts_E.numel(), moe.cfg.expert_align
        flat_N = idx_TK.reshape(-1)
        N = flat_N.numel()
        order_N = torch.argsort(flat_N, stable=True)
        sorted_N = flat_N[order_N]
        start_E = torch.cumsum(counts_E, 0) - counts_E
        rank_N = torch.arange(N, device=flat_N.device) - start_E[sorted_N]  # place within its expert
        kept_sorted = rank_N < capacity
        kept_E = counts_E.clamp(max=capacity)
        padded_E = (kept_E + align - 1) // align * align
        offs_E = torch.cumsum(padded_E, 0, dtype=torch.int32)
        n_rows = N + (align - 1) * E  # the static bound (a spare row past it takes the dropped)
        row_N = torch.empty_like(order_N)
        row_N[order_N] = torch.where(kept_sorted, (offs_E - padded_E)[sorted_N] + rank_N, n_rows)
        x_PD = _Dispatch.apply(x_TD, row_N.view(T, K), n_rows + 1)[:n_rows]
        on_experts = moe.cfg.router_weights_on_experts
        # a dropped slot's weight lands on the spare row, cut off: no output, no gradient
        w_P = _Place.apply(w_TK.reshape(-1), row_N, n_rows + 1)[:n_rows] if on_experts else None
        y_PD = expert_ffn(x_PD, local_weight(moe.w1_EFD), local_weight(moe.w3_EFD), local_weight(moe.w2_EDF),
                          offs_E, w_P)
        y_PD = torch.cat([y_PD, y_PD.new_zeros(1, y_PD.shape[1])])  # the dropped slots' zero row
        if moe.training and not _recomputing():
            moe.routed_slots += N
            moe.dropped_slots += N - kept_sorted.sum()
        out_TD = weighted_sum(y_PD, row_N.view(T, K), None if on_experts else w_TK)
        return out_TD if beside is None else out_TD + beside()


def _recomputing() -> bool:
    """True inside the backward pass, where an activation-checkpointed block runs its forward
    again: side effects of the first pass (expert loads) must not happen twice."""
    return torch._C._current_graph_task_id() != -1


class MoE(nn.Module):
    """Routed experts (3-D weights, grouped matmul) plus shared experts."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        E, D, F_ = cfg.n_experts, cfg.dim, cfg.expert_dim
        self.router = nn.Linear(D, E, bias=False)
        self.w1_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.w3_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.w2_EDF = nn.Parameter(torch.empty(E, D, F_))
        hidden = cfg.n_shared_experts * cfg.shared_expert_dim
        self.shared = FeedForward(D, hidden) if hidden else None
        self.register_buffer("expert_bias_E", torch.zeros(E))
        # Tokens sent to each expert since the last bias update; summed over micro-batches.
        self.register_buffer("expert_load_E", torch.zeros(E), persistent=False)
        # Token-expert assignments this rank sent and dropped past the rank capacity, since the
        # last metrics row (steps/moe/expert_parallel.py; `take_dropped` reads and resets them).
        self.register_buffer("routed_slots", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("dropped_slots", torch.zeros((), dtype=torch.int64), persistent=False)
        self.experts: Callable[..., Tensor] = LocalExperts()  # AllToAllExperts under expert parallelism

    def forward(self, x_BSD: Tensor) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        x_TD = x_BSD.reshape(-1, x_BSD.shape[-1])
        logits_TE = _RouterLogits.apply(x_TD, self.router.weight)
        r = route(logits_TE, self.expert_bias_E, cfg.top_k, cfg.score_func, cfg.renormalize,
                  cfg.route_scale, cfg.router_impl)
        if self.training and not _recomputing():
            with torch.no_grad():
                self.expert_load_E += r.counts_E
        shared = (lambda: self.shared(x_TD)) if self.shared is not None else None
        out_TD = self.experts(self, x_TD, r.weights_TK, r.indices_TK, r.counts_E, beside=shared)
        loss = cfg.z_loss_coef * z_loss(r.lse_T)
        if cfg.aux_loss_coef:
            loss = loss + cfg.aux_loss_coef * aux_balance_loss(r.counts_E, r.score_sums_E, cfg.top_k)
        return out_TD.view_as(x_BSD), loss



class Block(nn.Module):
    def __init__(self, cfg: MoEConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.moe_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe = MoE(cfg)
        # None: keep activations; else the context_fn of a non-reentrant torch.utils.checkpoint
        # that recomputes this block in the backward (steps/train/recompute.py).
        self.recompute: Callable | None = None

    def forward(self, x_BSD: Tensor, cos_SR: Tensor, sin_SR: Tensor) -> tuple[Tensor, Tensor]:
        if self.recompute is None:
            return self._forward(x_BSD, cos_SR, sin_SR)
        return checkpoint(self._forward, x_BSD, cos_SR, sin_SR, use_reentrant=False, context_fn=self.recompute)

    def _forward(self, x_BSD: Tensor, cos_SR: Tensor, sin_SR: Tensor) -> tuple[Tensor, Tensor]:
        x_BSD = x_BSD + self.attn(self.attn_norm(x_BSD), cos_SR, sin_SR)
        h_BSD, router_loss = self.moe(self.moe_norm(x_BSD))
        return x_BSD + h_BSD, router_loss


class MoETransformer(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = Head(cfg.dim, cfg.vocab_size, cfg.loss_chunk)  # nn.Linear, and the fused loss

    def init_std(self, fqn: str, shape: tuple[int, ...]) -> float | None:
        """The initial standard deviation of a parameter, by name: init_std, output projections
        scaled by 1/sqrt(2L); None (ones) for norm gains."""
        if len(shape) == 1:
            return None
        if fqn.endswith(("wo.weight", "w2.weight", "w2_EDF")):
            return self.cfg.init_std / (2 * self.cfg.n_layers) ** 0.5
        return self.cfg.init_std

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Every parameter drawn by name and seed (steps/moe/init.py), shard by shard when the
        model is sharded: the same values on any mesh. Expert biases and loads at zero."""
        init_by_name(self, seed, self.init_std)
        for block in self.blocks:
            block.moe.expert_bias_E.zero_()
            block.moe.expert_load_E.zero_()
            block.moe.routed_slots.zero_()
            block.moe.dropped_slots.zero_()

    def forward(self, tokens_BS: Tensor, targets_BS: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Logits [B, S, V] and the router loss summed over layers; with `targets_BS`, the mean
        cross-entropy (fp32, the head fused with the loss: steps/moe/head.py) instead of the
        logits."""
        S = tokens_BS.shape[1]
        cos_SR, sin_SR = rope_tables(S, self.cfg.head_dim, self.cfg.rope_theta, tokens_BS.device)
        x_BSD = self.embed(tokens_BS)
        router_loss = x_BSD.new_zeros((), dtype=torch.float32)
        for block in self.blocks:
            x_BSD, layer_loss = block(x_BSD, cos_SR, sin_SR)
            router_loss = router_loss + layer_loss
        return self.head(self.norm(x_BSD), targets_BS), router_loss

    def loss(self, tokens_BS: Tensor, targets_BS: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Cross-entropy plus router losses, and the parts for logging."""
        ce, router_loss = self(tokens_BS, targets_BS)
        return ce + router_loss, {"ce": ce.detach(), "router": router_loss.detach()}

    def moe_layers(self) -> list[MoE]:
        return [block.moe for block in self.blocks]


def count_params(cfg: MoEConfig) -> tuple[int, int]:
    """(total, active) parameters, from a model built on the meta device. Active counts what one
    token uses: everything except the routed experts it is not sent to (embeddings included)."""
    with torch.device("meta"):
        model = MoETransformer(cfg)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("_EFD", "_EDF")))
    idle = routed // cfg.n_experts * (cfg.n_experts - cfg.top_k)
    return total, total - idle
