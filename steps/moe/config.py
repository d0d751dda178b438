"""The MoE model's config and presets, without torch (voyages import this to plan).

`param_counts` is the closed form of the parameter count; `steps.moe.model.count_params` counts
the same on the meta device, and a test holds the two equal for every preset.
"""

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """The whole model in one value; the defaults are the 535B-A23B shape (docs/moe.md explains
    how its public figures are read)."""

    vocab_size: int = 128_256
    dim: int = 6144
    n_layers: int = 48
    n_heads: int = 48
    n_kv_heads: int = 16
    head_dim: int = 128
    sliding_window: int = 2048  # 0 makes every layer global
    global_every: int = 4  # layers global_every-1, 2*global_every-1, ... are global
    n_experts: int = 384
    top_k: int = 8
    expert_dim: int = 1536  # per-matrix width; "width 3072" is the fused gate+up projection
    expert_align: int = 8  # rows per expert padded to a multiple: 16-byte group starts in bf16
    n_shared_experts: int = 2
    shared_expert_dim: int = 3072
    score_func: str = "sigmoid"
    renormalize: bool = True
    route_scale: float = 1.0
    router_impl: str = "auto"  # "auto", "fused" or "reference" (steps/moe/router.py)
    # Under expert parallelism, the rows a rank's experts take in one forward, at most this times
    # the mean (the N = T*K slots every rank sends); past it, assignments are dropped (counted in
    # the step's metrics: moe_dropped). 0: unbounded, dropless whatever the skew.
    rank_capacity_factor: float = 0.0
    # Each expert takes at most ceil(this x N / E) of a micro-batch's N = T*K slots (the anchor's
    # capacity factor 1.15); the expert's slots past it, the last tokens, are dropped and counted
    # (moe_dropped, per layer in health). 0: no per-expert bound. Under expert parallelism N is the
    # group's slots and the cut is taken before rank_capacity_factor's (steps/moe/expert_parallel.py).
    expert_capacity_factor: float = 0.0
    # Where each routed row is scaled by its router weight: True, on the expert side right after
    # w2 (the weights travel with the dispatch), so the backward never reads the combine's output
    # and no checkpointing mode keeps it; False, after the combine on the token's rank (the older
    # formulation: its output kept for the weights' gradient, N*D per block). Same numbers.
    router_weights_on_experts: bool = True
    # The head and the cross-entropy run fused, this many vocabulary rows at a time: no [T, V]
    # logits are ever whole (steps/moe/head.py); the same value and gradient as unchunked.
    loss_chunk: int = 8192
    z_loss_coef: float = 1e-4
    aux_loss_coef: float = 0.0
    bias_update_rate: float = 1e-3
    max_seq_len: int = 4096  # the context the trainer feeds; rotary tables are built per call
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self):
        if self.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be softmax or sigmoid, got {self.score_func!r}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must lie in [1, n_experts={self.n_experts}]")
        if self.loss_chunk < 1:
            raise ValueError(f"loss_chunk must be >= 1, got {self.loss_chunk}")
        if self.rank_capacity_factor and self.rank_capacity_factor < 1:
            raise ValueError(f"rank_capacity_factor must be 0 (unbounded) or >= 1, got {self.rank_capacity_factor}")
        if self.expert_capacity_factor and self.expert_capacity_factor < 1:
            raise ValueError(f"expert_capacity_factor must be 0 (unbounded) or >= 1, got {self.expert_capacity_factor}")
        if self.n_heads % self.n_kv_heads or self.head_dim % 2 or self.expert_align < 1:
            raise ValueError("n_heads must be a multiple of n_kv_heads, head_dim even, expert_align >= 1")

    def is_global(self, layer: int) -> bool:
        return self.sliding_window <= 0 or (layer + 1) % self.global_every == 0


_BIG = MoEConfig()
PRESETS: dict[str, MoEConfig] = {
    "tiny": dataclasses.replace(
        _BIG, vocab_size=512, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
        sliding_window=8, global_every=2, n_experts=8, top_k=2, expert_dim=32,
        n_shared_experts=1, shared_expert_dim=64, max_seq_len=64),
    "small": dataclasses.replace(
        _BIG, dim=1024, n_layers=12, n_heads=16, n_kv_heads=4, head_dim=64, n_experts=64,
        expert_dim=256, n_shared_experts=1, shared_expert_dim=512),
    "medium": dataclasses.replace(
        _BIG, dim=2048, n_layers=24, n_heads=16, n_kv_heads=4, head_dim=128, n_experts=128,
        expert_dim=512, n_shared_experts=2, shared_expert_dim=1024),
    # dropless up to 1.25x the mean rows a rank (the plan's buffers), then dropped
    "535b-a23b": dataclasses.replace(_BIG, rank_capacity_factor=1.25),
}


def param_counts(cfg: MoEConfig) -> tuple[int, int]:
    """(total, active) parameters. Active is what one token uses: everything but the routed
    experts it is not sent to (both embedding matrices included)."""
    d, a = cfg.dim, cfg.head_dim
    attn = d * a * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    expert = 3 * d * cfg.expert_dim
    shared = 3 * d * cfg.shared_expert_dim * cfg.n_shared_experts
    per_layer = attn + d * cfg.n_experts + shared + 2 * d  # + router + shared experts + 2 norms
    embeddings = 2 * cfg.vocab_size * d
    total = cfg.n_layers * (per_layer + cfg.n_experts * expert) + embeddings + d
    active = cfg.n_layers * (per_layer + cfg.top_k * expert) + embeddings + d
    return total, active


def mean_keys(context: int, window: int) -> float:
    """Keys a query attends to, averaged over the positions of a causal sequence of `context`
    tokens, when each query sees at most `window` keys (itself included): the mean over
    i = 0..C-1 of min(i + 1, W), in closed form."""
    if context <= 0:
        return 0.0
    w = min(window, context) if window > 0 else context
    return (w * (w + 1) / 2 + (context - w) * w) / context


def flops_per_token(cfg: MoEConfig, context: int) -> float:
    """Training FLOPs per target token (forward + backward), the one formula behind the trainer's
    MFU and the voyage's budget: 6 x the active matmul parameters (the input embedding is a
    lookup, not a matmul; the output head counts) plus attention scores and values,
    12 x heads x head_dim x the mean number of keys a query sees, summed over layers. Recomputed
    activations are not model FLOPs and are not counted."""
    _, active = param_counts(cfg)
    matmul = active - cfg.vocab_size * cfg.dim
    attn = sum(12 * cfg.n_heads * cfg.head_dim * mean_keys(context, 0 if cfg.is_global(i) else cfg.sliding_window)
               for i in range(cfg.n_layers))
    return 6.0 * matmul + attn
