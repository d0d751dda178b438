"""Read-ahead for the trainer's batches: the next steps' sequences fetched on a background thread
with coalesced range reads, the same bytes as reading them one by one.

At 704 ranks a rank reads 16 sequences a step (64 KB of uint32): the bytes are nothing, the
latency of 16 serial range GETs (30-100 ms each on GCS) is 0.5-1.6 s, and every step waits for
the slowest rank. So `ReadAhead` plans the sequences of the next `depth` steps at once: each
sequence is located through the mixture's sampler (dataset, token window), split at shard
boundaries, and the pieces that fall in the same shard within `gap_tokens` of each other are
merged into one range read. The reads of the whole window go out as one batch
(`TokenDataset.read_spans`: `fs.cat_ranges`, concurrent on an object store), on one background
thread, while the trainer computes. What a step returns is cut from those reads, so it is
bitwise the batch `MixtureSampler.sequence` gives, read ahead or not.

Every fetch runs on the one background thread, also the synchronous fetch after a jump (a resume,
or a rewind that skips data): the sampler's caches are then only ever touched by one thread.
Memory: at most two windows of `depth` steps (a rank's 16 x 4,096 uint32 tokens are 256 KB a step).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable

import numpy as np

from steps.data.mixture import MixtureSampler


class ReadAhead:
    """`rows(s)`: the sequences of step `s` as an array [n, seq_len] of the datasets' dtype,
    with steps s+1 .. s+depth fetched meanwhile. `indices(s)` names the global sequences of step
    `s`; steps at or past `steps` are never fetched ahead. `wait_s` adds up the time callers
    waited for data (what read-ahead is meant to bring to zero)."""

    def __init__(self, sampler: MixtureSampler, indices: Callable[[int], range], steps: int, depth: int = 4,
                 gap_tokens: int = 16_384) -> None:
        self.sampler, self.indices, self.steps = sampler, indices, steps
        self.depth, self.gap_tokens = max(0, depth), gap_tokens
        self.wait_s = 0.0
        self.reads = 0  # range reads issued (after coalescing)
        self.fetched = 0  # steps fetched (ahead or not)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="readahead")
        self._ahead: dict[int, concurrent.futures.Future] = {}  # step -> the future of the window holding it

    def rows(self, s: int) -> np.ndarray:
        start = time.perf_counter()
        future = self._ahead.pop(s, None)
        if future is None:  # a jump (or the first step): what was fetched ahead is for other steps
            self._drop()
            future = self._pool.submit(self._fetch, [s])
        try:
            rows = future.result()[s]
        finally:
            self.wait_s += time.perf_counter() - start
        self._refill(s)
        return rows

    def _refill(self, s: int) -> None:
        """Keep at least `depth` steps after `s` fetched or in flight; a new window takes `depth`
        steps at once, so that its reads coalesce across steps."""
        if not self.depth:
            return
        furthest = max(self._ahead, default=s)
        if furthest - s >= self.depth:
            return
        window = [t for t in range(furthest + 1, furthest + 1 + self.depth) if t < self.steps]
        if window:
            future = self._pool.submit(self._fetch, window)
            for t in window:
                self._ahead[t] = future

    def _drop(self) -> None:
        for future in set(self._ahead.values()):
            future.cancel()
        self._ahead.clear()

    def close(self) -> None:
        self._drop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- on the background thread ----------------------------------------------------------------
    def _fetch(self, steps: list[int]) -> dict[int, np.ndarray]:
        """The rows of `steps`, read as few merged ranges as the layout allows."""
        seq_len = self.sampler.seq_len
        self.fetched += len(steps)
        wanted = [(t, row, i) for t in steps for row, i in enumerate(self.indices(t))]
        # (dataset, shard) -> pieces (first, end, out row, offset in the row)
        pieces: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        for n, (_t, _row, i) in enumerate(wanted):
            loc = self.sampler.locate(i)
            at = 0
            for shard, lo, hi in self.sampler.dataset(loc.dataset).spans(loc.token_start, seq_len):
                pieces.setdefault((loc.dataset, shard), []).append((lo, hi, n, at))
                at += hi - lo
        dtype = next(iter(self.sampler.dataset(name).dtype for name, _ in pieces)) if pieces else np.dtype(np.uint32)
        flat = np.empty((len(wanted), seq_len), dtype=dtype)
        by_dataset: dict[str, list[tuple[int, int, int, list]]] = {}
        for (name, shard), parts in pieces.items():
            for lo, hi, members in _coalesce(parts, self.gap_tokens):
                by_dataset.setdefault(name, []).append((shard, lo, hi, members))
        for name, ranges in by_dataset.items():
            data = self.sampler.dataset(name).read_spans([(k, lo, hi) for k, lo, hi, _ in ranges])
            self.reads += len(ranges)
            for (_k, lo, _hi, members), got in zip(ranges, data):
                for plo, phi, n, at in members:
                    flat[n, at:at + phi - plo] = got[plo - lo:phi - lo]
        out: dict[int, list[int]] = {}
        for n, (t, _row, _i) in enumerate(wanted):
            out.setdefault(t, []).append(n)
        return {t: flat[rows] for t, rows in out.items()}


def _coalesce(parts: list[tuple[int, int, int, int]], gap: int) -> list[tuple[int, int, list]]:
    """Merge pieces of one shard whose gap is at most `gap` tokens: [(first, end, pieces)]."""
    merged: list[tuple[int, int, list]] = []
    for piece in sorted(parts):
        lo, hi = piece[0], piece[1]
        if merged and lo - merged[-1][1] <= gap:
            first, end, members = merged[-1]
            merged[-1] = (first, max(end, hi), members + [piece])
        else:
            merged.append((lo, hi, [piece]))
    return merged
