"""The trainer's data wait per step, before and after read-ahead, on a store with injected
latency.

    .venv/bin/python -m bench.train_readahead --steps 30 --compute 0.1

One rank's share of the 535B voyage: 16 sequences of 4,096 + 1 tokens a step, uint32 tokens
(a 128k vocabulary), read through a mixture of two token datasets held in memory behind a
filesystem that sleeps `latency` before answering each request, as a GCS range GET does; range
reads asked for together (`cat_ranges`) are answered concurrently (gcsfs issues them as
concurrent requests; up to 32 at once here). Each step "computes" for `--compute` seconds (a
sleep: the trainer's forward and backward release the GIL the same way).

- before: the reader as it was, `MixtureSampler.sequence` for each of the rank's 16 sequences,
  serially, from the training thread;
- after: `Batches(..., ahead=4)`: the next steps' sequences fetched on a background thread as
  coalesced range reads.

Data wait: the time `step(s)` blocks, averaged over steps 1.. (step 0 has nothing ahead of it).
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import concurrent.futures
import time

import fsspec
import numpy as np
from fsspec.implementations.memory import MemoryFileSystem


class LatencyFS(MemoryFileSystem):
    protocol = ("latencymem",)
    latency = 0.0
    requests = 0

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("latencymem://"):
            path = path[len("latencymem://"):]
        return super()._strip_protocol(path)

    def cat_file(self, path, start=None, end=None, **kw):
        LatencyFS.requests += 1
        time.sleep(LatencyFS.latency)
        return super().cat_file(path, start, end, **kw)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kw):
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            return list(pool.map(lambda a: self.cat_file(*a), zip(paths, starts, ends)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compute", type=float, default=0.1)
    ap.add_argument("--latencies", default="0,10,40")
    args = ap.parse_args()
    fsspec.register_implementation("latencymem", LatencyFS, clobber=True)

    from executor.testing import build_context
    from steps.data.formats import TokenShardWriter, write_json
    from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, load_mixture, mixture
    from steps.train.data import Batches

    share, seq_len = 16, 4097
    rng = np.random.default_rng(0)
    urls = {}
    for name in ("web", "code"):
        url, shards = f"latencymem://bench/{name}", []
        for k in range(4):
            n = 2_000_000 + 12_345 * k
            with TokenShardWriter(f"{url}/shards", f"{k:05d}", np.uint32) as w:
                w.write(rng.integers(0, 128_256, n, dtype=np.uint32), np.array([n]))
            shards.append({"name": f"{k:05d}", "tokens": n, "documents": 1, "source": name})
        write_json(f"{url}/manifest.json", {"format": "marin-tokens/1", "dtype": "uint32", "vocab_size": 128_256,
                                            "tokenizer": "t", "tokens": sum(s["tokens"] for s in shards),
                                            "documents": 4, "shards": shards})
        urls[name] = url
    ctx = build_context("latencymem://bench/mix", name="mix", digest="0" * 64)
    mixture(MixtureConfig(datasets=urls, token_budget=(args.steps + 8) * share * seq_len, seq_len=seq_len,
                          stages=(MixtureStage(1.0, {"web": 0.7, "code": 0.3}),)), ctx)
    manifest = load_mixture("latencymem://bench/mix/mixture.json")

    print(f"one rank: {share} sequences of {seq_len:,} uint32 tokens a step, {args.steps} steps, "
          f"{args.compute * 1000:.0f} ms of compute a step\n")
    print("| latency a request | before: wait a step | requests a step | after: wait a step | range reads a step "
          "| after / before |")
    print("|---:|---:|---:|---:|---:|---:|")
    for ms in (float(x) for x in args.latencies.split(",")):
        LatencyFS.latency = ms / 1000
        sampler = MixtureSampler(manifest)
        LatencyFS.requests, waits = 0, []
        for s in range(args.steps):
            t = time.perf_counter()
            rows = np.stack([sampler.sequence(i) for i in range(s * share, (s + 1) * share)]).astype(np.int64)
            waits.append(time.perf_counter() - t)
            time.sleep(args.compute)
        before, before_req = float(np.mean(waits[1:])), LatencyFS.requests / args.steps
        batches = Batches(manifest, share, 0, 1, 0, ahead=4)
        LatencyFS.requests, waits = 0, []
        for s in range(args.steps):
            t = time.perf_counter()
            got = np.concatenate(batches.step(s))
            waits.append(time.perf_counter() - t)
            if s == args.steps - 1:
                assert np.array_equal(got, rows)  # the same batch, bitwise
            time.sleep(args.compute)
        batches.close()
        after, after_req = float(np.mean(waits[1:])), batches.reader.reads / batches.reader.fetched
        print(f"| {ms:g} ms | {before * 1000:.1f} ms | {before_req:.1f} | {after * 1000:.2f} ms | {after_req:.1f} | "
              f"**{after / before if before else float('nan'):.3f}** |")


if __name__ == "__main__":
    main()
