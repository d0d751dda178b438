"""The plan as text: the per-GPU memory table, the per-step communication table beside the
compute, the alternatives, and the assumptions each figure rests on (what `marin-run ...
--dry-run` prints). Torch-free."""

from __future__ import annotations

from typing import Any

from steps.moe.config import flops_per_token
from steps.scale.comms import recompute_flops_per_token
from steps.scale.hardware import GIB
from steps.scale.plan import ANCHOR, Plan


def _gib(x: float) -> str:
    return f"{x / GIB:8.2f}"


def _bytes(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= scale:
            return f"{x / scale:7.2f} {unit}"
    return f"{x:7.0f} B "


def placement_line(plan: Plan) -> str:
    s, c, m = plan.setup, plan.choice, plan.choice.mesh
    g = s.gpus_per_rack
    per_rack = plan.replicas_per_rack * m.dp_shard
    spare = f", {g - per_rack} a rack spare" if per_rack < g else ""
    share = s.batch // m.ranks
    return (f"{m.ranks} of {s.gpus} GPUs train on {plan.racks} rack{'s' * (plan.racks > 1)} ({per_rack} a rack{spare}): "
            f"dp_replicate {m.dp_replicate} x dp_shard {m.dp_shard}, expert-parallel EP{m.ep} inside a rack "
            f"({s.model.n_experts // m.ep} experts a GPU{f', FSDP over efsdp {m.efsdp}' if m.efsdp > 1 else ''}); "
            f"{share} sequences a GPU in {share // c.microbatch} micro-batch{'es' * (share // c.microbatch > 1)} "
            f"of {c.microbatch}; {c.checkpointing} checkpointing; Adam moments on the "
            f"{'host' if c.optimizer_on_host else 'GPU'}")


def memory_table(plan: Plan, sources: dict[str, str] | None = None) -> list[str]:
    hw = plan.setup.hardware
    lines = ["  memory a GPU (its largest shards)           GiB   what, from where"]
    for row in plan.rows:
        lines.append(f"    {row.name:40s}{_gib(row.bytes)}   {row.note}")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines.append(f"    {'peak':40s}{_gib(plan.peak)}   of {hw.hbm_bytes / GIB:.1f} GiB ({hw.hbm_gb:g} GB); limit "
                 f"{hw.hbm_limit:.0%} = {hw.limit_bytes / GIB:.1f} GiB: {verdict}; anchor {ANCHOR['peak_gib']} GiB")
    lines.append("    (peak = weights, grads and moments on the GPU + reserve + the larger of two moments: a block's "
                 "backward with every block's kept activations, or the head and loss)")
    return lines


def comm_table(plan: Plan) -> list[str]:
    s, t = plan.setup, plan.time
    mb_mode = plan.choice.checkpointing
    lines = ["  per optimizer step, one GPU          group                      bytes    link       time  exposed"
             "   hidden behind"]
    for c in t.collectives:
        lines.append(f"    {c.name:42s} {c.group:22s} {_bytes(c.bytes)} {c.link:8s}{c.seconds:7.2f} s{c.exposed:7.2f} s"
                     f"   {c.overlap}")
    share = s.batch // plan.ranks
    fpt = flops_per_token(s.model, s.context)
    lines += [
        f"    {'compute: model FLOPs at the assumed MFU':66s}{t.compute:17.2f} s   "
        f"{share} x {s.context:,} tokens x {fpt / 1e9:.2f} GFLOP at {s.mfu:.1%} of {s.hardware.peak_tflops:g} TFLOP/s",
        f"    {'recompute (' + mb_mode + ' checkpointing)':66s}{t.recompute:17.2f} s   "
        f"{recompute_flops_per_token(s.model, s.context, mb_mode) / 1e9:.2f} GFLOP a token again, same rate",
        f"    {'expert imbalance (busiest EP rank)':66s}{t.imbalance:17.2f} s   "
        f"routed experts at {s.load_mean:g}x the mean load",
        f"    {'optimizer update (AdamW, HBM-bound)':66s}{t.optimizer:17.2f} s",
        f"    {'step':66s}{t.total:17.2f} s   = compute + recompute + imbalance + exposed {t.exposed:.2f} s + "
        f"update; {plan.predicted_mfu:.1%} MFU over the step; anchor {ANCHOR['step_s']} s at {ANCHOR['mfu']:.1%}",
    ]
    need = _mfu_for(plan, ANCHOR["step_s"])
    if need is not None:
        lines.append(f"    (the anchor's {ANCHOR['step_s']} s a step would need {need:.1%} MFU while computing here)")
    return lines


def _mfu_for(plan: Plan, target_s: float) -> float | None:
    """The compute MFU at which this plan's step takes `target_s` (compute, recompute and
    imbalance scale with 1/MFU; communication does not)."""
    t = plan.time
    fixed = t.exposed + t.optimizer
    scaled = (t.compute + t.recompute + t.imbalance) * plan.setup.mfu
    return scaled / (target_s - fixed) if target_s > fixed else None


def alternatives_table(plans: list[Plan], chosen: Plan, top: int = 5) -> list[str]:
    lines = [f"  the fastest meshes that fit on {chosen.setup.gpus} GPUs (closed form; first = the search's choice):"]
    for p in plans[:top]:
        mark = "*" if p.choice == chosen.choice else " "
        lines.append(f"   {mark} {p.time.total:6.2f} s {p.peak / GIB:7.1f} GiB  {p.ranks:4d} GPUs  {p.choice.describe()}")
    return lines


def format_plan(plan: Plan, alternatives: list[Plan] | None = None, formula: Plan | None = None,
                measured_note: str = "") -> str:
    """The whole plan: placement, memory, communication, alternatives and assumptions."""
    s = plan.setup
    lines = [f"plan of the training step on {s.gpus} {s.hardware.name.split()[0]} ({s.racks} rack"
             f"{'s' * (s.racks > 1)} of {s.hardware.gpus_per_rack}):", "  " + placement_line(plan)]
    if measured_note:
        lines.append("  " + measured_note)
    lines += memory_table(plan)
    if formula is not None and formula.peak != plan.peak:
        lines.append(f"    closed form of the same: {formula.peak / GIB:.2f} GiB peak "
                     f"({(formula.peak / plan.peak - 1):+.1%}; the search ranks meshes with it)")
    lines += comm_table(plan)
    if alternatives:
        lines += alternatives_table(alternatives, plan)
    lines.append("  assumptions:")
    lines += [f"    {a}" for a in s.hardware.assumptions()]
    lines += [f"    MFU {s.mfu:.1%} while computing (the anchor's whole-step figure); recompute and imbalance at the "
              f"same rate; all-to-all not overlapped; FSDP collectives hidden behind a block's compute up to its "
              f"length; the cross-rack all-reduce behind the last micro-batch's backward",
              f"    expert load: the busiest EP rank gets {s.load_mean:g}x the mean rows on average (time, kept "
              f"activations) and {s.load_peak:g}x in its worst micro-batch (buffers); routing is dropless",
              "    activations as torch's CPU kernels keep them (RMSNorm's fp32 parts, the eager router): the GPU's "
              "fused kernels keep less"]
    return "\n".join(lines)


def describe_anchor() -> str:
    a: Any = ANCHOR
    return (f"anchor (Marin's published GB200 run): {a['mesh']}, {a['sequences_per_gpu']} sequences a GPU, "
            f"{a['step_s']} s a step at {a['mfu']:.1%} MFU, {a['peak_gib']} GiB peak, Adam moments on the host, "
            f"capacity factor {a['capacity_factor']} ({a['dropped']:.3%} of assignments dropped)")
