"""Dedup's memory flatness: the tracemalloc peak of the largest pass-2 task at 1x, 4x and 16x the
documents with a fixed task budget (`keys_per_task`) and as many pass-1 tasks (each takes `scale`
shards, so its runs hold more documents), against main's pass 2 (one task per band
holding every shard's keys, kept below as "before") on the same band keys.

    .venv/bin/python -m bench.data_dedup_memory --scales 1 4 16 --keys-per-task 400

The corpus is bench/data_common's (the bundled corpus plus word-shuffled copies); the step runs
in this process with a mapper that traces every pass-2 task. "before" reads band 0 of every
shard's run (ordered by position, as main's key files were) and runs main's algorithm on it.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import shutil
import tracemalloc

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402

from bench.data_common import WORK, ctx, shards  # noqa: E402


def before_band_pairs(keys_per_shard: list[np.ndarray]) -> np.ndarray:
    """main's pass 2 for one band (steps/dedup/dedup.py before the sorted runs): all keys at once."""
    keys = [np.asarray(k) for k in keys_per_shard]
    gids = [(np.uint64(i) << np.uint64(32)) | np.arange(len(k), dtype=np.uint64) for i, k in enumerate(keys)]
    key, gid = np.concatenate(keys), np.concatenate(gids)
    order = np.argsort(key, kind="stable")
    key, gid = key[order], gid[order]
    same = key[1:] == key[:-1]
    if gid.size < 2:
        return np.zeros((0, 2), np.uint64)
    idx = np.arange(gid.size)
    new_run = np.concatenate([[True], ~same])
    first = np.maximum.accumulate(np.where(new_run, idx, 0))
    member = np.flatnonzero(~new_run)
    pairs = [np.stack([gid[first[member]], gid[member]], axis=1)]
    later = member[first[member] != member - 1]
    pairs.append(np.stack([gid[later - 1], gid[later]], axis=1))
    return np.sort(np.concatenate(pairs).astype(np.uint64), axis=1)


def traced(fn, *args) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn(*args)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(scale: int, keys_per_task: int) -> dict:
    from steps.dedup.dedup import DedupConfig, dedup
    from steps.dedup.runs import record_dtype
    from steps.data.formats import url_fs

    src = shards(scale)
    out = WORK / f"dedup-memory-x{scale}"
    shutil.rmtree(out, ignore_errors=True)
    got = {"new": 0, "tasks": 0, "before": 0, "records": 0}

    def mapper(fn, items, resources=None):
        results = []
        for job in items:
            if fn.__name__ != "pair_task":
                results.append(fn(job))
                continue
            res, peak = traced(fn, job)
            got["new"] = max(got["new"], peak)
            got["tasks"] += 1
            got["records"] = max(got["records"], res["records"])
            if job.section == 0 and job.index == 0:  # main's pass 2 on the same band
                keys = []
                for url, n in job.shards:
                    fs, path = url_fs(url + ".bin")
                    rec = np.frombuffer(fs.cat_file(path, 0, n * record_dtype(job.width).itemsize),
                                        dtype=record_dtype(job.width))
                    keys.append(rec["key"][np.argsort(rec["gid"] & np.uint64(0xFFFFFFFF))].copy())
                got["before"] = traced(before_band_pairs, keys)[1]
            results.append(res)
        return results

    c = ctx(out)
    c.mapper = mapper
    # as many pass-1 tasks (runs) at every scale: each takes `scale` shards
    dedup(DedupConfig(documents=str(src), keys_per_task=keys_per_task, shards_per_task=scale), c)
    got["documents"] = c.results["documents_in"]
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--keys-per-task", type=int, default=400)
    args = ap.parse_args()
    rows = [measure(s, args.keys_per_task) for s in args.scales]
    print(f"keys_per_task {args.keys_per_task}; 28 bands x 4 rows, verify 0.7 (the step's defaults)")
    print(f"{'scale':>6s} {'documents':>10s} {'pass-2 tasks':>13s} {'largest task: records':>22s} "
          f"{'peak (KiB)':>11s} {'before: peak (KiB)':>19s}")
    for s, r in zip(args.scales, rows):
        print(f"{s:>5d}x {r['documents']:>10,d} {r['tasks']:>13,d} {r['records']:>22,d} {r['new'] / 1024:>11,.0f} "
              f"{r['before'] / 1024:>19,.0f}")
    new = [r["new"] for r in rows]
    old = [r["before"] for r in rows]
    print(f"largest / smallest peak: ours {max(new) / min(new):.2f}x (target <= 1.25), "
          f"before {old[-1] / old[0]:.1f}x over {args.scales[-1] // args.scales[0]}x the documents")


if __name__ == "__main__":
    main()
