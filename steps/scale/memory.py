"""Per-GPU memory of a mesh in closed form: the shards each rank holds, what a block keeps for
its backward, and the transient buffers. Torch-free, so a voyage can check a mesh and a search
can rank thousands of them; `steps.scale.measure` reads the same figures from the real model
(shards in a fake process group, activations traced), and tests hold the two equal.

Symbols (the model's shape legend): T tokens of a micro-batch on one rank, C context, K experts
per token, N = T*K token-expert slots, D width, H/G query/key-value heads of width A, E routed
experts, e = E/ep of them on a rank, F routed expert width, Fs the shared experts' width summed,
V vocabulary, a = expert_align, Q = N + (a-1)*e rows of the received, per-expert padded buffer.

Shards follow steps/train/parallel.py: every dense parameter `Shard(0)` over dp_shard (FSDP2;
replicated across dp_replicate), routed experts `Shard(0)` over ep, then FSDP2 over
efsdp = dp_shard/ep, on dim 1 when efsdp exceeds the experts a rank holds. FSDP2 pads a shard to
ceil(rows / ranks), which is what the largest rank holds and what every rank allocates.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from steps.scale.hardware import NCCL_BUFFSIZE, NCCL_CHANNELS, NCCL_CONNECTION_BYTES, NCCL_P2P_CHANNELS_PER_PEER

MODES = ("none", "selective", "full")
BF16, FP32, I64 = 2, 4, 8


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Mesh:
    """A resolved mesh: dp_replicate x dp_shard ranks, ep of them sharing the experts."""

    dp_replicate: int
    dp_shard: int
    ep: int

    @property
    def efsdp(self) -> int:
        return self.dp_shard // self.ep

    @property
    def ranks(self) -> int:
        return self.dp_replicate * self.dp_shard


def dense_block_shapes(cfg: Any) -> list[tuple[int, ...]]:
    """Every parameter of a block but the routed experts, FSDP2's order aside."""
    d, q, kv, fs = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, \
        cfg.n_shared_experts * cfg.shared_expert_dim
    shapes = [(d,), (q, d), (kv, d), (kv, d), (d, q), (d,), (cfg.n_experts, d)]
    if fs:
        shapes += [(fs, d), (fs, d), (d, fs)]
    return shapes


def expert_shapes(cfg: Any) -> list[tuple[int, int, int]]:
    e, f, d = cfg.n_experts, cfg.expert_dim, cfg.dim
    return [(e, f, d), (e, f, d), (e, d, f)]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _sharded(shape: tuple[int, ...], dim: int, ranks: int) -> int:
    """Elements of the largest shard of `shape` split over `ranks` along `dim` (padded)."""
    rows = ceil_div(shape[dim], ranks)
    return _numel(shape[:dim] + (rows,) + shape[dim + 1:])


@dataclass(frozen=True)
class Shards:
    """Elements each rank holds (the largest rank; FSDP2 pads the others to it), by unit."""

    dense_per_block: int
    experts_per_block: int
    embed: int
    head: int  # final norm + output head

    def total(self, n_layers: int) -> int:
        return n_layers * (self.dense_per_block + self.experts_per_block) + self.embed + self.head


@functools.lru_cache(maxsize=4096)
def shards(cfg: Any, mesh: Mesh) -> Shards:
    """The closed form of what `parallelize` leaves on the largest rank."""
    s = mesh.dp_shard
    dense = sum(_sharded(shape, 0, s) for shape in dense_block_shapes(cfg))
    local_experts = cfg.n_experts // mesh.ep
    fsdp = mesh.efsdp
    experts = 0
    for e_, a, b in expert_shapes(cfg):
        local = (local_experts, a, b)
        experts += _sharded(local, 1, fsdp) if fsdp > local_experts else _sharded(local, 0, fsdp)
    embed = _sharded((cfg.vocab_size, cfg.dim), 0, s)
    head = _sharded((cfg.dim,), 0, s) + _sharded((cfg.vocab_size, cfg.dim), 0, s)
    return Shards(dense_per_block=dense, experts_per_block=experts, embed=embed, head=head)


def gathered_block(sh: Shards, mesh: Mesh) -> int:
    """Elements of one block's weights as FSDP2 gathers them on a rank (padded rows included):
    the dense part whole, and this rank's e experts."""
    return sh.dense_per_block * mesh.dp_shard + sh.experts_per_block * mesh.efsdp


# -- activations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    """The sizes one block sees on one rank at a micro-batch."""

    T: int  # tokens
    C: int  # context
    N: int  # token-expert slots
    Q: int  # rows of the padded expert buffer
    e: int  # experts on this rank
    ep: int

    @classmethod
    def of(cls, cfg: Any, microbatch: int, context: int, ep: int) -> "Tokens":
        T = microbatch * context
        N = T * cfg.top_k
        e = cfg.n_experts // ep
        return cls(T=T, C=context, N=N, Q=N + (cfg.expert_align - 1) * e, e=e, ep=ep)


def _windowed(cfg: Any, layer: int, context: int) -> bool:
    return not cfg.is_global(layer) and cfg.sliding_window < context


def kept_bytes(cfg: Any, layer: int, t: Tokens, mode: str) -> int:
    """Bytes block `layer` holds from its forward to its backward (its input included), as the
    CPU kernels keep them (RMSNorm's fp32 parts; steps/scale/trace.py)."""
    D, F, E, K = cfg.dim, cfg.expert_dim, cfg.n_experts, cfg.top_k
    HA, GA, H = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_heads
    Fs = cfg.n_shared_experts * cfg.shared_expert_dim
    T, N, Q = t.T, t.N, t.Q
    on_experts = getattr(cfg, "router_weights_on_experts", True)
    if mode == "full":
        return BF16 * T * D
    if mode == "selective":  # the outputs of steps/train/recompute.py's saved ops, and the input
        mm = T * (HA + 2 * GA) + 2 * T * Fs  # q, k, v; shared gate and up (output projections recomputed)
        grouped = 2 * Q * F  # expert gate and up
        sdpa = BF16 * T * HA + FP32 * H * T  # output, log-sum-exp
        # the tokens sent (and their router weights, fp32) and the counts; the combine's output
        # only when the weights are applied after it (combine_kept_bytes)
        a2a = (BF16 * N * D + (FP32 * N if on_experts else BF16 * N * D) + 4 * E) if t.ep > 1 else 0
        return BF16 * (T * D + mm + grouped) + FP32 * T * E + sdpa + a2a
    if mode != "none":
        raise ValueError(f"checkpointing must be one of {MODES}, got {mode!r}")
    kv = 2 * T * (HA if _windowed(cfg, layer, t.C) else GA)  # keys and values (repeated to H heads under a window)
    mask = BF16 * t.C * t.C if _windowed(cfg, layer, t.C) else 0
    shared = 4 * T * Fs  # w1 and w3 outputs, SiLU, product
    # the expert path keeps its input rows, 4 [Q, F] and what the router weights multiply with
    # their weights: w2's output rows [Q, D] on the expert side, else the gathered rows [N, D]
    weighted = Q * D + Q if on_experts else N * D + T * K
    bf16 = T * D + Q * D + 4 * Q * F + 2 * T * D + 3 * T * HA + shared + kv + weighted  # input first
    fp32 = 4 * T * D + 2 * T * E + T * K + H * T + 4 * T  # norms' fp32 parts, logits, scores, lse...
    index = T * K + (2 if t.ep > 1 else 1) * N  # top-k indices, slot rows
    offsets = 4 * t.e
    return BF16 * bf16 + FP32 * fp32 + I64 * index + offsets + mask


def combine_kept_bytes(cfg: Any, t: Tokens, mode: str) -> int:
    """Bytes a block keeps when the router weights are applied after the combine all-to-all
    rather than on the expert side after w2 (MoEConfig.router_weights_on_experts), over what it
    keeps with them on the expert side: what applying them on the expert side saves (negative:
    costs). Selective checkpointing under expert parallelism keeps the combine's output, [N, D]
    bf16, for the weights' gradient, less the fp32 weights sent along; without checkpointing the
    gathered [N, D] rows replace w2's padded [Q, D] ones; full keeps neither."""
    import dataclasses

    old = dataclasses.replace(cfg, router_weights_on_experts=False) if hasattr(cfg, "router_weights_on_experts") \
        else cfg
    new = dataclasses.replace(cfg, router_weights_on_experts=True) if hasattr(cfg, "router_weights_on_experts") \
        else cfg
    return kept_bytes(old, 0, t, mode) - kept_bytes(new, 0, t, mode)


def weight_grad_bytes(cfg: Any, mesh: Mesh) -> int:
    """bf16 gradients of one block's gathered weights: alive at the end of its backward until
    FSDP2 reduce-scatters them."""
    return BF16 * gathered_block(shards(cfg, mesh), mesh)


def working_bytes(cfg: Any, layer: int, t: Tokens, mode: str, mesh: Mesh) -> int:
    """The peak above `kept_bytes` while block `layer`'s backward runs: its weights' gradients,
    what it recomputes (everything it did not keep), and the activation gradients of the expert
    path, about three token-expert buffers [N, D] in flight. The traced figure is the plan's
    record; this is the search's estimate (tests hold it to the trace within 30%)."""
    slots = BF16 * t.N * cfg.dim
    grads = weight_grad_bytes(cfg, mesh)
    if mode == "none":  # + the weights' gradient beside w2's kept output rows, router weights on the expert side
        return grads + slots + (BF16 * t.Q * cfg.dim if getattr(cfg, "router_weights_on_experts", True) else 0)
    recomputed = kept_bytes(cfg, layer, t, "none") - kept_bytes(cfg, layer, t, mode)
    if mode == "full":
        recomputed += BF16 * t.T * cfg.dim  # the input is kept, and the recompute makes its own copy
    return grads + recomputed + 3 * slots


def head_bytes(cfg: Any, microbatch: int, context: int) -> int:
    """The peak of the final norm and the head fused with the cross-entropy (steps/moe/head.py:
    c = loss_chunk vocabulary rows at a time), above its inputs: the head's weight gradient
    (bf16 [V, D], allocated whole at the backward's start) plus the largest of three moments of
    the backward, as the trace finds them: inside a chunk (its logits, their fp32 copy, the
    softmax and its bf16 gradient: 14 bytes a logit, beside dh in fp32 and the saved input),
    after the chunks (dh cast back and the norm's backward), and a chunk's weight-gradient
    matmul on a short micro-batch (its [c, D] output beside the softmax and its gradient).
    Unchunked (c = V) this was 12 x T x V: 6.3 GB at 535B and micro-batch 1, now 0.4 GB."""
    T, V, D = microbatch * context, cfg.vocab_size, cfg.dim
    c = min(getattr(cfg, "loss_chunk", V), V)
    in_chunk = T * ((14 if c < V else 10) * c + 8 * D)  # one chunk: no chunk's log-sum-exp to combine
    after = T * 18 * D
    weight_grad = 6 * T * c + 2 * c * D + 8 * T * D
    return BF16 * V * D + max(in_chunk, after, weight_grad) + 13 * T


def imbalance_bytes(cfg: Any, t: Tokens, mode: str, load_mean: float, load_peak: float) -> int:
    """Headroom for dropless routing on the busiest rank of an expert-parallel group: the
    received-side rows every block keeps at `load_mean` times the mean (summed over layers, the
    busiest rank is not the same one in every layer), and the expert path's working buffers of
    one block at `load_peak` times the mean (its worst micro-batch)."""
    if t.ep == 1:
        return 0
    D, F = cfg.dim, cfg.expert_dim
    # bf16 elements kept per received row: its copy and the [Q, F] products; with the router
    # weights on the expert side also w2's output row and the weight (bf16; selective: fp32 as sent)
    on = getattr(cfg, "router_weights_on_experts", True)
    kept_row = {"none": D + 4 * F + (D + 1 if on else 0), "selective": D + 2 * F + (2 if on else 0), "full": 0}[mode]
    kept = max(0.0, load_mean - 1) * t.N * cfg.n_layers * kept_row
    working = max(0.0, load_peak - 1) * t.N * 4 * D
    return int(BF16 * (kept + working))


def nccl_bytes(mesh: Mesh) -> tuple[float, float]:
    """(the expert all-to-all's point-to-point buffers, the collectives' ring buffers) NCCL holds
    on one rank (steps/scale/hardware.py: the documented sizes): every other rank of the ep group
    a peer, a send and a receive connection each; one communicator a process group of more than
    one rank (dp_shard, ep and dp_replicate: torch opens one for each), two ring neighbours each."""
    p2p = (mesh.ep - 1) * 2 * NCCL_P2P_CHANNELS_PER_PEER * NCCL_BUFFSIZE
    groups = sum(size > 1 for size in (mesh.dp_shard, mesh.ep, mesh.dp_replicate))
    return float(p2p), float(groups * 2 * NCCL_CHANNELS * NCCL_CONNECTION_BYTES)
