"""Dedup pass 2: the duplicate pairs of one (section, key range), from every shard's sorted run.

A task merges the runs of all shards as a stream (`heapq.merge` over `RunReader`s, each reading
only its shard's records in the range, a chunk at a time) and walks it bucket by bucket (records
with one key). In a bucket, sorted by global id:
- content hashes (section -1): members whose whole 128-bit hash is equal are paired with the
  first of them; their count less one is what exact dedup removes;
- a band: every member is a candidate with the bucket's first, and, when verifying, with its
  predecessor too (so a chain of near-duplicates is found even when the first is far from the
  last). A candidate is kept when the fraction of equal signature values (the estimated Jaccard,
  from the signatures carried in the run) is >= the threshold; without a threshold, all are kept.

So the task's memory is its chunks and the pairs of its range, never the corpus. It writes
`work/pairs/{ranges}/{section}/{range}.npy` (uint64 [m, 2], smaller id first) and, last, a `.json`
beside it with its counts (the marker that the range is done; `ranges`, the number of slices, is
in the path so a resumed attempt with another task budget never takes a slice for another).
"""

from __future__ import annotations

import heapq
import io
from dataclasses import dataclass

import numpy as np

from steps.data.dedup_runs import RunReader
from steps.data.formats import join, write_bytes, write_json

EXACT = -1  # the section of content hashes


@dataclass(frozen=True)
class PairJob:
    """One pass-2 task: a section (EXACT or a band) and a key range, over every shard's run."""

    output: str
    section: int
    index: int  # the range's number
    lo: int
    hi: int | None
    shards: tuple[tuple[str, int], ...]  # (run URL without suffix, documents) per shard, by shard index
    width: int  # payload words per record
    threshold: float | None  # fuzzy: keep a candidate whose estimated Jaccard is >= this
    examples: int = 8
    chunk: int = 4096
    ranges: int = 1  # how many slices the section is cut into

    @property
    def name(self) -> str:
        return join(self.output, f"work/pairs/{self.ranges}/{self.section}/{self.index:05d}")


def pair_task(job: PairJob) -> dict:
    """Run one pass-2 task (see the module's doc); returns its counts, also written as JSON."""
    out = find_pairs(job)
    pairs = np.array(out.pop("pair_list"), dtype=np.uint64).reshape(-1, 2)
    buf = io.BytesIO()
    np.save(buf, pairs)
    write_bytes(job.name + ".npy", buf.getvalue())
    write_json(job.name + ".json", out)
    return out


def find_pairs(job: PairJob) -> dict:
    """The pairs of the job's range and its counts (not written)."""
    section = max(job.section, 0)
    readers = [RunReader(url, section, n, job.width, job.lo, job.hi, job.chunk) for url, n in job.shards]
    exact = job.section == EXACT
    chain = not exact and job.threshold is not None
    pairs: list[tuple[int, int]] = []
    examples: list[list] = []
    counts = {"candidates": 0, "pairs": 0, "exact_removed": 0, "records": 0}
    bucket: list[tuple[int, int, np.ndarray, int]] = []
    key = None
    for rec in heapq.merge(*readers):
        counts["records"] += 1
        if rec[0] != key:
            if len(bucket) > 1:
                (_exact_bucket if exact else _band_bucket)(bucket, job, chain, pairs, examples, counts)
            bucket = [rec]
            key = rec[0]
        else:
            bucket.append(rec)
    if len(bucket) > 1:
        (_exact_bucket if exact else _band_bucket)(bucket, job, chain, pairs, examples, counts)
    counts["pairs"] = len(pairs)
    counts["bytes_read"] = sum(r.bytes_read for r in readers)
    examples.sort()
    return dict(counts, examples=examples[:job.examples], pair_list=pairs)


def _exact_bucket(bucket, job, chain, pairs, examples, counts) -> None:
    first: dict[bytes, int] = {}
    for _key, gid, pay, row in bucket:
        h = pay[row].tobytes()
        if h in first:
            pairs.append((first[h], gid))
            counts["exact_removed"] += 1
        else:
            first[h] = gid


def _band_bucket(bucket, job, chain, pairs, examples, counts) -> None:
    gids = [m[1] for m in bucket]
    cand = [(0, k) for k in range(1, len(bucket))]
    if chain:
        cand += [(k - 1, k) for k in range(2, len(bucket))]
    counts["candidates"] += len(cand)
    if job.threshold is None:
        pairs.extend((gids[a], gids[b]) for a, b in cand)
        examples.extend([gids[a], gids[b], None] for a, b in cand[:job.examples])
        return
    sig = np.stack([pay[row] for _k, _g, pay, row in bucket])
    a = np.array([c[0] for c in cand])
    b = np.array([c[1] for c in cand])
    est = (sig[a] == sig[b]).mean(axis=1)
    for i in np.flatnonzero(est >= job.threshold).tolist():
        pair = (gids[a[i]], gids[b[i]])
        pairs.append(pair)
        if est[i] < 1.0 and len(examples) < 4 * job.examples:  # near, not identical: worth showing
            examples.append([pair[0], pair[1], float(est[i])])
