"""Planning synthetic DAGs, all cached, on a local prefix: wall time and µs per step.

    .venv/bin/python -m bench.plan                 # 1k, 10k, 100k x chain, wide, layered
    .venv/bin/python -m bench.plan --sizes 1000    # quick
    .venv/bin/python -m bench.plan --provenance --sizes 10000   # licence and lineage bookkeeping: with / without
    .venv/bin/python -m bench.plan --whole-process [--sizes 1000 3000] [--repeat 5]
        # `marin-run --dry-run` as a whole process beside `snakemake -n` and Luigi (bench/plan_peers.py)

Target: 10k steps in under 1 s, growing linearly. The prefix is filled once per shape
with SUCCESS statuses (as a finished voyage leaves them), then the whole planning pass is timed:
build the DAG (digests included) and decide every step (one status read each).

`--provenance`: the roots are sources that declare licences (chain: the first step;
wide: the root; layered: the 100 steps of the first layer, under 3 licences), a voyage-wide
licence policy allows them (so every step is checked), and every status says it was made with
other package versions (so every step gets an environment note). The plan is made with all that
and with `make_plan(provenance=False)`, interleaved, and the ratio printed (target: still under
1 s at 10k steps).
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass

from bench import kit  # noqa: E402
from executor import License, LicensePolicy, Step, output_of, step_type  # noqa: E402
from executor.dag import build_dag  # noqa: E402
from executor.lineage import Lineage  # noqa: E402
from executor.plan import make_plan  # noqa: E402
from executor.storage.store import SUCCESS, Status, Store  # noqa: E402


@dataclass(frozen=True)
class Cfg:
    index: int
    inputs: tuple = ()
    lr: float = 3e-4
    name: str = "synthetic"


@dataclass(frozen=True)
class SourceCfg(Cfg):
    """A root that declares a licence (with --provenance): a source."""

    license: License | None = None


LICENSES = (License("CC-BY-4.0"), License("MIT"), License("public domain", url="https://example.org/pd"))
POLICY = LicensePolicy(allow=[lic.id for lic in LICENSES], name="the three")


@step_type(version="1")
def noop(config: Cfg, ctx) -> None:
    """Does nothing: only planning is measured."""


def root_cfg(i: int, license: License | None) -> Cfg:
    return SourceCfg(i, license=license) if license is not None else Cfg(i)


def make_steps(shape: str, n: int, licensed: bool = False) -> list[Step]:
    steps: list[Step] = []
    lic = (lambda i: LICENSES[i % len(LICENSES)]) if licensed else (lambda i: None)
    if shape == "chain":
        prev = None
        for i in range(n):
            prev = Step(f"chain/s{i}", noop, Cfg(i, (output_of(prev),)) if prev else root_cfg(i, lic(i)))
            steps.append(prev)
    elif shape == "wide":
        root = Step("wide/root", noop, root_cfg(-1, lic(0)))
        steps = [root] + [Step(f"wide/s{i}", noop, Cfg(i, (output_of(root),))) for i in range(n - 1)]
    elif shape == "layered":  # layers of 100, each step reading two steps of the layer before
        width = 100
        for i in range(n):
            layer, pos = divmod(i, width)
            deps = () if layer == 0 else (output_of(steps[(layer - 1) * width + pos]),
                                          output_of(steps[(layer - 1) * width + (pos + 1) % width]))
            steps.append(Step(f"layered/l{layer}/s{pos}", noop, Cfg(i, deps) if layer else root_cfg(i, lic(pos))))
    return steps


def fill(store: Store, steps: list[Step], env: str = "") -> None:
    dag = build_dag(steps)
    for node in dag:
        store.write_json(store.path(node.dirname, ".status"), Status(
            state=SUCCESS, digest=node.digest, output_digest="0" * 64,
            inputs={d.name: "0" * 64 for d in node.deps}, inputs_by="name",
            code=dag.fingerprint(node).digest, env=env).model_dump(mode="json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--shapes", nargs="+", default=["chain", "wide", "layered"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", action="store_true",
                    help="time by this process's CPU time, not wall time (a shared, loaded machine)")
    ap.add_argument("--provenance", action="store_true",
                    help="licensed sources, a policy and environment notes: plan time with and without them")
    ap.add_argument("--whole-process", action="store_true",
                    help="time `marin-run --dry-run` of a generated voyage, beside snakemake -n and Luigi "
                         "(bench/plan_peers.py; --sizes default 1000 3000)")
    args = ap.parse_args()
    if args.whole_process:
        from bench import plan_peers

        sizes = args.sizes if args.sizes != ap.get_default("sizes") else [1000, 3000]
        return plan_peers.main(["--sizes", *map(str, sizes), "--reps", str(args.repeat)])
    if args.provenance:
        return compare_provenance(args)
    clock = time.process_time if args.cpu else time.perf_counter
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
                    t0 = clock()
                    dag = build_dag(steps)
                    t1 = clock()
                    plan = make_plan(dag, store)
                    t2 = clock()
                    assert plan.counts() == {"CACHED": n}, plan.counts()
                    if best is None or t2 - t0 < best[2]:
                        best = (t1 - t0, t2 - t1, t2 - t0)
                us = best[2] / n * 1e6
                ratio = (best[2] / n * 10_000) / 1.0
                print(f"{shape:<8} {n:>7} {best[0]:>8.3f} {best[1]:>8.3f} {best[2]:>8.3f} {us:>8.1f}  "
                      f"{ratio:.2f}x of the budget at this rate")
                kit.emit(f"{shape} {n}", quiet=True, shape=shape, steps=n, clock="cpu" if args.cpu else "wall",
                         repeats=args.repeat, build_s=round(best[0], 4), plan_s=round(best[1], 4),
                         total_s=round(best[2], 4), us_per_step=round(us, 1))
            finally:
                shutil.rmtree(root, ignore_errors=True)


def compare_provenance(args: argparse.Namespace) -> None:
    print(f"{'shape':<8} {'steps':>7} {'sources':>7} {'without s':>9} {'with s':>8} {'ratio':>6} {'lineage s':>9}  "
          "with, vs the 10k-in-1s target")
    for shape in args.shapes:
        for n in args.sizes:
            root = tempfile.mkdtemp(prefix="marin-bench-plan-")
            try:
                store = Store(root)
                fill(store, make_steps(shape, n, licensed=True), env="0" * 16)  # made with other packages
                best = {True: float("inf"), False: float("inf")}
                lineage_s = float("inf")
                sources = 0
                for _ in range(args.repeat):
                    for with_provenance in (False, True):  # interleaved: the same load for both
                        steps = make_steps(shape, n, licensed=True)
                        t0 = time.perf_counter()
                        dag = build_dag(steps)
                        plan = make_plan(dag, store, policy=POLICY if with_provenance else None,
                                         provenance=with_provenance)
                        best[with_provenance] = min(best[with_provenance], time.perf_counter() - t0)
                        assert plan.counts() == {"CACHED": n}, plan.counts()
                        if with_provenance:
                            assert all(d.env_drift for d in plan.decisions)
                            sources = len(plan.lineage.declared)
                            t1 = time.perf_counter()
                            Lineage(dag, POLICY).check()
                            lineage_s = min(lineage_s, time.perf_counter() - t1)
                ratio = best[True] / best[False]
                print(f"{shape:<8} {n:>7} {sources:>7} {best[False]:>9.3f} {best[True]:>8.3f} {ratio:>5.2f}x "
                      f"{lineage_s:>9.3f}  {best[True] / n * 10_000:.2f}x of the budget at this rate")
                kit.emit(f"provenance {shape} {n}", quiet=True, shape=shape, steps=n, sources=sources,
                         repeats=args.repeat, without_s=round(best[False], 4), with_s=round(best[True], 4),
                         ratio=round(ratio, 3), lineage_s=round(lineage_s, 4))
            finally:
                shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
