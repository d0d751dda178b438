"""Per optimizer step: the bytes each collective moves from one GPU, its time on its link class,
what it overlaps, and the step's time next to its compute at an assumed MFU. Torch-free.

Collectives (steps/train/parallel.py, steps/moe/expert_parallel.py):
- expert all-to-all, inside a rack on NVLink: per layer and micro-batch, dispatch and combine
  in the forward, their reverses in the backward, and again in a `full` recompute (selective
  keeps their outputs); each moves a rank's N*D bf16 rows, all but the 1/ep that stay. On the
  critical path: the tokens are needed right away (exposed).
- FSDP2 all-gather (bf16 weights, forward and backward) and reduce-scatter (fp32 gradients)
  per block and micro-batch, over dp_shard (efsdp for expert weights), inside a rack: hidden
  behind the block's compute (one block prefetched), exposed only where a block's share of
  them takes longer than its compute.
- HSDP all-reduce of the sharded fp32 gradients across dp_replicate, once a step (after the
  last micro-batch): across racks on the network (within a rack on NVLink when one rack holds
  several replicas: reduce-scatter in the rack, all-reduce across racks, all-gather in the
  rack). It runs during the last micro-batch's backward (block by block), so only what exceeds
  that backward is exposed.
- optimizer state on the host: its Adam moments cross NVLink-C2C both ways once a step
  (exposed).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from steps.moe.config import flops_per_token as _flops_per_token, mean_keys
from steps.scale.hardware import Hardware
from steps.scale.memory import BF16, FP32, Mesh, Shards, shards


@functools.lru_cache(maxsize=256)
def block_flops_per_token(cfg: Any, context: int) -> tuple[float, float]:
    """(forward FLOPs of all blocks, forward FLOPs of the routed experts) per token: a third of
    the training FLOPs of the blocks (forward + backward = 3 forwards)."""
    d = cfg.dim
    attn_w = d * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    shared = 3 * d * cfg.shared_expert_dim * cfg.n_shared_experts
    routed = cfg.top_k * 3 * d * cfg.expert_dim
    matmul = cfg.n_layers * (attn_w + d * cfg.n_experts + shared + routed)
    attn = sum(4 * cfg.n_heads * cfg.head_dim * mean_keys(context, 0 if cfg.is_global(i) else cfg.sliding_window)
               for i in range(cfg.n_layers))
    return 2.0 * matmul + attn, 2.0 * cfg.n_layers * routed


@functools.lru_cache(maxsize=256)
def recompute_flops_per_token(cfg: Any, context: int, mode: str) -> float:
    """FLOPs a checkpointing mode runs again in the backward, per token: `full` the blocks'
    whole forward; `selective` the output projections (attention's wo, the shared and routed
    experts' w2), whose outputs it does not keep (steps/train/recompute.py)."""
    if mode == "none":
        return 0.0
    if mode == "full":
        return block_flops_per_token(cfg, context)[0]
    d = cfg.dim
    wo = d * cfg.n_heads * cfg.head_dim
    w2 = d * cfg.shared_expert_dim * cfg.n_shared_experts + cfg.top_k * d * cfg.expert_dim
    return 2.0 * cfg.n_layers * (wo + w2)


@dataclass(frozen=True)
class Collective:
    """One kind of collective over a step, for one GPU."""

    name: str
    link: str  # "nvlink", "network", "host"
    group: str  # the mesh dimension it runs over, in words
    bytes: float  # sent by one GPU over the step (each way)
    calls: int
    seconds: float  # on its link at the assumed efficiency, latency included
    exposed: float  # what the step waits for
    overlap: str  # what hides it, in words


@dataclass(frozen=True)
class StepTime:
    compute: float  # model FLOPs at the assumed MFU
    imbalance: float  # the busiest rank's extra routed-expert work
    recompute: float  # FLOPs of the checkpointing mode at the same rate
    collectives: tuple[Collective, ...]
    optimizer: float  # the AdamW update, memory-bound

    @property
    def exposed(self) -> float:
        return sum(c.exposed for c in self.collectives)

    @property
    def total(self) -> float:
        return self.compute + self.imbalance + self.recompute + self.exposed + self.optimizer


flops_per_token = functools.lru_cache(maxsize=256)(_flops_per_token)


def _ring(ranks: int) -> float:
    """Share of a buffer each rank sends in a ring all-gather or reduce-scatter."""
    return (ranks - 1) / ranks if ranks > 1 else 0.0


def step_time(cfg: Any, mesh: Mesh, hw: Hardware, *, context: int, share: int, microbatch: int,
              checkpointing: str, mfu: float, replicas_per_rack: int, racks: int,
              optimizer_on_host: bool, load: float, sh: Shards | None = None) -> StepTime:
    """The time of one optimizer step on one GPU. `share` sequences a rank per step, `microbatch`
    of them per forward; `replicas_per_rack`: dp_shard groups that share a rack; `racks` the racks
    the mesh spans; `load` the busiest expert-parallel rank's rows over the mean; `sh` the shards
    (measured, or by default the closed form)."""
    micro = share // microbatch
    tokens = share * context  # per rank per step
    mb_tokens = microbatch * context
    rate = hw.peak_flops * mfu
    fpt = flops_per_token(cfg, context)
    block_fwd, routed_fwd = block_flops_per_token(cfg, context)
    compute = tokens * fpt / rate
    imbalance = tokens * 3 * routed_fwd * (load - 1) / rate if mesh.ep > 1 else 0.0
    recompute = tokens * recompute_flops_per_token(cfg, context, checkpointing) / rate
    lat = hw.collective_latency_us * 1e-6
    L = cfg.n_layers
    out: list[Collective] = []

    if mesh.ep > 1:  # dispatch + combine, forward + backward (+ forward again under full)
        per_call = BF16 * mb_tokens * cfg.top_k * cfg.dim * _ring(mesh.ep) * load
        calls = L * micro * (6 if checkpointing == "full" else 4)
        seconds = calls * (per_call / hw.link_bytes_per_s("nvlink") + lat)
        out.append(Collective("expert all-to-all", "nvlink", f"ep {mesh.ep}", calls * per_call, calls, seconds,
                              seconds, "none: its tokens are needed next"))

    sh = sh or shards(cfg, mesh)
    dense_full = sh.dense_per_block * mesh.dp_shard
    expert_full = sh.experts_per_block * mesh.efsdp
    ag_block = BF16 * (dense_full * _ring(mesh.dp_shard) + expert_full * _ring(mesh.efsdp))
    rs_block = FP32 * (dense_full * _ring(mesh.dp_shard) + expert_full * _ring(mesh.efsdp))
    ends = (sh.embed + sh.head) * mesh.dp_shard
    ag_ends, rs_ends = BF16 * ends * _ring(mesh.dp_shard), FP32 * ends * _ring(mesh.dp_shard)
    link_s = hw.link_bytes_per_s("nvlink")
    if ag_block or ag_ends:
        per_block_fwd = mb_tokens * block_fwd / L / rate
        per_block_bwd = 2 * per_block_fwd + mb_tokens * recompute_flops_per_token(cfg, context, checkpointing) / L / rate
        ag_t, rs_t = ag_block / link_s, rs_block / link_s
        exposed_mb = L * (max(0.0, ag_t - per_block_fwd) + max(0.0, ag_t + rs_t - per_block_bwd)) + ag_t
        ag_calls = micro * (2 * L + 3)
        rs_calls = micro * (L + 2)
        ag_bytes = micro * (2 * L * ag_block + 2 * ag_ends)
        rs_bytes = micro * (L * rs_block + rs_ends)
        ag_s = ag_bytes / link_s + ag_calls * lat
        rs_s = rs_bytes / link_s + rs_calls * lat
        share_ag = ag_s / (ag_s + rs_s) if ag_s + rs_s else 0.0
        exposed = micro * (exposed_mb + (ag_ends + rs_ends) / link_s)
        out.append(Collective("FSDP all-gather (bf16 weights)", "nvlink", f"dp_shard {mesh.dp_shard}"
                              + (f", efsdp {mesh.efsdp}" if mesh.efsdp > 1 else ""), ag_bytes, ag_calls, ag_s,
                              exposed * share_ag, "the previous block's compute (one block prefetched)"))
        out.append(Collective("FSDP reduce-scatter (fp32 grads)", "nvlink", f"dp_shard {mesh.dp_shard}", rs_bytes,
                              rs_calls, rs_s, exposed * (1 - share_ag), "the next block's backward"))

    if mesh.dp_replicate > 1:  # hierarchical: in the rack first, then across racks
        grad_bytes = FP32 * sh.total(L)
        in_rack = min(replicas_per_rack, mesh.dp_replicate)
        nv_bytes = 2 * grad_bytes * _ring(in_rack)
        net_bytes = 2 * grad_bytes / in_rack * _ring(racks)
        last_bwd = (mb_tokens * (2 * block_fwd) + mb_tokens * recompute_flops_per_token(cfg, context, checkpointing)) / rate
        net_s = net_bytes / hw.link_bytes_per_s("network") + (2 * L * lat if racks > 1 else 0.0)
        nv_s = nv_bytes / link_s + (2 * L * lat if in_rack > 1 else 0.0)
        hidden = last_bwd
        if nv_bytes:
            out.append(Collective("HSDP all-reduce, in the rack (fp32 grads)", "nvlink",
                                  f"dp_replicate {in_rack} in a rack", nv_bytes, 2 * L, nv_s,
                                  max(0.0, nv_s - hidden), "the last micro-batch's backward"))
            hidden = max(0.0, hidden - nv_s)
        if net_bytes:
            out.append(Collective("HSDP all-reduce, across racks (fp32 grads)", "network",
                                  f"dp_replicate over {racks} racks", net_bytes, L, net_s,
                                  max(0.0, net_s - hidden), "the last micro-batch's backward"))

    params = sh.total(L)
    if optimizer_on_host:
        moved = 2 * FP32 * params  # both moments, each way
        seconds = moved / hw.link_bytes_per_s("host")
        out.append(Collective("Adam moments host <-> GPU", "host", "NVLink-C2C", moved, 2, seconds, seconds,
                              "none (before and after the update)"))
    optimizer = params * (3 * FP32 + 4 * FP32) / (hw.hbm_tbps * 1e12)  # read p, g, m, v; write p, m, v
    return StepTime(compute=compute, imbalance=imbalance, recompute=recompute, collectives=tuple(out),
                    optimizer=optimizer)
