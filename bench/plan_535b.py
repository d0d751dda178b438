"""Planning the 535B step at full size: wall time and host memory of what `marin-run
voyages/535b.py --dry-run` does for its training step (the search, the 48-layer model built on
meta and sharded by the trainer in a fake process group of 704 ranks, the blocks and the head
traced under FakeTensorMode), each in a fresh process, against the issue's targets (under 60 s
and 8 GB). Then the plan of the chosen mesh and of alternatives, side by side with the anchor.

    .venv/bin/python bench/plan_535b.py              # timing (3 runs) and the tables
    .venv/bin/python bench/plan_535b.py --runs 1 --no-tables
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_S, TARGET_GB = 60.0, 8.0


def child() -> None:
    """One planning run, as the dry-run does it; prints its phases as JSON."""
    t0 = time.perf_counter()
    import torch  # noqa: F401  (timed on its own: every dry-run of the full voyage pays it)

    t1 = time.perf_counter()
    from steps.moe.config import PRESETS
    from steps.scale.measure import read_shards, trace_activations
    from steps.scale.plan import Setup, pick, with_measurement

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
    """The dry-run table of the chosen plan and two alternatives, measured, beside the anchor."""
    from steps.moe.config import PRESETS
    from steps.scale.hardware import GIB
    from steps.scale.measure import measure
    from steps.scale.plan import ANCHOR, Choice, Mesh, Setup, pick

    setup = Setup(model=PRESETS["535b-a23b"], batch=11_264, context=4095, gpus=792)
    chosen, _ = pick(setup)
    alternatives = [
        ("chosen", chosen.choice),
        ("least memory", Choice(Mesh(11, 64, 64), 1, "full")),
        ("anchor-like: selective, Adam on the host (not in the trainer yet)", Choice(Mesh(11, 64, 64), 1, "selective",
                                                                                     optimizer_on_host=True)),
        ("EP16 x efsdp 4", Choice(Mesh(11, 64, 16), 2, "full")),
    ]
    plans = [(name, measure(setup, c).plan) for name, c in alternatives]
    width = 14
    print()
    print("per GPU, GiB (measured: fake process group of 704 ranks, traced blocks)")
    print(f"{'':40s}" + "".join(f"{'(' + str(i + 1) + ')':>{width}}" for i in range(len(plans))) + f"{'anchor':>{width}}")
    for k, row in enumerate(plans[0][1].rows):
        print(f"{row.name:40s}" + "".join(f"{p.rows[k].bytes / GIB:{width}.2f}" for _, p in plans)
              + f"{'':>{width}}")
    print(f"{'peak':40s}" + "".join(f"{p.peak / GIB:{width}.2f}" for _, p in plans) + f"{ANCHOR['peak_gib']:{width}.1f}")
    print("per step, one GPU, s (exposed / on its link)")
    names = sorted({c.name for _, p in plans for c in p.time.collectives}, key=lambda n: n)
    for name in names:
        cells = []
        for _, p in plans:
            c = next((c for c in p.time.collectives if c.name == name), None)
            cells.append(f"{c.exposed:5.2f}/{c.seconds:5.2f}" if c else "-")
        print(f"{name:40s}" + "".join(f"{x:>{width}}" for x in cells))
    for label, attr in (("compute at 22.9% MFU", "compute"), ("recompute", "recompute"), ("imbalance", "imbalance"),
                        ("optimizer", "optimizer")):
        print(f"{label:40s}" + "".join(f"{getattr(p.time, attr):{width}.2f}" for _, p in plans))
    print(f"{'step':40s}" + "".join(f"{p.time.total:{width}.2f}" for _, p in plans) + f"{ANCHOR['step_s']:{width}.1f}")
    print(f"{'MFU over the step':40s}" + "".join(f"{p.predicted_mfu:{width}.1%}" for _, p in plans)
          + f"{ANCHOR['mfu']:{width}.1%}")
    for i, (name, p) in enumerate(plans):
        print(f"({i + 1}) {name}: {p.choice.describe()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-tables", action="store_true")
    args = p.parse_args()
    if args.child:
        child()
        return
    timing(args.runs)
    if not args.no_tables:
        tables()


if __name__ == "__main__":
    main()
