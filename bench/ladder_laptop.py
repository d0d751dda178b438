"""The laptop ladder end to end (docs/ladder.md): 5 rungs of the tiny MoE, the law fitted on
rungs 1-4, the prediction sealed, rung 5 trained against it and checked. Prints whether the fit
predicts rung 5 within 1.5%, whether the 90% band covers rung 5 and is no wider than +-3%, and
whether the law beats both baselines (a power law without a floor, and the line through the last
two points) on the same points. Figures as measured: rung 5 and the data are never tuned.

    .venv/bin/python -m bench.ladder_laptop                    # a fresh prefix (removed after)
    .venv/bin/python -m bench.ladder_laptop --prefix /tmp/lad  # kept: rerun to read it back cached

Runs the voyage's own ladder steps (`marin-run voyages/535b.py --laptop --ladder` without the
laptop run itself) through the executor on an embedded Ray.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT


def load_voyage():
    spec = importlib.util.spec_from_file_location("voyage_535b_bench", ROOT / "voyages" / "535b.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read(prefix: str, plan, name: str, file: str):
    from executor.storage.store import Store

    return json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan[name].node.dirname), file)))


class CpuMeter:
    """CPU seconds (user + system) of this process and every process under it (Ray's workers),
    sampled every `every` s: each process's last sample counts, so a process that ends between
    samples loses at most `every` s. The machine is shared: CPU time, not wall time, is what the
    ladder costs (`wall / (cpu / cores)` is how much the load slowed it)."""

    def __init__(self, every: float = 0.25):
        import threading

        self.every, self.seen, self.stop = every, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                self.seen[(proc.pid, proc.create_time())] = t.user + t.system
            except psutil.Error:
                pass

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self._sample()

    def __enter__(self) -> "CpuMeter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sample()
        self.stop.set()
        self.thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prefix", default="", help="where the outputs go (default: a temporary folder, removed after)")
    args = p.parse_args()
    from executor.api import plan_steps, run_steps

    v = load_voyage()
    config = v.VoyageConfig(laptop=True, ladder=True)
    _tok, tokenized, heldout = v.data_and_heldout(config)
    built = v.ladder_steps(config, tokenized, heldout)
    prefix = args.prefix or tempfile.mkdtemp(prefix="ladder-laptop-")
    os.chdir(ROOT)  # the bundled corpus is named by repository-relative paths
    t0 = time.time()
    with CpuMeter() as meter:
        _, summary = run_steps(built.steps, prefix, voyage="535b-ladder")
    wall = time.time() - t0
    if summary.exit_code:
        print("FAILED:", [(o.name, o.error) for o in summary.failed])
        return 1
    plan = plan_steps(built.steps, prefix)
    fit = read(prefix, plan, "ladder/fit", "fit.json")
    sealed = read(prefix, plan, "ladder/predict", "prediction.json")
    verdict = read(prefix, plan, "ladder/check", "verdict.json")
    report = fit["report"]
    top = built.rungs[-1]
    actual = verdict["landed"]
    predicted = sealed["sealed"]["predicted"]
    lo, hi = sealed["sealed"]["band"]
    walls = {}
    for r in built.rungs:
        runs = r.runs
        walls[r.name] = 0.0
        for pre, mid, _ev in runs:
            for step in (pre, mid):
                rec = read(prefix, plan, step.name, ".step.json")
                walls[r.name] += float((rec.get("results") or {}).get("wall_s") or 0.0)
    cores = os.cpu_count() or 1
    print(f"laptop ladder: {len(built.rungs)} rungs (data steps, every rung's seeds, fit, seal, target, check): "
          f"{meter.seconds:.0f} CPU s in all processes, so {meter.seconds / cores:.0f} s on {cores} idle cores; "
          f"{wall:.0f} s wall on this machine (load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"  {'rung':<12} {'width':>5} {'layers':>6} {'heads':>5} {'active':>8} {'tokens':>8} {'steps':>5} {'batch':>5} "
          f"{'lr':>7} {'FLOPs':>9} {'seeds':>5} {'loss (per seed)':<26} {'train s':>8}")
    rungs = {r["name"]: r for r in fit["rungs"]}
    for r in built.rungs:
        s = r.sized
        loss = rungs[r.name]["loss"] if r.name in rungs else actual
        per_seed = rungs[r.name].get("seed_losses") if r.name in rungs else None
        seeds = f" ({', '.join(f'{x:.4f}' for x in per_seed)})" if per_seed and len(per_seed) > 1 else ""
        print(f"  {r.name:<12} {s.model.dim:>5} {s.model.n_layers:>6} {s.model.n_heads:>5} {s.active_params:>8,} "
              f"{s.tokens:>8,.0f} {s.steps:>5} {s.batch:>5} {s.lr:>7.4f} {s.flops:>9.3g} {len(r.runs):>5} "
              f"{f'{loss:.4f}{seeds}':<26} {walls[r.name]:>8.0f}")
    law = fit["law"]
    print(f"  law on rungs 1-4: L(C) = {law['E']:.4f} + {law['A']:.4g} C^-{law['alpha']:.4f} "
          f"(floor {'pinned' if fit['floor'] is not None else 'fitted'}; eval `{fit['metric']}`)")
    err = pct(actual, predicted)
    half = max(abs(pct(lo, predicted)), abs(pct(hi, predicted)))
    print(f"  rung 5 ({top.name}, {top.sized.flops:.3g} FLOPs, {top.sized.flops / built.rungs[-2].sized.flops:.2f}x "
          f"rung 4): predicted {predicted:.4f} [{lo:.4f}, {hi:.4f}], landed {actual:.4f}")
    print(f"  verdict: {verdict['line']}")
    print(f"  fit on rungs 1-4 predicts rung 5 within 1.5%?  {'yes' if abs(err) <= 1.5 else 'no'} "
          f"(error {err:+.2f}%)")
    print(f"  90% band covers rung 5 and is no wider than +-3%?  "
          f"{'yes' if lo <= actual <= hi and half <= 3.0 else 'no'} (covers: {'yes' if lo <= actual <= hi else 'no'}; "
          f"half-width {half:.2f}%)")
    base = report["baselines"]["at_target"]
    errs = {"law": err, "power law (no floor)": pct(actual, base["power_law"]) if base["power_law"] else None,
            "two-point line": pct(actual, base["two_point"])}
    print("  rung 5 predicted from rungs 1-4, side by side (|error| ratio to the law's):")
    for name, e in errs.items():
        ratio = f"{abs(e) / abs(err):.2f}x" if e is not None and err else "-"
        print(f"    {name:<22} {'-' if e is None else f'{e:+.2f}%':>9}  {ratio}")
    beats = all(e is not None and abs(err) < abs(e) for k, e in errs.items() if k != "law")
    print(f"  law beats both baselines at rung 5?  {'yes' if beats else 'no'}")
    lfo = report["leave_future_out"]
    for row in lfo:
        law_row = f"{row['error_pct']:+.2f}%" if row["error_pct"] is not None else f"no fit ({row.get('reason')})"
        print(f"    leave-future-out: fit on {row['fit_on']} -> {row['rung']}: law {law_row}, "
              f"power law {row['power_law_error_pct']:+.2f}%, two-point {row['two_point_error_pct']:+.2f}%")
    if not args.prefix:
        shutil.rmtree(prefix, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
