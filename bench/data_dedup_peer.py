"""Our dedup against datatrove's MinHash dedup (the pipeline FineWeb was made with), on the same
corpus, with the same bands, rows and n-grams, in one run: documents per CPU-second of each pass
(and of all four), and the tracemalloc peak of the largest task of each pass.

    .venv/bin/python -m bench.data_dedup_peer --scale 4 --ranges 2

datatrove splits words with our rule (its default for English is spaCy's tokenizer, slower: this
favours it). Both run task by task in this one process (no Ray, no worker pools), so the CPU time is the
work's own: ours through the step with a mapper that times each task, datatrove's through its
LocalPipelineExecutor's own per-rank entry point. Stages: 1 signatures, 2 buckets (datatrove:
`bands x ranges` tasks; ours: the same `bands x ranges` plus the content hashes), 3 clusters,
4 filter. Datatrove's cluster stage is one process over all pairs; ours is map rounds.
Rows "ours 28x4+verify" are our defaults: twice the bands, and each pair checked against the
signature carried in the run.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import collections
import contextlib
import random
import os
import shutil
import time
import tracemalloc

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from bench.data_common import WORK, ctx, shards  # noqa: E402

PASS_OF = {"_signatures": 1, "pair_task": 2, "star_task": 3, "group_task": 3, "_write_kept": 4}


class Meter:
    """Per pass: CPU seconds (summed over tasks) and the largest task's tracemalloc peak."""

    def __init__(self, trace: bool) -> None:
        self.trace = trace
        self.cpu: dict[int, float] = collections.defaultdict(float)
        self.peak: dict[int, int] = collections.defaultdict(int)
        self.tasks: dict[int, int] = collections.defaultdict(int)

    def run(self, stage: int, fn, *args):
        if self.trace:
            tracemalloc.start()
        t0 = time.process_time()
        try:
            return fn(*args)
        finally:
            self.cpu[stage] += time.process_time() - t0
            self.tasks[stage] += 1
            if self.trace:
                self.peak[stage] = max(self.peak[stage], tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()


def ours(src, out, meter: Meter, **cfg) -> dict:
    from steps.dedup.dedup import DedupConfig, dedup

    def mapper(fn, items, resources=None):
        return [meter.run(PASS_OF[fn.__name__], fn, x) for x in items]

    shutil.rmtree(out, ignore_errors=True)
    c = ctx(out)
    c.mapper = mapper
    t0 = time.process_time()
    dedup(DedupConfig(documents=str(src), **cfg), c)
    meter.cpu[0] = time.process_time() - t0  # the whole step, driver included
    return c.results


def datatrove(src, out, meter: Meter, bands: int, rows: int, ranges: int, files: int) -> int:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        """Our word rule (steps.dedup.minhash.words_of) instead of spaCy's English tokenizer, which
        datatrove uses by default and which is much slower: this favours datatrove."""

        def word_tokenize(self, text):
            return [w.decode("utf-8", "replace") for w in words_of(text)]

        def sent_tokenize(self, text):
            return [text]

        def span_tokenize(self, text):
            return [(0, len(text))]

    from steps.dedup.minhash import words_of

    import xxhash

    import datatrove.utils.hashes.xxhash as dt_xxhash

    # xxhash >= 4 hashes bytes only; datatrove 0.10.1 hands it str shingles
    dt_xxhash.xxhash64 = lambda d: xxhash.xxh64_intdigest(d.encode() if isinstance(d, str) else d)

    shutil.rmtree(out, ignore_errors=True)
    config = MinhashConfig(n_grams=5, num_buckets=bands, hashes_per_bucket=rows, hash_config=HashConfig(precision=64))
    logs = str(out / "logs")

    def reader():
        return JsonlReader(str(src), glob_pattern="*.jsonl.zst", compression="zstd")

    stages = [
        (1, [reader(), MinhashDedupSignature(output_folder=str(out / "sigs"), config=config, language=Words())], files),
        (2, [MinhashDedupBuckets(input_folder=str(out / "sigs"), output_folder=str(out / "buckets"), config=config)],
         bands * ranges),
        (3, [MinhashDedupCluster(input_folder=str(out / "buckets"), output_folder=str(out / "remove"), config=config)], 1),
        (4, [reader(), MinhashDedupFilter(input_folder=str(out / "remove")),
             JsonlWriter(output_folder=str(out / "kept"), compression="zstd")], files),
    ]
    t0 = time.process_time()
    for stage, pipeline, tasks in stages:
        ex = LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=f"{logs}/{stage}")
        for rank in range(tasks):
            with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
                meter.run(stage, ex._run_for_rank, rank)
    meter.cpu[0] = time.process_time() - t0
    removed = 0
    for name in os.listdir(out / "remove") if (out / "remove").exists() else ():
        if name.endswith(".remove"):
            removed += os.path.getsize(out / "remove" / name) // 4
    return removed


def corpus(scale: int, share: float = 0.1):
    """The bench corpus x`scale` (data_common.shards) with near copies of `share` of its documents
    (2% of the words replaced) and exact copies of a tenth as many, spread over the shards."""
    from steps.data.formats import iter_documents, write_documents

    base = shards(scale)
    out = WORK / f"peer-corpus-x{scale}"
    if (out / "done").exists():
        return out
    rng = random.Random(scale)
    files = sorted(base.glob("*.jsonl.zst"))
    docs = [[d for d in iter_documents(str(f))] for f in files]
    every = [d for part in docs for d in part]
    for i, d in enumerate(rng.sample(every, int(share * len(every)))):
        words = d["text"].split(" ")
        text = " ".join(w if rng.random() > 0.02 else f"x{rng.randrange(10**6)}" for w in words)
        docs[rng.randrange(len(docs))].append({"id": f"near-{i}", "text": text})
    for i, d in enumerate(rng.sample(every, int(share * len(every) / 10))):
        docs[rng.randrange(len(docs))].append({"id": f"copy-{i}", "text": d["text"]})
    for f, part in zip(files, docs):
        write_documents(str(out / f.name), part)
    (out / "done").write_text("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=4, help="copies of the bundled corpus (word-shuffled)")
    ap.add_argument("--bands", type=int, default=14)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--ranges", type=int, default=2, help="key ranges (datatrove: workers) per band")
    args = ap.parse_args()
    import logging

    from loguru import logger

    logger.remove()  # datatrove logs every task to the console
    logging.getLogger().setLevel(logging.WARNING)

    src = corpus(args.scale)
    files = len(list(src.glob("*.jsonl.zst")))
    from steps.data.formats import iter_documents
    docs = sum(1 for f in sorted(src.glob("*.jsonl.zst")) for _ in iter_documents(str(f)))
    per = -(-docs // args.ranges)
    print(f"corpus: {docs} documents in {files} shards; {args.bands} bands x {args.rows} rows, 5-grams, "
          f"{args.ranges} key ranges a band; one process, tasks one after another", flush=True)
    rows = []
    for name, fn in (
            ("datatrove 0.10.1", lambda m: datatrove(src, WORK / "peer-datatrove", m, args.bands, args.rows,
                                                     args.ranges, files)),
            (f"ours {args.bands}x{args.rows}", lambda m: ours(src, WORK / "peer-ours", m, bands=args.bands,
                                                              rows=args.rows, verify_threshold=None,
                                                              keys_per_task=per)["removed"]),
            ("ours 28x4+verify", lambda m: ours(src, WORK / "peer-ours", m, keys_per_task=per)["removed"])):
        timed, traced = Meter(False), Meter(True)
        removed = fn(timed)
        fn(traced)
        rows.append((name, timed, traced, removed))
        print(f"  {name}: done ({timed.cpu[0]:.1f} CPU s, {removed} removed)", flush=True)

    print(f"\n{'':22s}" + "".join(f"{'pass ' + str(s):>16s}" for s in (1, 2, 3, 4)) + f"{'all':>12s}")
    print("documents / CPU-second")
    for name, t, _, _ in rows:
        print(f"  {name:20s}" + "".join(f"{docs / t.cpu[s]:16,.0f}" if t.cpu[s] else f"{'-':>16s}" for s in (1, 2, 3, 4))
              + f"{docs / t.cpu[0]:12,.0f}")
    print("peak memory of the largest task (tracemalloc, MiB) [tasks]")
    for name, _, m, _ in rows:
        print(f"  {name:20s}" + "".join(f"{m.peak[s] / 2**20:11.2f} [{m.tasks[s]:>2d}]" for s in (1, 2, 3, 4)))
    base = rows[0][1].cpu[0]
    for name, t, _, removed in rows[1:]:
        print(f"{name}: {base / t.cpu[0]:.2f}x datatrove's documents per CPU-second over all passes ({removed} "
              f"removed; datatrove {rows[0][3]})")


if __name__ == "__main__":
    main()
