"""Whole-process time of `marin-run --help` and `--dry-run` of voyages/hello.py.

    .venv/bin/python -m bench.cli_startup [--repeat 5]

Prints the median of each beside a bare `python -c pass` (the floor), and checks that `--help`
imports neither torch nor ray.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import subprocess
import sys
import tempfile

from bench import kit  # noqa: E402

ROOT = str(kit.ROOT)
MARIN_RUN = os.path.join(os.path.dirname(sys.executable), "marin-run")


def timed(cmd: list[str], repeat: int) -> float:
    """The median wall seconds of `repeat` runs of `cmd`."""
    return kit.timed(lambda: subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            check=True), repeats=repeat).wall_median


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
        kit.emit(name, quiet=True, wall_median_ms=round(t * 1000, 1), x_python_startup=round(t / floor, 2),
                 repeats=args.repeat)
    probe = ("import sys; from executor.cli import main; main(['voyages/hello.py', '--help']); "
             "print('HEAVY', sorted(m for m in ('ray', 'torch') if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    print("modules --help imported of (ray, torch):", out.stderr.strip().split("HEAVY")[-1].strip())


if __name__ == "__main__":
    main()
