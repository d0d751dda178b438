"""Planning synthetic DAGs, all cached, on a local prefix: wall time and µs per step.

    .venv/bin/python bench/plan.py                 # 1k, 10k, 100k x chain, wide, layered
    .venv/bin/python bench/plan.py --sizes 1000    # quick

Target (issue 2): 10k steps in under 1 s, growing linearly. The prefix is filled once per shape
with SUCCESS statuses (as a finished voyage leaves them), then the whole planning pass is timed:
build the DAG (digests included) and decide every step (one status read each).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from executor import Step, output_of, step_type  # noqa: E402
from executor.dag import build_dag  # noqa: E402
from executor.plan import make_plan  # noqa: E402
from executor.store import SUCCESS, Status, Store  # noqa: E402


@dataclass(frozen=True)
class Cfg:
    index: int
    inputs: tuple = ()
    lr: float = 3e-4
    name: str = "synthetic"


@step_type(version="1")
def noop(config: Cfg, ctx) -> None:
    """Does nothing: only planning is measured."""


def make_steps(shape: str, n: int) -> list[Step]:
    steps: list[Step] = []
    if shape == "chain":
        prev = None
        for i in range(n):
            prev = Step(f"chain/s{i}", noop, Cfg(i, (output_of(prev),) if prev else ()))
            steps.append(prev)
    elif shape == "wide":
        root = Step("wide/root", noop, Cfg(-1))
        steps = [root] + [Step(f"wide/s{i}", noop, Cfg(i, (output_of(root),))) for i in range(n - 1)]
    elif shape == "layered":  # layers of 100, each step reading two steps of the layer before
        width = 100
        for i in range(n):
            layer, pos = divmod(i, width)
            deps = () if layer == 0 else (output_of(steps[(layer - 1) * width + pos]),
                                          output_of(steps[(layer - 1) * width + (pos + 1) % width]))
            steps.append(Step(f"layered/l{layer}/s{pos}", noop, Cfg(i, deps)))
    return steps


def fill(store: Store, steps: list[Step]) -> None:
    dag = build_dag(steps)
    for node in dag:
        store.write_json(store.path(node.dirname, ".status"), Status(
            state=SUCCESS, digest=node.digest, output_digest="0" * 64,
            inputs={d.name: "0" * 64 for d in node.deps}, inputs_by="name",
            code=dag.fingerprint(node).digest).model_dump(mode="json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--shapes", nargs="+", default=["chain", "wide", "layered"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'shape':<8} {'steps':>7} {'build s':>8} {'plan s':>8} {'total s':>8} {'us/step':>8}  vs 10k-in-1s target")
    for shape in args.shapes:
        for n in args.sizes:
            root = tempfile.mkdtemp(prefix="marin-bench-plan-")
            try:
                store = Store(root)
                fill(store, make_steps(shape, n))
                best = None
                for _ in range(args.repeat):
                    steps = make_steps(shape, n)  # building Steps is the voyage's cost, not planning's
                    t0 = time.perf_counter()
                    dag = build_dag(steps)
                    t1 = time.perf_counter()
                    plan = make_plan(dag, store)
                    t2 = time.perf_counter()
                    assert plan.counts() == {"CACHED": n}, plan.counts()
                    if best is None or t2 - t0 < best[2]:
                        best = (t1 - t0, t2 - t1, t2 - t0)
                us = best[2] / n * 1e6
                ratio = (best[2] / n * 10_000) / 1.0
                print(f"{shape:<8} {n:>7} {best[0]:>8.3f} {best[1]:>8.3f} {best[2]:>8.3f} {us:>8.1f}  "
                      f"{ratio:.2f}x of the budget at this rate")
            finally:
                shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
