"""The README's test command, seen worker by worker: which groups each xdist worker ran, when,
and how long it stood idle at the end (the critical path is the worker that finishes last).

    MARIN_SUITE_TIMELINE=/tmp/t.jsonl .venv/bin/python -m pytest -q -n 3 --dist loadgroup
    .venv/bin/python -m bench.suite_timeline /tmp/t.jsonl [--top 8]
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import collections
import json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("timeline")
    p.add_argument("--top", type=int, default=8, help="groups listed per worker, longest first")
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.timeline)]
    t0 = min(r["start"] for r in rows)
    end = max(r["stop"] for r in rows)
    by_worker = collections.defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    print(f"suite: {end - t0:.0f} s from the first test's start to the last test's end, {len(by_worker)} workers")
    for worker in sorted(by_worker):
        rs = by_worker[worker]
        groups = collections.defaultdict(lambda: [float("inf"), 0.0, 0.0])
        for r in rs:
            g = groups[r["test"].rpartition("@")[2] or r["test"].split("::")[0]]
            g[0], g[1] = min(g[0], r["start"]), max(g[1], r["stop"])
            g[2] += r["stop"] - r["start"]
        busy = sum(r["stop"] - r["start"] for r in rs)
        last = max(r["stop"] for r in rs)
        print(f"\n{worker}: busy {busy:.0f} s, done at {last - t0:.0f} s (idle {end - last:.0f} s at the end)")
        for name, (a, b, spent) in sorted(groups.items(), key=lambda kv: -kv[1][2])[:args.top]:
            print(f"  {spent:6.1f} s  {a - t0:6.0f} .. {b - t0:6.0f}  {name}")


if __name__ == "__main__":
    main()
