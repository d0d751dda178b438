"""The logbook's costs: writing a run's entry against the run, and `--log` over 1,000 entries.

    .venv/bin/python -m bench.logbook                         # runs the laptop voyage once (README command)
    .venv/bin/python -m bench.logbook --laptop-prefix out     # ... or reads a laptop prefix already run

1. Writing the log: what `api.run_plan` adds to a laptop run (`executor.logbook.record_run`: the
   statuses of the steps, the records of the failed ones, the trainers' curves, the previous
   entry's config, the entry, the index page) timed `--repeats` times on a copy of the laptop's
   prefix, against the laptop run's own wall time (the `seconds` its entry holds, measured by the
   runner). Each repeat adds an entry, so the later ones also read and render a longer log.
2. `--log` over `--entries` entries: as many copies of the laptop run's entry (16 steps, two loss
   curves) written into a log, then `marin-run voyages/535b.py --laptop --log` as a whole process
   (its start included) and `executor.logbook.entries` + the lines in this process.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import copy
import io
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = str(kit.ROOT)

from executor import logbook  # noqa: E402
from executor.storage.store import Store  # noqa: E402
from executor.views.logbook import print_log, rewrite_index, write_index  # noqa: E402

VOYAGE = os.path.join(ROOT, "voyages", "535b.py")


def laptop_prefix(where: str) -> str:
    prefix = os.path.join(where, "laptop")
    env = {**os.environ, "PYTHONPATH": ROOT}
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "executor.cli", VOYAGE, "--laptop", "--prefix", prefix], cwd=ROOT,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"laptop voyage run in {time.time() - t0:.1f} s (wall, whole process)")
    return prefix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laptop-prefix", help="a prefix the laptop voyage has run on (with its log entry)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--entries", type=int, default=1000)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-logbook-")
    try:
        source = args.laptop_prefix or laptop_prefix(work)
        prefix = os.path.join(work, "copy")
        shutil.copytree(source, prefix, symlinks=True)
        store = Store(prefix)
        found = logbook.entries(store, "535b")
        runs = [e for e in found if e.get("kind") == "run" and e.get("seconds")]
        if not runs:
            raise SystemExit(f"no run entry under {source}/voyages/535b/log: run the laptop voyage with this code")
        run_seconds = runs[0]["seconds"]

        sys.path.insert(0, os.path.dirname(VOYAGE))
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_535b", VOYAGE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        from executor.api import plan_steps
        from executor.runner import Outcome, RunSummary

        config = module.VoyageConfig(laptop=True)
        plan = plan_steps(module.voyage(config), prefix)
        # the run as the runner reported it: every step ran (its times from the entry)
        summary = RunSummary(seconds=run_seconds)
        for d in plan.decisions:
            row = runs[0]["steps"].get(d.name, {})
            summary.outcomes[d.name] = Outcome(d.name, d.status.state if d.status else d.state, attempts=1,
                                               started=0.0, ended=row.get("seconds", 0.0))
        from executor import environment

        environment.current.cache_clear()
        logbook._git_info.cache_clear()
        git = kit.timed(logbook.git_info)  # once per process: the commit, `git status`, and `git diff HEAD` when dirty
        git_once, git_cpu = git.wall_min, git.cpu_min

        def record() -> None:
            assert logbook.record_run(plan, summary, "535b", extra={"config": config, "note": "bench"}) is not None
            rewrite_index(plan.store, "535b")  # as api.run_plan does after each entry

        recorded = kit.timed(record, repeats=args.repeats)
        times, cpu = list(recorded.wall), list(recorded.cpu)
        write = statistics.median(times) + git_once
        print(f"\n1. writing the log of a laptop run (median of {args.repeats}; entries {len(found) + 1}.."
              f"{len(found) + args.repeats})")
        print(f"   {'laptop run (its entry)':<34} {run_seconds:>9.2f} s")
        print(f"   {'git state, once a process':<34} {git_once:>9.3f} s   (CPU {git_cpu:.3f} s in this process)")
        print(f"   {'record_run (entry + index page)':<34} {statistics.median(times):>9.3f} s   (min {min(times):.3f}, "
              f"max {max(times):.3f}; CPU {statistics.median(cpu):.3f} s)")
        print(f"   {'both, against the run':<34} {write:>9.3f} s   ratio {write / run_seconds:.2%}; against a "
              f"60 s laptop run on a quiet machine (README) {write / 60:.2%}")

        # 2. --log over N entries: copies of the laptop entry, each its own object
        template = {k: v for k, v in runs[0].items() if k != "_name"}
        log_prefix = os.path.join(work, "log")
        log_store = Store(log_prefix)
        t0 = time.perf_counter()
        base = time.time() - args.entries
        for i in range(args.entries):
            entry = copy.copy(template)
            entry["time"] = base + i
            entry["note"] = f"entry {i}"
            logbook.write_entry(log_store, "535b", entry, previous=False)
        written = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(log_prefix, "voyages/535b/log", n))
                   for n in os.listdir(os.path.join(log_prefix, "voyages/535b/log")))
        t0, c0 = time.perf_counter(), time.process_time()
        got = logbook.entries(log_store, "535b")
        print_log(got, io.StringIO())
        in_process, in_cpu = time.perf_counter() - t0, time.process_time() - c0
        env = {**os.environ, "PYTHONPATH": ROOT}
        whole, whole_cpu = [], []
        for _ in range(3):
            t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run([sys.executable, "-m", "executor.cli", VOYAGE, "--laptop", "--log", "--prefix",
                                  log_prefix], cwd=ROOT, env=env, check=True, capture_output=True)
            whole.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            whole_cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        base, base_cpu = [], []
        for _ in range(3):  # the start every marin-run pays (`--help`: the package imported, nothing read)
            t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "executor.cli", "--help"], cwd=ROOT, env=env, check=True,
                           capture_output=True)
            base.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            base_cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        lines = out.stdout.decode().count("\n")
        assert len(got) == args.entries == lines, (len(got), lines)
        t0 = time.perf_counter()
        write_index(log_store, "535b")
        index = time.perf_counter() - t0
        print(f"\n2. --log over {args.entries:,} entries ({size / 1e6:.1f} MB, written in {written:.2f} s)")
        print(f"   {'entries() + lines, in process':<34} {in_process:>9.3f} s   (CPU {in_cpu:.3f} s)")
        print(f"   {'marin-run --log, whole process':<34} {statistics.median(whole):>9.3f} s   (median of 3; "
              f"min {min(whole):.3f}; CPU {statistics.median(whole_cpu):.3f} s)")
        print(f"   {'marin-run --help (the start alone)':<34} {statistics.median(base):>9.3f} s   (median of 3; "
              f"CPU {statistics.median(base_cpu):.3f} s); --log / --help {statistics.median(whole) / statistics.median(base):.2f}x")
        print(f"   {'the index page of them':<34} {index:>9.3f} s   (the newest 100 entries shown)")
        print(f"   load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
