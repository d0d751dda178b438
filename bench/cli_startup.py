"""Whole-process time of `marin-run --help` and `--dry-run` of voyages/hello.py.

    .venv/bin/python bench/cli_startup.py [--repeat 5]

Prints the median of each beside a bare `python -c pass` (the floor), and checks that `--help`
imports neither torch nor ray.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARIN_RUN = os.path.join(os.path.dirname(sys.executable), "marin-run")


def timed(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    prefix = tempfile.mkdtemp(prefix="marin-bench-cli-")
    floor = timed([sys.executable, "-c", "pass"], args.repeat)
    rows = [
        ("python -c pass", floor),
        ("marin-run hello --help", timed([MARIN_RUN, "voyages/hello.py", "--help"], args.repeat)),
        ("marin-run hello --dry-run", timed([MARIN_RUN, "voyages/hello.py", "--dry-run", "--prefix", prefix],
                                            args.repeat)),
    ]
    for name, t in rows:
        print(f"{name:<28} {t * 1000:7.0f} ms  {t / floor:5.1f}x python's start-up")
    probe = ("import sys; from executor.cli import main; main(['voyages/hello.py', '--help']); "
             "print('HEAVY', sorted(m for m in ('ray', 'torch') if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    print("modules --help imported of (ray, torch):", out.stderr.strip().split("HEAVY")[-1].strip())


if __name__ == "__main__":
    main()
