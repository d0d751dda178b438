"""Per optimizer step: the FLOPs a GPU executes, the bytes each collective moves from it, its
time on its link class, what hides it, and the step's time at a kernel efficiency. Torch-free.

The efficiency is the share of peak the kernels reach *while computing*; every FLOP the step
executes runs at it: the model's FLOPs (the trainer's count), the routed experts' extra rows
(dropless: the busiest rank's excess; with a capacity factor: every rank's padding), attention
over keys a mask discards, and the recompute of activation checkpointing. Communication and the
optimizer take their own time, less what overlaps. `steps/scale/anchor.py` solves for the
efficiency that makes the anchor's configuration take its published step.

Host syncs: the expert dispatch reads its split sizes on the host once a block and micro-batch,
again in a recompute; each costs `Hardware.host_sync_us` of idle GPU (assumed) and is charged to
the step (`StepTime.host_sync`).

Collectives (steps/train/parallel.py, steps/moe/expert_parallel.py):
- expert all-to-all, inside a rack on NVLink: per layer and micro-batch, dispatch and combine
  in the forward, their reverses in the backward, and the dispatch again in a `full` recompute
  (selective keeps its output; the combine is not sent again, no backward reads its output with
  the router weights applied on the expert side; the older formulation, `Stack.weights_on_experts`
  False, sends the pair again); each moves a rank's N*D bf16 rows, all but the 1/ep that stay, at
  the busiest rank's load. Beside the dispatch, the router weights (one fp32 a row) and their
  gradients back: small, latency-bound, exposed. The forward combine is issued asynchronously and runs
  while the shared experts compute (`Stack.combine_beside_shared`); the dispatch is needed
  right away, and the backward's all-to-alls wait as they are issued (torch's autograd function
  for the functional all-to-all waits on its output): exposed.
- FSDP2 all-gather (bf16 weights, forward and backward) and reduce-scatter (fp32 gradients)
  per block and micro-batch, over dp_shard (efsdp for expert weights), inside a rack: hidden
  behind the block's compute (one block prefetched), exposed only where a block's share of
  them takes longer than its compute. With offload "all" each gather first copies the block's
  fp32 shards from the host, and each reduce-scatter sends its gradients back, over NVLink-C2C
  on the same streams. A rank's NVLink is one link: the all-to-alls of a block and its FSDP
  collectives share it, so FSDP is exposed where the two together outlast the block.
- HSDP all-reduce of the sharded fp32 gradients across dp_replicate, once a step (after the
  last micro-batch): across racks on the network (within a rack on NVLink when one rack holds
  several replicas). It runs during the last micro-batch's backward (block by block), so only
  what exceeds that backward is exposed.
- with offload "replicas" (a distributed optimizer, steps/train/replicas.py) that all-reduce is
  a reduce-scatter of the fp32 gradient shards over the replicas, issued asynchronously as each
  shard's last gradient arrives during the last micro-batch's backward (hidden by it as the
  all-reduce is), and an all-gather of the bf16 working weights after the update (2 bytes a
  parameter instead of the all-reduce's second 4): nothing hides it.
- the optimizer, after the backward: on the GPU, memory-bound over the shards; with offload
  "moments" the moments stream over NVLink-C2C both ways beside the update (double-buffered,
  steps/train/offload.py), so the longer of the two counts; the two GPUs of a Grace share its C2C
  link and its memory (`Hardware.host_seconds`); with "all" the update runs on the
  Grace CPU (FSDP2's CPUOffloadPolicy), at torch's CPU AdamW rate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from steps.moe.config import flops_per_token as _flops_per_token, mean_keys
from steps.scale.hardware import Hardware
from steps.scale.memory import BF16, FP32, Mesh, Shards, dense_block_shapes, shards

OFFLOADS = ("none", "moments", "all", "replicas")

# Bytes an update moves a parameter: AdamW reads p, g, m, v and writes p, m, v (7 x fp32); the
# gradient clipping before it reads g for the norm and reads and writes it to scale it (3 x fp32).
ADAM_BYTES = 7 * FP32
CLIP_BYTES = 3 * FP32


@dataclass(frozen=True)
class Stack:
    """Where two training stacks spend a step differently on the same model and mesh: ours
    (`OURS`), and the anchor's as assumed (steps/scale/anchor.py)."""

    name: str
    capacity_factor: float = 0.0  # 0: dropless; else every expert's rows are padded (or cut) to this x the mean
    combine_beside_shared: bool = True  # the forward's combine all-to-all runs while the shared experts compute
    # the router weights applied on the expert side after w2 (MoEConfig.router_weights_on_experts):
    # they travel with the dispatch (a small fp32 all-to-all each way), and a `full` recompute does
    # not send the combine again, since no backward reads its output
    weights_on_experts: bool = False
    # the dispatch reads its split sizes on the host (dynamic shapes; XLA's static ones do not)
    dispatch_host_sync: bool = False
    window_over_all_keys: bool = True  # sliding-window layers run a dense masked kernel over every key


# The trainer of this repository: dropless all-to-all (steps/moe/expert_parallel.py), the shared
# experts computed while the combine is in flight, and sliding-window layers through SDPA's
# memory-efficient kernel with a boolean band mask, which computes every key block (docs/moe.md:
# a block-sparse kernel that skips them is the later fix).
OURS = Stack("this trainer", weights_on_experts=True, dispatch_host_sync=True)


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
def masked_attention_flops_per_token(cfg: Any, context: int) -> float:
    """Forward FLOPs per token that a dense masked kernel spends on keys outside the window:
    every key of the context is scored and weighed, the model's count has the window's."""
    return sum(4 * cfg.n_heads * cfg.head_dim * (context - mean_keys(context, cfg.sliding_window))
               for i in range(cfg.n_layers) if not cfg.is_global(i) and cfg.sliding_window < context)


@functools.lru_cache(maxsize=256)
def recompute_flops_per_token(cfg: Any, context: int, mode: str) -> float:
    """FLOPs a checkpointing mode runs again in the backward, per token (model FLOPs: the routed
    experts at the mean load): `full` the blocks' whole forward; `selective` the output
    projections (attention's wo, the shared and routed experts' w2), whose outputs it does not
    keep (steps/train/recompute.py)."""
    if mode == "none":
        return 0.0
    if mode == "full":
        return block_flops_per_token(cfg, context)[0]
    return 2.0 * cfg.n_layers * (_wo(cfg) + _shared_w2(cfg) + _routed_w2(cfg))


def _wo(cfg: Any) -> int:
    return cfg.dim * cfg.n_heads * cfg.head_dim


def _shared_w2(cfg: Any) -> int:
    return cfg.dim * cfg.shared_expert_dim * cfg.n_shared_experts


def _routed_w2(cfg: Any) -> int:
    return cfg.top_k * cfg.dim * cfg.expert_dim


@dataclass(frozen=True)
class Collective:
    """One kind of collective (or host copy) over a step, for one GPU."""

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
    """One optimizer step of one GPU, in seconds, at `efficiency` of peak while computing."""

    efficiency: float
    compute: float  # the model's FLOPs (the trainer's count)
    routed_extra: float  # dropless: the busiest rank's excess rows; capacity: every rank's padding
    masked_attention: float  # keys a dense masked kernel scores outside the window
    recompute: float  # FLOPs of the checkpointing mode (with its share of the two above)
    collectives: tuple[Collective, ...]
    optimizer: float  # the AdamW update and clipping, where it runs (GPU: HBM-bound; host: CPU)
    host_syncs: int = 0  # device-to-host syncs of the expert dispatch a step (the split sizes)
    host_sync_each: float = 0.0  # seconds of idle GPU each (Hardware.host_sync_us)

    @property
    def host_sync(self) -> float:
        return self.host_syncs * self.host_sync_each

    @property
    def executed(self) -> float:
        """Time spent computing: everything that runs at the efficiency."""
        return self.compute + self.routed_extra + self.masked_attention + self.recompute

    @property
    def exposed(self) -> float:
        return sum(c.exposed for c in self.collectives)

    @property
    def total(self) -> float:
        return self.executed + self.exposed + self.optimizer + self.host_sync


flops_per_token = functools.lru_cache(maxsize=256)(_flops_per_token)


def _ring(ranks: int) -> float:
    """Share of a buffer each rank sends in a ring all-gather or reduce-scatter."""
    return (ranks - 1) / ranks if ranks > 1 else 0.0


def step_time(cfg: Any, mesh: Mesh, hw: Hardware, *, context: int, share: int, microbatch: int,
              checkpointing: str, efficiency: float, replicas_per_rack: int, racks: int, offload: str,
              load: float, stack: Stack = OURS, sh: Shards | None = None) -> StepTime:
    """The time of one optimizer step on one GPU. `share` sequences a rank per step, `microbatch`
    of them per forward; `replicas_per_rack`: dp_shard groups that share a rack; `racks` the racks
    the mesh spans; `offload` where the optimizer state lives (OFFLOADS); `load` the busiest
    expert-parallel rank's rows over the mean; `stack` what the training code does; `sh` the
    shards (measured, or by default the closed form)."""
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {OFFLOADS}, got {offload!r}")
    micro = share // microbatch
    tokens = share * context  # per rank per step
    mb_tokens = microbatch * context
    rate = hw.peak_flops * efficiency
    L = cfg.n_layers
    block_fwd, routed_fwd = block_flops_per_token(cfg, context)
    ep = mesh.ep > 1
    # rows the routed experts compute, over the mean: the busiest rank's (dropless) or the padded buffers
    routed = (stack.capacity_factor or load) if ep or stack.capacity_factor else 1.0
    masked_fwd = masked_attention_flops_per_token(cfg, context) if stack.window_over_all_keys else 0.0
    extra_fwd = routed_fwd * (routed - 1)
    if checkpointing == "full":
        again = block_fwd + extra_fwd + masked_fwd
    elif checkpointing == "selective":
        again = recompute_flops_per_token(cfg, context, "selective") + 2.0 * L * _routed_w2(cfg) * (routed - 1)
    else:
        again = 0.0
    compute = tokens * flops_per_token(cfg, context) / rate
    routed_extra = tokens * 3 * extra_fwd / rate
    masked = tokens * 3 * masked_fwd / rate
    recompute = tokens * again / rate
    exec_fwd = block_fwd + extra_fwd + masked_fwd  # a block's forward as executed, all blocks, per token
    lat = hw.collective_latency_us * 1e-6
    link_s = hw.link_bytes_per_s("nvlink")
    out: list[Collective] = []
    a2a_fwd = a2a_bwd = (0.0, 0.0)  # (link seconds, exposed seconds) a block and micro-batch

    if ep:
        moved = min(load, stack.capacity_factor) if stack.capacity_factor else load
        per_call = BF16 * mb_tokens * cfg.top_k * cfg.dim * _ring(mesh.ep) * moved
        t_call = per_call / link_s + lat
        on_experts = stack.weights_on_experts and getattr(cfg, "router_weights_on_experts", True)
        sends = 2 if checkpointing == "full" else 1  # forward passes that send tokens
        combines = 1 if on_experts else sends  # ... and that send them back (not a recompute, weights applied)
        calls = L * micro * (sends + combines + 2)
        beside = L * micro * combines if stack.combine_beside_shared else 0
        shared_fwd = mb_tokens * 2 * 3 * _shared_w2(cfg) / rate  # one layer's shared experts, forward
        exposed = (calls - beside) * t_call + beside * max(0.0, t_call - shared_fwd)
        # the router weights with the dispatch (one fp32 a row) and their gradients back: exposed
        w_call = FP32 * mb_tokens * cfg.top_k * _ring(mesh.ep) * moved if on_experts else 0.0
        t_w = w_call / link_s + lat if on_experts else 0.0
        w_calls = L * micro * (sends + 1) if on_experts else 0
        # one block of one micro-batch: the link time of its all-to-alls and what of it the step
        # waits for, forward (dispatch, weights, combine) and backward (their reverses, a full
        # recompute's dispatch and weights, and its combine unless the weights are on the experts)
        combine_exposed = max(0.0, t_call - shared_fwd) if stack.combine_beside_shared else t_call
        again = sends == 2
        a2a_fwd = (2 * t_call + t_w, t_call + combine_exposed + t_w)
        a2a_bwd = (2 * t_call + t_w + again * (t_call + t_w + (combines == 2) * t_call),
                   2 * t_call + t_w + again * (t_call + t_w + (combines == 2) * combine_exposed))
        overlap = ("the forward's combine: the shared experts; the rest none (needed next)"
                   if beside else "none: its tokens are needed next")
        out.append(Collective("expert all-to-all", "nvlink", f"ep {mesh.ep}", calls * per_call, calls,
                              calls * t_call, exposed, overlap))
        if on_experts:
            out.append(Collective("router weights all-to-all (fp32)", "nvlink", f"ep {mesh.ep}", w_calls * w_call,
                                  w_calls, w_calls * t_w, w_calls * t_w, "none: with the dispatch, needed after w2"))

    sh = sh or shards(cfg, mesh)
    dense_full = sh.dense_per_block * mesh.dp_shard
    expert_full = sh.experts_per_block * mesh.efsdp
    ag_block = BF16 * (dense_full * _ring(mesh.dp_shard) + expert_full * _ring(mesh.efsdp))
    rs_block = FP32 * (dense_full * _ring(mesh.dp_shard) + expert_full * _ring(mesh.efsdp))
    ends = (sh.embed + sh.head) * mesh.dp_shard
    ag_ends, rs_ends = BF16 * ends * _ring(mesh.dp_shard), FP32 * ends * _ring(mesh.dp_shard)
    # offload "all": a block's fp32 shards come from the host before each gather, its fp32
    # gradient shards go back after each reduce-scatter
    c2c_block = FP32 * (sh.dense_per_block + sh.experts_per_block) if offload == "all" else 0
    c2c_ends = FP32 * (sh.embed + sh.head) if offload == "all" else 0
    if ag_block or ag_ends or c2c_block:
        per_block_fwd = mb_tokens * exec_fwd / L / rate
        per_block_bwd = 2 * per_block_fwd + mb_tokens * again / L / rate
        ag_t = ag_block / link_s + hw.host_seconds(c2c_block, 0.0)
        rs_t = rs_block / link_s + hw.host_seconds(0.0, c2c_block)
        # The rank's NVLink carries its all-to-alls too: a block's wall time (compute, plus what
        # of the all-to-all is waited for, plus what of FSDP is) must hold the link's busy time.
        exposed_mb = L * (max(0.0, ag_t + a2a_fwd[0] - a2a_fwd[1] - per_block_fwd)
                          + max(0.0, ag_t + rs_t + a2a_bwd[0] - a2a_bwd[1] - per_block_bwd)) + ag_t
        exposed = micro * (exposed_mb + (ag_ends + rs_ends) / link_s + hw.host_seconds(2 * c2c_ends, c2c_ends))
        ag_calls = micro * (2 * L + 3)
        rs_calls = micro * (L + 2)
        ag_bytes = micro * (2 * L * ag_block + 2 * ag_ends)
        rs_bytes = micro * (L * rs_block + rs_ends)
        c2c_bytes = micro * (3 * L * c2c_block + 3 * c2c_ends)  # up twice (forward, backward), down once
        ag_s = ag_bytes / link_s + ag_calls * lat
        rs_s = rs_bytes / link_s + rs_calls * lat
        c2c_s = hw.host_seconds(micro * (2 * L * c2c_block + 2 * c2c_ends), micro * (L * c2c_block + c2c_ends))
        whole = ag_s + rs_s + c2c_s
        group = f"dp_shard {mesh.dp_shard}" + (f", efsdp {mesh.efsdp}" if mesh.efsdp > 1 else "")
        if ag_bytes or rs_bytes:
            out.append(Collective("FSDP all-gather (bf16 weights)", "nvlink", group, ag_bytes, ag_calls, ag_s,
                                  exposed * ag_s / whole, "the previous block's compute (one block prefetched)"))
            out.append(Collective("FSDP reduce-scatter (fp32 grads)", "nvlink", f"dp_shard {mesh.dp_shard}",
                                  rs_bytes, rs_calls, rs_s, exposed * rs_s / whole, "the next block's backward"))
        if c2c_bytes:
            out.append(Collective("offloaded shards host <-> GPU (fp32)", "host", "NVLink-C2C", c2c_bytes,
                                  micro * (3 * L + 3), c2c_s, exposed * c2c_s / whole,
                                  "a block's compute, with its gather and reduce-scatter"))

    if mesh.dp_replicate > 1 and offload == "replicas":
        # the distributed optimizer (steps/train/replicas.py): one flat group of the replicas, per
        # parameter tensor a reduce-scatter of its fp32 gradient shard, started from FSDP2's
        # gradient hook as each shard's last gradient arrives (async), so it runs beside the last
        # micro-batch's backward as HSDP's all-reduce does; then, after the update, an all-gather
        # of the bf16 working weights, which nothing hides (the next forward needs them)
        tensors = L * (len(dense_block_shapes(cfg)) + 3) + 3
        link = "network" if racks > 1 else "nvlink"
        rs_per = FP32 * sh.total(L) * _ring(mesh.dp_replicate)
        ag_per = BF16 * sh.total(L) * _ring(mesh.dp_replicate)
        rs_s = rs_per / hw.link_bytes_per_s(link) + tensors * lat
        ag_s = ag_per / hw.link_bytes_per_s(link) + tensors * lat
        last_bwd = mb_tokens * (2 * exec_fwd + again) / rate
        group = f"dp_replicate {mesh.dp_replicate}" + (f" over {racks} racks" if racks > 1 else " in a rack")
        out.append(Collective("replicas: reduce-scatter (fp32 grads)", link, group, rs_per, tensors, rs_s,
                              max(0.0, rs_s - last_bwd), "the last micro-batch's backward (async, from the hooks)"))
        out.append(Collective("replicas: all-gather (bf16 weights)", link, group, ag_per, tensors, ag_s, ag_s,
                              "none: after the update"))
    elif mesh.dp_replicate > 1:  # hierarchical: in the rack first, then across racks
        grad_bytes = FP32 * sh.total(L)
        in_rack = min(replicas_per_rack, mesh.dp_replicate)
        nv_bytes = 2 * grad_bytes * _ring(in_rack)
        net_bytes = 2 * grad_bytes / in_rack * _ring(racks)
        last_bwd = mb_tokens * (2 * exec_fwd + again) / rate
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
    if offload == "all":
        optimizer = params * (ADAM_BYTES + CLIP_BYTES) / hw.host_update_bytes_per_s()
    elif offload == "replicas":  # the update and the clipping on this rank's slice
        optimizer = params * (ADAM_BYTES + CLIP_BYTES) / mesh.dp_replicate / (hw.hbm_tbps * 1e12)
    else:
        optimizer = params * (ADAM_BYTES + CLIP_BYTES) / (hw.hbm_tbps * 1e12)
    if offload == "moments":
        moved = 2 * FP32 * params  # both moments, each way
        seconds = hw.host_seconds(moved, moved)  # the Grace's other GPU streams its moments at once
        out.append(Collective("Adam moments host <-> GPU", "host", "NVLink-C2C", moved, 2, seconds,
                              max(0.0, seconds - optimizer), "the update (side stream, double-buffered)"))
    # the dispatch's one device-to-host sync a block and micro-batch (the split sizes), again in a
    # recompute (the block's Python runs again even where the collectives' outputs are kept)
    syncs = L * micro * (1 if checkpointing == "none" else 2) if ep and stack.dispatch_host_sync else 0
    return StepTime(efficiency=efficiency, compute=compute, routed_extra=routed_extra, masked_attention=masked,
                    recompute=recompute, collectives=tuple(out), optimizer=optimizer, host_syncs=syncs,
                    host_sync_each=hw.host_sync_us * 1e-6)
