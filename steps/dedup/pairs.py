"""Dedup pass 2: the duplicate pairs of one (section, key range), from every shard's sorted run.

A task merges the runs of all shards as a stream (`heapq.merge` over `RunReader`s, each reading
only its run's records in the range, a chunk at a time) and walks it bucket by bucket (records
with one key), each bucket a block of `BLOCK` members at a time (`_Bucket`), so that a
boilerplate bucket of a million copies costs a block, not a million members. In a bucket,
sorted by global id:
- content hashes (section -1): members whose whole 128-bit hash is equal are paired with the
  first of them; their count less one is what exact dedup removes;
- a band: every member is a candidate with the bucket's first, and, when verifying, with its
  predecessor too (so a chain of near-duplicates is found even when the first is far from the
  last). A candidate is verified when the fraction of equal signature values (the estimated
  Jaccard, from the signatures carried in the run) is >= the threshold; without a threshold, all
  are. A verified pair with the predecessor is written only when the two are not both paired
  with the first already (it would join nothing new).

So the task's memory is a chunk of each run, one block and one part of pairs
(`pair_task_bytes`), never the corpus or its largest bucket. It writes its pairs in parts of at
most `PAIRS_PART`, `work/pairs/{ranges}/{section}/{range}.PPPP.npy` (uint64 [m, 2], smaller id
first) and, last, a `.json` beside them with its counts and each part's pairs (the marker that
the range is done; `ranges`, the number of slices, is in the path so a resumed attempt with
another task budget never takes a slice for another).
"""

from __future__ import annotations

import heapq
import io
from dataclasses import dataclass

import numpy as np

from steps.dedup.runs import RunReader, record_dtype
from steps.data.formats import join, write_bytes, write_json

EXACT = -1  # the section of content hashes
BLOCK = 4096  # members of one bucket compared at once: a bucket of any size is walked in blocks
PAIRS_PART = 1 << 20  # pairs a task holds before it writes them out as one part file
READ_OVERHEAD = 160  # bytes a record costs a reader beside the record: its key and id as Python ints, the heap


def pair_task_bytes(runs: int, chunk: int, width: int) -> int:
    """What one pass-2 task holds at most, whatever its range or its largest bucket: a chunk of
    every run, a block of one bucket's members and a part of pairs (joined once when written)."""
    rec = record_dtype(max(2, width)).itemsize
    # a chunk of every run, and one more: the one the bucket's first member is in
    return (runs + 1) * chunk * (rec + READ_OVERHEAD) + BLOCK * (rec + 2 * READ_OVERHEAD) + PAIRS_PART * 16 * 3


@dataclass(frozen=True)
class PairJob:
    """One pass-2 task: a section (EXACT or a band) and a key range, over every shard's run."""

    output: str
    section: int
    index: int  # the range's number
    lo: int
    hi: int | None
    shards: tuple[tuple[str, int], ...]  # (run URL without suffix, documents) per run, in id order
    width: int  # payload words per record
    threshold: float | None  # fuzzy: keep a candidate whose estimated Jaccard is >= this
    examples: int = 8
    chunk: int = 4096
    ranges: int = 1  # how many slices the section is cut into

    @property
    def name(self) -> str:
        return join(self.output, f"work/pairs/{self.ranges}/{self.section}/{self.index:05d}")


class PairSink:
    """The pairs a task finds, written out `part` pairs at a time as `{name}.PPPP.npy` (uint64
    [m, 2]), or, without a name, kept (`pairs()`)."""

    def __init__(self, name: str | None = None, part: int = PAIRS_PART) -> None:
        self.name, self.part = name, part
        self.held: list[np.ndarray] = []
        self.count = 0  # pairs held now
        self.sizes: list[int] = []  # pairs of each part written

    def add(self, pairs: np.ndarray) -> None:
        if len(pairs):
            self.held.append(pairs)
            self.count += len(pairs)
            if self.name is not None and self.count >= self.part:
                self.flush()

    def pairs(self) -> np.ndarray:
        return np.concatenate(self.held) if self.held else np.zeros((0, 2), np.uint64)

    def flush(self) -> None:
        if self.name is None or (not self.count and self.sizes):
            return
        buf = io.BytesIO()
        np.save(buf, self.pairs())
        write_bytes(f"{self.name}.{len(self.sizes):04d}.npy", buf.getvalue())
        self.sizes.append(self.count)
        self.held, self.count = [], 0


def pair_task(job: PairJob) -> dict:
    """Run one pass-2 task (see the module's doc); returns its counts, also written as JSON (with
    `parts`, the pairs in each part file)."""
    sink = PairSink(job.name)
    out = find_pairs(job, sink)
    sink.flush()
    out["parts"] = sink.sizes
    write_json(job.name + ".json", out)
    return out


def find_pairs(job: PairJob, sink: PairSink | None = None) -> dict:
    """The counts of the job's range, its pairs going to `sink` (without one: returned as
    `pair_list`, not written)."""
    keep = sink is None
    sink = sink or PairSink()
    section = max(job.section, 0)
    readers = [RunReader(url, section, n, job.width, job.lo, job.hi, job.chunk) for url, n in job.shards]
    walk = _Bucket(job, sink)
    bucket: list[tuple[int, int, np.ndarray, int]] = []
    key = None
    records = 0
    for rec in heapq.merge(*readers):
        records += 1
        if rec[0] != key:
            if len(bucket) > 1 or walk.seen:
                walk.block(bucket, last=True)
            bucket = [rec]
            key = rec[0]
        else:  # a copy of its payload: the block must not keep the reader's chunk alive
            bucket.append((rec[0], rec[1], rec[2][rec[3]].copy(), ...))
            if len(bucket) >= BLOCK:
                walk.block(bucket, last=False)
                bucket = []
    if len(bucket) > 1 or walk.seen:
        walk.block(bucket, last=True)
    counts = dict(walk.counts, records=records, pairs=walk.pairs, bytes_read=sum(r.bytes_read for r in readers))
    examples = sorted(walk.examples)[:job.examples]
    out = dict(counts, examples=examples)
    if keep:
        out["pair_list"] = [tuple(p) for p in sink.pairs().tolist()]
    return out


class _Bucket:
    """Walks one bucket at a time, a block of members at a time, holding between blocks only what
    the next block is compared with: the bucket's first member and the block's last.

    - content hashes: a member whose whole hash equals an earlier member's is paired with the
      first such member (the first members of each distinct hash are kept: one, but for a
      collision of the key's 64 bits);
    - a band: each member is a candidate with the bucket's first, and, when verifying, with its
      predecessor (so a chain of near-duplicates is found even when the first is far from the
      last). A candidate whose estimated Jaccard is >= the threshold is verified. Every verified
      pair with the first is written; one with the predecessor only when the two are not both
      already paired with the first (the components are the same, and a boilerplate bucket of m
      copies gives m - 1 pairs, not 2m - 3)."""

    def __init__(self, job: PairJob, sink: PairSink) -> None:
        self.job, self.sink = job, sink
        self.exact = job.section == EXACT
        self.chain = not self.exact and job.threshold is not None
        self.counts = {"candidates": 0, "verified": 0, "exact_removed": 0}
        self.pairs = 0
        self.examples: list[list] = []
        self._reset()

    def _reset(self) -> None:
        self.seen = 0  # members of the current bucket already walked
        self.first_hash: dict[bytes, int] = {}
        self.first: tuple[int, np.ndarray] | None = None
        self.prev: tuple[int, np.ndarray, bool] | None = None

    def _emit(self, a: np.ndarray, b: np.ndarray) -> None:
        if len(a):
            self.sink.add(np.stack([a, b], axis=1).astype(np.uint64))
            self.pairs += len(a)

    def block(self, members: list, last: bool) -> None:
        if members:
            (self._exact if self.exact else self._band)(members)
            self.seen += len(members)
        if last:
            self._reset()

    def _exact(self, members: list) -> None:
        a, b = [], []
        for _key, gid, pay, row in members:
            h = pay[row].tobytes()
            if h in self.first_hash:
                a.append(self.first_hash[h])
                b.append(gid)
            else:
                self.first_hash[h] = gid
        self.counts["exact_removed"] += len(a)
        self._emit(np.array(a, np.uint64), np.array(b, np.uint64))

    def _band(self, members: list) -> None:
        job = self.job
        gids = np.array([m[1] for m in members], dtype=np.uint64)
        start = 0
        if self.first is None:
            self.first = (int(gids[0]), np.array(members[0][2][members[0][3]]))
            start = 1
        n = len(members) - start  # star candidates in this block
        chain_from = max(start, 2 - self.seen)  # block positions with a predecessor that is not the first
        n_chain = len(members) - chain_from if self.chain else 0
        self.counts["candidates"] += n + max(0, n_chain)
        first_gid = np.uint64(self.first[0])
        if job.threshold is None:
            self._emit(np.full(n, first_gid), gids[start:])
            self.examples.extend([self.first[0], int(g), None] for g in gids[start:start + job.examples].tolist())
            return
        sig = np.stack([pay[row] for _k, _g, pay, row in members])
        est0 = (sig[start:] == self.first[1]).mean(axis=1)
        att = np.concatenate([np.ones(start, bool), est0 >= job.threshold])  # paired with the first
        ok = att[start:]
        self._emit(np.full(int(ok.sum()), first_gid), gids[start:][ok])
        self._note(np.full(n, self.first[0]), gids[start:], est0, ok)
        self.counts["verified"] += int(ok.sum())
        if n_chain > 0:
            # each member against its predecessor: the block's previous member, or the last
            # of the block before (no copies of the block's signatures)
            head = (sig[0] == self.prev[1]).mean() if self.prev is not None else 0.0
            est_all = np.concatenate([[head], (sig[1:] == sig[:-1]).mean(axis=1)])
            gid_before = np.concatenate([[np.uint64(self.prev[0]) if self.prev is not None else gids[0]], gids[:-1]])
            att_before = np.concatenate([[self.prev[2] if self.prev is not None else True], att[:-1]])
            pos = np.arange(chain_from, len(members))
            est = est_all[pos]
            good = est >= job.threshold
            self.counts["verified"] += int(good.sum())
            self._note(gid_before[pos], gids[pos], est, good)
            new = good & ~(att_before[pos] & att[pos])
            self._emit(gid_before[pos][new], gids[pos][new])
        self.prev = (int(gids[-1]), sig[-1].copy(), bool(att[-1]))

    def _note(self, a: np.ndarray, b: np.ndarray, est: np.ndarray, good: np.ndarray) -> None:
        """Examples: verified pairs that are near, not identical (worth showing)."""
        room = 4 * self.job.examples - len(self.examples)
        if room <= 0:
            return
        for i in np.flatnonzero(good & (est < 1.0))[:room].tolist():
            self.examples.append([int(a[i]), int(b[i]), float(est[i])])
