"""Planning the 535B step at full size: wall time and host memory of what `marin-run
voyages/535b.py --dry-run` does for its training step (the search, the 48-layer model built on
meta and sharded by the trainer in a fake process group of 704 ranks, the blocks and the head
traced under FakeTensorMode), each in a fresh process, against the issue's targets (under 60 s
and 8 GB). Then the plan of the chosen mesh and of alternatives, side by side with the anchor
modeled by the same cost model, and the calibration under other readings of the anchor.

    .venv/bin/python -m bench.plan_535b              # timing (3 runs) and the tables
    .venv/bin/python -m bench.plan_535b --runs 1 --no-tables
    .venv/bin/python -m bench.plan_535b --host-adam  # torch's CPU AdamW against a copy (offload "all")
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import json
import resource
import subprocess
import sys
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

TARGET_S, TARGET_GB = 60.0, 8.0


def child() -> None:
    """One planning run, as the dry-run does it; prints its phases as JSON."""
    t0 = time.perf_counter()
    import torch  # noqa: F401  (timed on its own: every dry-run of the full voyage pays it)

    t1 = time.perf_counter()
    from steps.moe.config import PRESETS
    from steps.scale.measure import read_shards, trace_activations
    from steps.scale.mesh_plan import Setup, pick, with_measurement

    setup = Setup(model=PRESETS["535b-a23b"], batch=11_264, context=4095, gpus=792)
    chosen, _ = pick(setup)
    t2 = time.perf_counter()
    reading = read_shards(setup.model, chosen.choice)
    t3 = time.perf_counter()
    acts = trace_activations(setup, chosen.choice)
    plan = with_measurement(chosen, acts, reading.shards)
    t4 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "search_s": t2 - t1, "build_s": t3 - t2, "trace_s": t4 - t3,
                      "total_s": t4 - t0, "peak_gib": plan.peak / 2**30, "ranks": reading.world,
                      "choice": chosen.choice.describe()}))


def timing(runs: int) -> None:
    print(f"planning 535B-A23B at full size, {runs} fresh process(es); targets: {TARGET_S:g} s, {TARGET_GB:g} GB")
    print(f"{'run':>4} {'import':>7} {'search':>7} {'build':>7} {'trace':>7} {'total':>7} {'host peak':>10} "
          f"{'time/target':>12} {'memory/target':>14}")
    for i in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, check=True)
        rss_gb = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024 / 1e9
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{i + 1:>4} {r['import_s']:6.1f}s {r['search_s']:6.1f}s {r['build_s']:6.1f}s {r['trace_s']:6.1f}s "
              f"{r['total_s']:6.1f}s {rss_gb:8.2f} GB {r['total_s'] / TARGET_S:11.3f}x {rss_gb / TARGET_GB:13.3f}x")
    print(f"plan: {r['choice']} on {r['ranks']} ranks, {r['peak_gib']:.1f} GiB a GPU")


def tables() -> None:
    """The dry-run table of the chosen plan and alternatives, measured, beside the anchor modeled
    by the same cost model (its time: the calibration); then what the calibration rests on."""
    from steps.moe.config import PRESETS
    from steps.scale.anchor import ANCHOR
    from steps.scale.hardware import GIB
    from steps.scale.measure import measure
    from steps.scale.mesh_plan import Choice, Mesh, Setup, pick

    setup = Setup(model=PRESETS["535b-a23b"], batch=11_264, context=4095, gpus=792)
    cal = setup.calibration
    chosen, _ = pick(setup)
    alternatives = [
        ("chosen", chosen.choice),
        ("the former choice: full, Adam on the GPU", Choice(Mesh(11, 64, 64), 2, "full", "none")),
        ("full recompute, moments on the host", Choice(Mesh(11, 64, 64), 4, "full", "moments")),
        ("EP16 x efsdp 4", Choice(Mesh(11, 64, 16), 1, "selective", "moments")),
        ("offload all, no recompute", Choice(Mesh(11, 64, 64), 1, "none", "all")),
    ]
    plans = [(name, measure(setup, c).plan) for name, c in alternatives]
    width = 12
    head = f"{'':44s}" + "".join(f"{'(' + str(i + 1) + ')':>{width}}" for i in range(len(plans)))
    print()
    print("per GPU, GiB (measured: fake process group of 704 ranks, traced blocks); anchor: published")
    print(head + f"{'anchor':>{width}}")
    for k, row in enumerate(plans[0][1].rows):
        print(f"{row.name:44s}" + "".join(f"{p.rows[k].bytes / GIB:{width}.2f}" for _, p in plans) + f"{'':>{width}}")
    print(f"{'peak':44s}" + "".join(f"{p.peak / GIB:{width}.2f}" for _, p in plans) + f"{ANCHOR.peak_gib:{width}.1f}")
    a = cal.time
    print(f"per step, one GPU, s (exposed / on its link), at {cal.efficiency:.1%} while computing (calibrated); "
          f"anchor: its configuration through the same model")
    print(head + f"{'anchor':>{width}}")
    names = list(dict.fromkeys(c.name for _, p in plans for c in p.time.collectives))
    for name in names:
        cells = []
        for t in [p.time for _, p in plans] + [a]:
            c = next((c for c in t.collectives if c.name == name), None)
            cells.append(f"{c.exposed:.2f}/{c.seconds:.2f}" if c else "-")
        print(f"{name:44s}" + "".join(f"{x:>{width}}" for x in cells))
    for label, attr in (("compute (model FLOPs)", "compute"), ("routed excess (imbalance or padding)", "routed_extra"),
                        ("masked attention", "masked_attention"), ("recompute", "recompute"),
                        ("optimizer update", "optimizer"), ("step", "total")):
        print(f"{label:44s}" + "".join(f"{getattr(t, attr):{width}.2f}" for t in [p.time for _, p in plans] + [a]))
    print(f"{'MFU over the step (trainer count)':44s}" + "".join(f"{p.predicted_mfu:{width}.1%}" for _, p in plans)
          + f"{cal.mfu:{width}.1%}")
    print(f"{'MFU over the step (anchor count)':44s}"
          + "".join(f"{p.predicted_mfu * cal.count_ratio:{width}.1%}" for _, p in plans) + f"{ANCHOR.mfu:{width}.1%}")
    for i, (name, p) in enumerate(plans):
        print(f"({i + 1}) {name}: {p.choice.describe()}")
    print(f"anchor: {cal.describe()}")
    sensitivity(setup, chosen.choice)


def sensitivity(setup, choice) -> None:
    """The calibration under other readings of what the anchor did: the efficiency each gives,
    the anchor's peak by our memory model under it, and the chosen plan's step at it."""
    import dataclasses

    from steps.scale.anchor import ANCHOR_STACK, calibrate
    from steps.scale.hardware import GIB
    from steps.scale.mesh_plan import Choice, Mesh, estimate

    hw = setup.hardware
    readings = [
        ("as assumed: full, micro-batch 8", {}),
        ("full, micro-batch 16 (Levanter's default)", dict(microbatch=16)),
        ("full, micro-batch 4", dict(microbatch=4)),
        ("full, micro-batch 1", dict(microbatch=1)),
        ("selective, micro-batch 1", dict(checkpointing="selective", microbatch=1)),
        ("no recompute, micro-batch 1", dict(checkpointing="none", microbatch=1)),
        ("as assumed, combine beside shared experts", dict(stack=dataclasses.replace(ANCHOR_STACK,
                                                                                     combine_beside_shared=True))),
        ("selective mb 1, combine beside shared", dict(checkpointing="selective", microbatch=1,
                                                       stack=dataclasses.replace(ANCHOR_STACK,
                                                                                 combine_beside_shared=True))),
        ("as assumed, windows over all keys", dict(stack=dataclasses.replace(ANCHOR_STACK, window_over_all_keys=True))),
    ]
    print()
    print("the calibration under other readings of the anchor (its memory by our model: the same mesh, "
          "moments on the host, its loss unchunked)")
    print(f"{'reading':44s}{'efficiency':>11}{'anchor peak':>13}{'chosen step':>13}{'vs 17.0 s':>10}{'MFU':>8}")
    for name, kw in readings:
        c = calibrate(hw, setup.mfu, setup.load_mean, setup.context, **kw)
        theirs = dataclasses.replace(setup.model, router_weights_on_experts=False)  # as torchtitan: after the combine
        anchor_mem = estimate(dataclasses.replace(setup, model=theirs, efficiency=c.efficiency),
                              Choice(Mesh(11, 64, 64), c.microbatch, c.checkpointing, "moments"))
        p = estimate(dataclasses.replace(setup, efficiency=c.efficiency), choice)
        print(f"{name:44s}{c.efficiency:11.1%}{anchor_mem.peak / GIB:9.1f} GiB{p.time.total:11.2f} s"
              f"{p.time.total / c.target_s:9.2f}x{p.predicted_mfu:8.1%}")


def host_adam(n: int = 16_000_000, repeats: int = 5) -> None:
    """torch's CPU AdamW step (single-tensor: FSDP2's CPUOffloadPolicy path) against the least
    traffic of an update, 28 bytes a parameter at this machine's copy bandwidth: the share of a
    memory-bound update it reaches (steps/scale/hardware.py, HOST_ADAM_EFFICIENCY)."""
    import torch

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, foreach=False, fused=False)
    opt.step()  # state allocated outside the timing
    src, dst = torch.randn(n), torch.empty(n)

    def best(f) -> float:
        return kit.timed(f, repeats=repeats).wall_min

    copy_s = best(lambda: dst.copy_(src))
    adam_s = best(opt.step)
    copy_bw = 8 * n / copy_s
    ideal = 28 * n / copy_bw
    print(f"host AdamW, {n / 1e6:.0f}M fp32 parameters, {torch.get_num_threads()} threads: copy {copy_bw / 1e9:.1f} GB/s "
          f"(read + write), AdamW step {adam_s * 1e3:.1f} ms, memory-bound ideal {ideal * 1e3:.1f} ms: "
          f"{ideal / adam_s:.2f} of it")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-tables", action="store_true")
    p.add_argument("--host-adam", action="store_true", help="only measure torch's CPU AdamW against a copy")
    args = p.parse_args()
    if args.child:
        child()
        return
    if args.host_adam:
        host_adam()
        return
    timing(args.runs)
    if not args.no_tables:
        tables()


if __name__ == "__main__":
    main()
