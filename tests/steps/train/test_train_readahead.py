"""The trainer's read-ahead (steps/train/readahead.py): bitwise the batches read one by one, in
order, after jumps and across shard boundaries; reads coalesced and issued off the training
thread, on a store that is not memory-mapped (a memory filesystem under another protocol, which
counts the range reads it serves)."""

import threading

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from executor.testing import build_context
from steps.data.formats import TokenShardWriter, write_json
from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, load_mixture, mixture
from steps.train.data import Batches


class RangeFS(MemoryFileSystem):
    """memory:// as a remote store: ranges read, and by which thread."""

    protocol = ("rangemem",)
    ranges: list = []

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("rangemem://"):
            path = path[len("rangemem://"):]
        return super()._strip_protocol(path)

    def cat_file(self, path, start=None, end=None, **kw):
        RangeFS.ranges.append((threading.current_thread().name, path, start, end))
        return super().cat_file(path, start, end, **kw)


fsspec.register_implementation("rangemem", RangeFS, clobber=True)


def _dataset(url, name, seed, shard_sizes):
    rng = np.random.default_rng(seed)
    shards = []
    for k, n in enumerate(shard_sizes):
        with TokenShardWriter(f"{url}/shards", f"{k:05d}", np.uint16) as w:
            w.write(rng.integers(0, 60_000, n, dtype=np.uint16), np.array([n]))
        shards.append({"name": f"{k:05d}", "tokens": n, "documents": 1, "source": f"{name}-{k}"})
    write_json(f"{url}/manifest.json", {"format": "marin-tokens/1", "dtype": "uint16", "vocab_size": 60_000,
                                        "tokenizer": "t", "bos": None, "eos": None, "bos_id": None, "eos_id": None,
                                        "tokens": sum(shard_sizes), "documents": len(shard_sizes), "shards": shards})
    return url


@pytest.fixture(scope="module")
def manifest():
    # shards of odd sizes, so that windows of 33 tokens straddle shard boundaries
    a = _dataset("rangemem://ra/a", "a", 0, [1000, 517, 2048])
    b = _dataset("rangemem://ra/b", "b", 1, [777, 1500])
    ctx = build_context("rangemem://ra/mix", name="mix", digest="0" * 64)
    mixture(MixtureConfig(datasets={"a": a, "b": b}, token_budget=320 * 33, seq_len=33, block_size=32,
                          stages=(MixtureStage(0.5, {"a": 0.7, "b": 0.3}), MixtureStage(0.5, {"a": 0.2, "b": 0.8}))), ctx)
    return load_mixture("rangemem://ra/mix/mixture.json")


def test_read_ahead_gives_bitwise_the_same_batches_in_order_and_after_jumps(manifest):
    sampler = MixtureSampler(manifest)
    steps = sampler.size // 16
    for rank in (0, 1):
        plain = Batches(manifest, 16, rank, 2, 4, ahead=0)
        ahead = Batches(manifest, 16, rank, 2, 4, ahead=3)
        order = list(range(steps)) + [7, 2, 2, 9, 0, steps - 1, 3]  # a resume, a rewind, the last step
        for s in order:
            got, want = ahead.step(s), plain.step(s)
            assert len(got) == len(want) == 2
            for g, w in zip(got, want):
                assert g.dtype == w.dtype == np.int64 and np.array_equal(g, w)
            # and both are what the sampler reads one sequence at a time (the reader before read-ahead)
            first = s * 16 + rank * 8
            ref = np.stack([sampler.sequence(i) for i in range(first, first + 8)]).astype(np.int64)
            assert np.array_equal(np.concatenate(got), ref)
        ahead.close()
        plain.close()


def test_reads_are_coalesced_and_off_the_training_thread(manifest):
    sampler = MixtureSampler(manifest)
    steps = sampler.size // 16
    RangeFS.ranges = []
    for i in range(steps * 16):  # the reader before read-ahead: one sequence at a time
        sampler.sequence(i)
    serial = [r for r in RangeFS.ranges if r[1].endswith(".tokens")]
    RangeFS.ranges = []
    ahead = Batches(manifest, 16, 0, 1, 0, ahead=4)
    for s in range(steps):
        ahead.step(s)
    ahead.close()
    batched = [r for r in RangeFS.ranges if r[1].endswith(".tokens")]
    assert len(serial) >= steps * 16  # one read a sequence at least (two where it straddles shards)
    assert len(batched) == ahead.reader.reads and len(batched) < len(serial) / 4, (len(batched), len(serial))
    names = {name for name, *_ in batched}
    assert names == {"readahead_0"}  # never the training thread


def test_an_error_reading_ahead_reaches_the_step_that_needs_it(manifest, monkeypatch):
    ahead = Batches(manifest, 16, 0, 1, 0, ahead=2)
    ahead.step(0)
    broken = RangeFS.cat_file

    def fail(self, path, start=None, end=None, **kw):
        raise ConnectionResetError("store gone")

    monkeypatch.setattr(RangeFS, "cat_file", fail)
    with pytest.raises(ConnectionResetError):
        for s in range(1, 6):
            ahead.step(s)
    monkeypatch.setattr(RangeFS, "cat_file", broken)
    assert len(ahead.step(5)) == 1  # a later jump reads again
    ahead.close()
