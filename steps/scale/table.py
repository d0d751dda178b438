"""The plan as text: the per-GPU memory table, the per-step communication table beside the
compute, the alternatives, and the assumptions each figure rests on (what `marin-run ...
--dry-run` prints). Torch-free."""

from __future__ import annotations

import dataclasses

from steps.moe.config import flops_per_token
from steps.scale.anchor import ANCHOR, ANCHOR_CHECKPOINTING, ANCHOR_MICROBATCH
from steps.scale.comms import (
    masked_attention_flops_per_token,
    recompute_flops_per_token,
)
from steps.scale import memory as mem
from steps.scale.hardware import GIB
from steps.scale.memory import BF16, FP32
from steps.scale.mesh_plan import OFFLOAD_WORDS, TIE, MeshPlan, estimate


def _gib(x: float) -> str:
    return f"{x / GIB:8.2f}"


def _bytes(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= scale:
            return f"{x / scale:7.2f} {unit}"
    return f"{x:7.0f} B "


def placement_line(plan: MeshPlan) -> str:
    s, c, m = plan.setup, plan.choice, plan.choice.mesh
    g = s.gpus_per_rack
    per_rack = plan.replicas_per_rack * m.dp_shard
    spare = f", {g - per_rack} a rack spare" if per_rack < g else ""
    share = s.batch // m.ranks
    return (f"{m.ranks} of {s.gpus} GPUs train on {plan.racks} rack{'s' * (plan.racks > 1)} ({per_rack} a rack{spare}): "
            f"dp_replicate {m.dp_replicate} x dp_shard {m.dp_shard}, expert-parallel EP{m.ep} inside a rack "
            f"({s.model.n_experts // m.ep} experts a GPU{f', FSDP over efsdp {m.efsdp}' if m.efsdp > 1 else ''}); "
            f"{share} sequences a GPU in {share // c.microbatch} micro-batch{'es' * (share // c.microbatch > 1)} "
            f"of {c.microbatch}; {c.checkpointing} checkpointing; {OFFLOAD_WORDS[c.offload]} "
            f"(offload {c.offload})")


def memory_table(plan: MeshPlan, sources: dict[str, str] | None = None) -> list[str]:
    hw = plan.setup.hardware
    lines = ["  memory a GPU (its largest shards)           GiB   what, from where"]
    for row in plan.rows:
        lines.append(f"    {row.name:40s}{_gib(row.bytes)}   {row.note}")
    lines.append(f"    {'peak':40s}{_gib(plan.peak)}   {plan.verdict()} (of {hw.hbm_bytes / GIB:.1f} GiB HBM); "
                 f"anchor {ANCHOR.peak_gib} GiB")
    lines.append(f"    (peak = what of weights, grads and moments stays on the GPU + CUDA context + NCCL buffers + the "
                 f"larger of two moments: a block's backward with every block's kept activations, or the head and "
                 f"loss + the fragmentation reserve on it; the target is the setting memory_target_gib, "
                 f"{plan.setup.memory_target_gib:g} GiB, steps/scale/mesh_plan.py MEMORY_TARGET_GIB says why)")
    return lines


COMPUTE_LABEL = "compute: model FLOPs (the trainer's count)"


def comm_table(plan: MeshPlan) -> list[str]:
    s, t = plan.setup, plan.time
    mode = plan.choice.checkpointing
    lines = ["  per optimizer step, one GPU          group                      bytes    link       time  exposed"
             "   hidden behind"]
    for c in t.collectives:
        lines.append(f"    {c.name:42s} {c.group:22s} {_bytes(c.bytes)} {c.link:8s}{c.seconds:7.2f} s{c.exposed:7.2f} s"
                     f"   {c.overlap}")
    share = s.batch // plan.ranks
    fpt = flops_per_token(s.model, s.context)
    eff = t.efficiency
    where = {"all": "on the Grace CPU (torch's CPU AdamW)"}.get(plan.choice.offload, "on the GPU, HBM-bound")
    lines += [
        f"    {COMPUTE_LABEL:66s}{t.compute:17.2f} s   "
        f"{share} x {s.context:,} tokens x {fpt / 1e9:.2f} GFLOP at {eff:.1%} of {s.hardware.peak_tflops:g} TFLOP/s",
        f"    {'routed experts, busiest EP rank over the mean (dropless)':66s}{t.routed_extra:17.2f} s   "
        f"{s.load_mean:g}x the mean rows, same rate",
        f"    {'attention over masked keys (windowed layers, dense masked kernel)':66s}{t.masked_attention:17.2f} s   "
        f"{masked_attention_flops_per_token(s.model, s.context) * 3 / 1e9:.2f} GFLOP a token, same rate",
        f"    {'recompute (' + mode + ' checkpointing)':66s}{t.recompute:17.2f} s   "
        f"{recompute_flops_per_token(s.model, s.context, mode) / 1e9:.2f} GFLOP a token again (+ its share of the "
        f"two above), same rate",
        f"    {'optimizer update (AdamW and clipping, ' + where + ')':66s}{t.optimizer:17.2f} s",
        *host_sync_lines(plan),
        f"    {'step':66s}{t.total:17.2f} s   = computing {t.executed:.2f} s + exposed {t.exposed:.2f} s + update "
        f"{t.optimizer:.2f} s" + (f" + host syncs {t.host_sync:.2f} s" if t.host_syncs else "")
        + f"; {plan.predicted_mfu:.1%} MFU over the step (the trainer's count)",
    ]
    return lines + anchor_lines(plan)


def host_syncs(plan: MeshPlan) -> int:
    """Device-to-host syncs a step of the expert-parallel dispatch (steps/scale/comms.py counts
    them in the step): one a block and micro-batch (the split sizes, sent and received read
    together), again in a recompute; none without expert parallelism."""
    return plan.time.host_syncs


def host_sync_lines(plan: MeshPlan) -> list[str]:
    t = plan.time
    if not t.host_syncs:
        return []
    hw = plan.setup.hardware
    return [f"    {'host syncs of the expert dispatch (in the step)':66s}{t.host_sync:17.2f} s   "
            f"{t.host_syncs:,} a step: one a block and micro-batch, again in the recompute; {hw.host_sync_us:g} us of "
            f"idle GPU each (assumed: steps/scale/hardware.py host_sync_us; no GPU has measured it)"]


def anchor_lines(plan: MeshPlan) -> list[str]:
    """The comparison with the anchor: the calibration, and this plan's step and MFU at it."""
    s, t = plan.setup, plan.time
    cal = s.calibration
    a = ANCHOR
    ratio = cal.count_ratio
    given = f"given ({cal.efficiency:.1%} calibrated)" if s.efficiency else "calibrated"
    what_if = f", what if it ran at {s.mfu:.1%} MFU" if s.mfu != a.mfu else ""
    lines = [f"  against the anchor{what_if} ({cal.target_s:.1f} s a step at {s.mfu:.1%} MFU by its own count, "
             f"{cal.mfu:.1%} by the trainer's, which counts {ratio - 1:.1%} fewer FLOPs a token):",
             f"    efficiency while computing {t.efficiency:.1%}, {given}: {cal.describe()}",
             f"    this plan at that efficiency: {t.total:.2f} s a step, {t.total / cal.target_s:.2f}x the anchor's "
             f"{cal.target_s:.2f} s; {plan.predicted_mfu:.1%} MFU over the step by the trainer's count "
             f"({plan.predicted_mfu * ratio:.1%} by the anchor's)"]
    if t.total > cal.target_s:
        need = efficiency_for(plan, cal.target_s)
        lines.append(f"    (the anchor's {cal.target_s:.2f} s would need "
                     + (f"{need:.1%} while computing here)" if need else "more than the GPU's peak here)"))
    if not s.efficiency:
        lines += anchor_readings_lines(plan)
    return lines


def anchor_readings(plan: MeshPlan) -> list[dict]:
    """The anchor under each reading of its unpublished checkpointing (ANCHOR_READINGS): its
    peak through our memory model (its stack as assumed: no fragmentation reserve under XLA's
    static allocator, the loss over whole logits, the router weights after the combine), the efficiency calibrated on it, and this
    plan's step at that efficiency."""
    import dataclasses

    from steps.scale.anchor import ANCHOR_OFFLOAD, ANCHOR_READINGS, calibrate
    from steps.scale.mesh_plan import Choice, estimate
    from steps.scale.memory import Mesh

    s, a = plan.setup, ANCHOR
    # its stack as assumed: the loss over whole logits, the router weights applied after the
    # combine (as torchtitan does; MoEConfig.router_weights_on_experts)
    theirs = dataclasses.replace(s, model=dataclasses.replace(s.model, loss_chunk=s.model.vocab_size,
                                                              router_weights_on_experts=False),
                                 fragmentation=0.0, min_margin=0.0, memory_target_gib=s.hardware.hbm_bytes / GIB)
    out = []
    for mode, mb in ANCHOR_READINGS:
        cal = calibrate(s.hardware, s.mfu, s.load_mean, s.context, mode, mb)
        peak = estimate(theirs, Choice(Mesh(a.dp_replicate, a.dp_shard, a.ep), mb, mode, ANCHOR_OFFLOAD)).peak
        ours = estimate(dataclasses.replace(s, efficiency=cal.efficiency), plan.choice).time.total
        out.append({"checkpointing": mode, "microbatch": mb, "anchor_peak_gib": peak / GIB,
                    "efficiency": cal.efficiency, "step_s": ours, "ratio": ours / cal.target_s})
    return out


def anchor_readings_lines(plan: MeshPlan) -> list[str]:
    rows = anchor_readings(plan)
    lines = [f"    the anchor's checkpointing is not published; both readings side by side (its peak by our model, "
             f"against the published {ANCHOR.peak_gib} GiB):",
             f"      {'anchor assumed':<40}{'its peak':>10}{'efficiency':>12}{'this plan':>11}{'x anchor':>10}"]
    for r in rows:
        what = f"{r['checkpointing']} checkpointing, micro-batch {r['microbatch']}"
        lines.append(f"      {what:<40}{r['anchor_peak_gib']:>6.1f} GiB{r['efficiency']:>12.1%}{r['step_s']:>9.2f} s"
                     f"{r['ratio']:>9.2f}x")
    return lines


def efficiency_for(plan: MeshPlan, target_s: float) -> float | None:
    """The efficiency while computing at which this plan's step takes `target_s` (None: not even
    at peak). Bisection: the step falls as the efficiency rises."""
    def total(e: float) -> float:
        return estimate(dataclasses.replace(plan.setup, efficiency=e), plan.choice).time.total

    if total(1.0) > target_s:
        return None
    lo, hi = 1e-4, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) > target_s else (lo, mid)
    return hi


def alternatives_table(plans: list[MeshPlan], chosen: MeshPlan, top: int = 5) -> list[str]:
    lines = [f"  the fastest meshes under the {chosen.setup.memory_target_gib:g} GiB target on {chosen.setup.gpus} GPUs "
             f"(closed form, by step time; * = the search's choice, the fastest or a lighter one within "
             f"{TIE:.0%}):"]
    shown = plans[:top]
    if all(p.choice != chosen.choice for p in shown):
        shown = [*plans[:top - 1], next((p for p in plans if p.choice == chosen.choice), chosen)]
    for p in sorted(shown, key=lambda p: (p.time.total, p.peak)):
        mark = "*" if p.choice == chosen.choice else " "
        lines.append(f"   {mark} {p.time.total:6.2f} s {p.peak / GIB:7.1f} GiB  {p.ranks:4d} GPUs  {p.choice.describe()}")
    return lines


def cross_rack_lines(plan: MeshPlan) -> list[str]:
    """Why the state is (or is not) sharded across racks: the same step with the distributed
    optimizer across the replicas, and with expert FSDP spanning the racks, against the choice."""
    s, c, m = plan.setup, plan.choice, plan.choice.mesh
    if m.dp_replicate == 1:
        return ["  cross-rack sharding: none to do (one replica)"]
    lines = ["  cross-rack sharding of the optimizer state:"]
    if c.offload == "replicas":
        other = estimate(s, dataclasses.replace(c, offload="moments"))
        lines.append(f"    chosen: the distributed optimizer across the {m.dp_replicate} replicas (offload replicas); "
                     f"with the moments on the host instead: {other.time.total:.2f} s, {other.peak / GIB:.1f} GiB "
                     f"({other.verdict()})")
    else:
        alt = estimate(s, dataclasses.replace(c, offload="replicas"))
        why = ("slower" if alt.time.total >= plan.time.total else
               f"refused: {alt.verdict()}" if not alt.fits else "within the search's tie, heavier")
        lines.append(f"    the distributed optimizer across the {m.dp_replicate} replicas (offload replicas) on this "
                     f"mesh: {alt.time.total:.2f} s ({alt.time.total - plan.time.total:+.2f} s), {alt.peak / GIB:.1f} GiB, "
                     f"no host memory: not chosen, {why}")
    sh = mem.shards(s.model, m)
    racks, micro = plan.racks, s.batch // m.ranks // c.microbatch
    moved = micro * s.model.n_layers * (2 * BF16 + FP32) * sh.experts_per_block * (racks - 1) / racks
    net = moved / s.hardware.link_bytes_per_s("network")
    lines.append(f"    expert FSDP spanning the {racks} racks instead: each block's experts gathered (forward, backward) "
                 f"and their gradients reduce-scattered over the network every micro-batch, {moved / 1e12:.2f} TB a GPU "
                 f"a step = {net:.1f} s on the network against {plan.time.executed:.1f} s of compute: not built")
    return lines


def format_plan(plan: MeshPlan, alternatives: list[MeshPlan] | None = None, formula: MeshPlan | None = None,
                measured_note: str = "") -> str:
    """The whole plan: placement, memory, communication, alternatives and assumptions."""
    s = plan.setup
    lines = [f"plan of the training step on {s.gpus} {s.hardware.name.split()[0]} ({s.racks} rack"
             f"{'s' * (s.racks > 1)} of {s.hardware.gpus_per_rack}):", "  " + placement_line(plan)]
    lines.append(f"  memory target {s.memory_target_gib:g} GiB a GPU (memory_target_gib), enforced; tolerated skew: "
                 f"{s.skew_words()}")
    if measured_note:
        lines.append("  " + measured_note)
    lines += memory_table(plan)
    if formula is not None and formula.peak != plan.peak:
        lines.append(f"    closed form of the same: {formula.peak / GIB:.2f} GiB peak "
                     f"({(formula.peak / plan.peak - 1):+.1%}; the search ranks meshes with it)")
    lines += comm_table(plan)
    lines += cross_rack_lines(plan)
    if alternatives:
        lines += alternatives_table(alternatives, plan)
    lines.append("  assumptions:")
    lines += [f"    {x}" for x in s.hardware.assumptions()]
    lines += [f"    efficiency while computing: one rate for every FLOP executed (model, excess routed rows, masked "
              f"attention, recompute), solved so that the anchor's configuration takes its {ANCHOR.step_s:.1f} s "
              f"(its checkpointing {ANCHOR_CHECKPOINTING} and micro-batch {ANCHOR_MICROBATCH} assumed: "
              f"steps/scale/anchor.py); FSDP collectives hidden behind a block's compute up to its length; the "
              f"cross-rack all-reduce behind the last micro-batch's backward",
              f"    expert load: the busiest EP rank gets {s.load_mean:g}x the mean rows on average (time, kept "
              f"activations) and {s.skew_bound:g}x in its worst micro-batch (buffers)",
              "    checked on hardware: nothing yet. Every figure above is modelled (closed forms, the fake process "
              "group's shards, FakeTensorMode traces, spec-sheet links, the efficiency fitted to the anchor); "
              "bench/gpu_block_memory.py (in bench/gpu_all.sh) holds one 535B block's max_memory_allocated, "
              "max_memory_reserved and time to the plan's when a GPU is lent",
              "    activations as torch's CPU kernels keep them (RMSNorm's fp32 parts, the eager router): the GPU's "
              "fused kernels keep less"]
    return "\n".join(lines)


def describe_anchor() -> str:
    a = ANCHOR
    return (f"anchor (Marin's published GB200 run): {a.mesh}, {a.sequences_per_gpu} sequences a GPU, "
            f"{a.step_s} s a step at {a.mfu:.1%} MFU, {a.peak_gib} GiB peak, optimizer state on the host, "
            f"capacity factor {a.capacity_factor} ({a.dropped:.3%} of assignments dropped)")
