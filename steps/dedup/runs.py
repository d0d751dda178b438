"""Sorted runs: how dedup's pass 1 writes a shard's keys, and how pass 2 reads one key range of them.

A run is a flat file of fixed-size little-endian records, sorted by (key, gid):

    key  uint64   the bucket key (an LSH band key, or the first half of a content hash)
    gid  uint64   the document's global id, `shard << 32 | position`
    pay  uint32[w] what pass 2 needs to verify a pair without reading anything else: the whole
                   MinHash signature (fuzzy, when verifying), the second half of the content
                   hash (exact), or nothing (w = 0)

A shard's file holds one section per band (or one, for the content hashes), section s at byte
`s * n * itemsize`, each section sorted on its own. Beside it, a fence file (`.fence.npy`,
uint64 [sections, ceil(n / FENCE)]) holds every FENCE-th key of each section, so a reader finds
the records of a key range [lo, hi) with one small read and no search through the run itself:
it reads at most FENCE records before lo, and nothing at or past the first fence >= hi.

`RunReader` reads its range lazily, `chunk` records a request (the records before the range in
its first fence block are read and dropped a chunk at a time), so a pass-2 task holds at most one
chunk per shard whatever the shard's size; dedup sizes the chunk as its budget over the shards.
"""

from __future__ import annotations

import io
from typing import Iterable, Iterator

import numpy as np

from executor import AtomicFile
from steps.data.formats import url_fs, write_bytes

FENCE = 256  # records between two fence keys: a reader reads at most this many before its range
CHUNK = 4096  # records a reader fetches at once, by default
MIN_CHUNK = 4  # the least a reader fetches at once


def record_dtype(width: int) -> np.dtype:
    """The record of a run whose payload is `width` uint32 words."""
    return np.dtype([("key", "<u8"), ("gid", "<u8"), ("pay", "<u4", (width,))])


def sort_section(key: np.ndarray, gid: np.ndarray, pay: np.ndarray) -> np.ndarray:
    """One section's records, sorted by (key, gid)."""
    rec = np.empty(key.size, dtype=record_dtype(pay.shape[1] if pay.ndim == 2 else 0))
    order = np.lexsort((gid, key))
    rec["key"], rec["gid"] = key[order], gid[order]
    if rec.dtype["pay"].shape[0]:
        rec["pay"] = pay[order]
    return rec


def write_run(url: str, sections: Iterable[np.ndarray]) -> None:
    """Write sorted sections (same length, same dtype) and their fence keys, streamed: a section
    is written as it comes, so the writer holds one section, never the run."""
    fences = []
    with AtomicFile(url + ".bin") as f:
        for rec in sections:
            f.write(memoryview(np.ascontiguousarray(rec).view(np.uint8)))
            fences.append(rec["key"][::FENCE].copy())
            del rec  # before the next section is made
    fence = np.stack(fences) if fences else np.zeros((0, 0), np.uint64)
    out = io.BytesIO()
    np.save(out, fence.astype(np.uint64))
    write_bytes(url + ".fence.npy", out.getvalue())


class RunReader:
    """The records of one section of one shard's run with key in [lo, hi) (hi None: to the end),
    read lazily in chunks; iterating yields `(key, gid, payloads, row)`, sorted."""

    def __init__(self, url: str, section: int, n: int, width: int, lo: int, hi: int | None,
                 chunk: int = CHUNK) -> None:
        self.fs, self.path = url_fs(url + ".bin")
        self.dtype = record_dtype(width)
        self.lo, self.hi, self.chunk = lo, hi, chunk
        self.bytes_read = 0
        base = section * n
        if n == 0:
            self.start = self.end = base
            return
        fence = read_fence(url, section, n)
        first = max(0, int(np.searchsorted(fence, np.uint64(lo), side="left")) - 1)  # the last fence < lo
        last = len(fence) if hi is None or hi >= 2**64 else int(np.searchsorted(fence, np.uint64(hi), side="left"))
        self.start = base + first * FENCE
        self.end = base + min(n, last * FENCE)

    def chunks(self) -> Iterator[np.ndarray]:
        """The range's records, a chunk at a time (the first and last trimmed to [lo, hi)). A
        chunk is let go before the next is read: a reader holds one chunk, never two."""
        at = self.start
        while at < self.end:
            stop = min(self.end, at + self.chunk)
            rec, last = self._read(at, stop)
            at = stop
            if rec.size:
                yield rec
            del rec
            if last:
                return

    def _read(self, at: int, stop: int) -> tuple[np.ndarray, bool]:
        """Records [at, stop) trimmed to [lo, hi), and whether the range ends in them."""
        size = self.dtype.itemsize
        data = self.fs.cat_file(self.path, start=at * size, end=stop * size)
        self.bytes_read += len(data)
        rec = np.frombuffer(data, dtype=self.dtype)
        keys = rec["key"]
        if keys.size and keys[0] < np.uint64(self.lo):
            rec = rec[int(np.searchsorted(keys, np.uint64(self.lo), side="left")):]
            keys = rec["key"]
        if self.hi is not None and self.hi < 2**64 and keys.size and keys[-1] >= np.uint64(self.hi):
            return rec[:int(np.searchsorted(keys, np.uint64(self.hi), side="left"))], True
        return rec, False

    def __iter__(self) -> Iterator[tuple[int, int, np.ndarray, int]]:
        chunks = self.chunks()
        for rec in chunks:
            pay, keys, gids = rec["pay"], rec["key"].tolist(), rec["gid"].tolist()
            del rec
            for row in range(len(keys)):
                yield keys[row], gids[row], pay, row
            del pay, keys, gids  # before the next chunk is read


def read_fence(url: str, section: int, n: int) -> np.ndarray:
    """One section's fence keys, read by byte range (the task never holds the other sections')."""
    fs, path = url_fs(url + ".fence.npy")
    buf = io.BytesIO(fs.cat_file(path, start=0, end=256))  # np.save's header: 128 bytes for a 2-d shape
    np.lib.format.read_magic(buf)
    shape, _, _ = np.lib.format.read_array_header_1_0(buf)
    width = shape[1]
    start = buf.tell() + section * width * 8
    return np.frombuffer(fs.cat_file(path, start=start, end=start + width * 8), dtype="<u8")


def key_ranges(parts: int) -> list[tuple[int, int | None]]:
    """`parts` equal slices [lo, hi) of the uint64 key space (the last open-ended). Keys are
    hash outputs, so equal slices hold about equal numbers of records."""
    step = 2**64 // parts
    return [(k * step, None if k == parts - 1 else (k + 1) * step) for k in range(parts)]
