"""What running steps through the executor on Ray costs, against calling the functions directly.

    .venv/bin/python -m bench.ray_overhead                  # 500 trivial steps; 2 x 3 s CPU-bound
    .venv/bin/python -m bench.ray_overhead --steps 100 --cpu-seconds 1

1. 500 trivial independent steps (each writes one small file) through plan + Runner + Ray on an
   embedded local Ray, against the same 500 functions called in a loop: overhead per step.
   Target: under 20 ms a step.
2. Two CPU-bound steps of 3 s each side by side, against one alone. Target: under 1.2x.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

from executor import Resources, Step, StepContext, step_type  # noqa: E402

from executor.testing import build_context
from executor.api import plan_steps, run_plan  # noqa: E402


@dataclass(frozen=True)
class Tiny:
    index: int


@step_type(version="1")
def tiny(config: Tiny, ctx: StepContext) -> None:
    """Write one small file."""
    with ctx.open("out.txt", "w") as f:
        f.write(str(config.index))


@dataclass(frozen=True)
class Spin:
    index: int
    seconds: float


@step_type(version="1")
def spin(config: Spin, ctx: StepContext) -> None:
    """Burn one CPU for `seconds` of pure Python work."""
    end = time.process_time() + config.seconds
    x = 0
    while time.process_time() < end:
        for i in range(10_000):
            x += i * i
    with ctx.open("out.txt", "w") as f:
        f.write(str(x % 7))


def run(steps: list[Step], max_concurrent: int) -> float:
    root = tempfile.mkdtemp(prefix="marin-bench-ray-")
    try:
        plan = plan_steps(steps, root)
        t0 = time.perf_counter()
        summary = run_plan(plan, max_concurrent=max_concurrent)
        elapsed = time.perf_counter() - t0
        assert summary.exit_code == 0, [o for o in summary.outcomes.values() if o.state != "SUCCESS"]
        return elapsed
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--cpu-seconds", type=float, default=3.0)
    ap.add_argument("--max-concurrent", type=int, default=16)
    args = ap.parse_args()

    import ray

    from executor import ray_backend

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    try:
        ray_backend.start()  # already initialized: joins it
        # warm the worker pool so that process start-up is not charged to the steps
        run([Step(f"warm/{i}", tiny, Tiny(-i)) for i in range(8)], args.max_concurrent)

        steps = [Step(f"tiny/{i}", tiny, Tiny(i)) for i in range(args.steps)]
        root = tempfile.mkdtemp(prefix="marin-bench-direct-")
        t0 = time.perf_counter()
        for s in steps:  # the same functions, called directly, each into its own folder
            s.type.fn(s.config, build_context(f"{root}/{s.name}", name=s.name, digest="0" * 64))
        direct = time.perf_counter() - t0
        shutil.rmtree(root, ignore_errors=True)
        through = run(steps, args.max_concurrent)
        per_step = (through - direct) / args.steps * 1000
        print(f"{args.steps} trivial steps: direct {direct:.2f}s, executor on Ray {through:.2f}s "
              f"(max_concurrent {args.max_concurrent}): overhead {per_step:.1f} ms/step "
              f"= {per_step / 20:.2f}x of the 20 ms target")

        one = run([Step("spin/0", spin, Spin(0, args.cpu_seconds), resources=Resources(cpus=1))], 2)
        two = run([Step(f"spin/{i}", spin, Spin(i, args.cpu_seconds), resources=Resources(cpus=1))
                   for i in range(2)], 2)
        print(f"CPU-bound steps of {args.cpu_seconds:g}s: one alone {one:.2f}s, two side by side {two:.2f}s: "
              f"ratio {two / one:.2f} (target < 1.2)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
