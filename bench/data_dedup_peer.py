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

    .venv/bin/python -m bench.data_dedup_peer --scale 4 --ranges 2 --ray --cpus 2

`--ray` runs both under an embedded local Ray instead (`ray.init(num_cpus=--cpus)`), each with
datatrove's default word tokenizer (spaCy's English, `spacy.blank("en")`) and with `str.split`
(ours splits words its own way whatever datatrove is given: it is run once per tokenizer all the
same, so each ratio has its own pair of runs). Ours goes through the executor's Ray mapper
(`executor.ray_backend.ray_map`); datatrove twice: through its own `RayPipelineExecutor` (actors,
a process pool in each; each rank writes the CPU it took beside its logs), and with each of its
ranks as a plain Ray task (`ray_map` over its executor's per-rank entry point, so both sides are
scheduled alike). CPU seconds of the dedup work: every task's (rank's) own `process_time`, summed,
plus the driver's while the step ran (Ray's submit and get, our step's work between maps).
Ray's daemons and starting workers are not counted on either side.
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

from bench.data_common import WORK, ctx, shards, timed  # noqa: E402

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


# -- under Ray --------------------------------------------------------------------------------

def _rank_cpu_executor():
    """datatrove's RayPipelineExecutor, each rank writing the CPU seconds it took (its own
    `process_time`, in the pool process its actor runs it in) beside its logs."""
    from datatrove.executor import RayPipelineExecutor

    class Timed(RayPipelineExecutor):
        def _run_for_rank(self, rank, local_rank=0, node_rank=-1):
            t = time.process_time()
            out = super()._run_for_rank(rank, local_rank, node_rank)
            with self.logging_dir.open(f"cpu/{rank:05d}.txt", "w") as f:
                f.write(repr(time.process_time() - t))
            return out

    return Timed


def _patch_xxhash():
    """xxhash >= 4 hashes bytes only; datatrove 0.10.1 hands it str shingles."""
    import xxhash

    import datatrove.utils.hashes.xxhash as dt_xxhash

    dt_xxhash.xxhash64 = lambda d: xxhash.xxh64_intdigest(d.encode() if isinstance(d, str) else d)


class Split:
    """`str.split` as datatrove's word tokenizer (built on first use, so it pickles to workers)."""

    def __new__(cls):
        from datatrove.utils.word_tokenizers import WordTokenizer

        class SplitWords(WordTokenizer):
            def word_tokenize(self, text):
                return text.split()

            def sent_tokenize(self, text):
                return [text]

            def span_tokenize(self, text):
                return [(0, len(text))]

        return SplitWords()


def ours_ray(src, out, **cfg) -> dict:
    """Our step through the executor's Ray mapper: per pass the tasks' CPU, and with the driver's."""
    from executor.ray_backend import ray_map
    from steps.dedup.dedup import DedupConfig, dedup

    cpu: dict[int, float] = collections.defaultdict(float)

    def mapper(fn, items, resources=None):
        pairs = ray_map(timed(fn), items, resources)
        cpu[PASS_OF[fn.__name__]] += sum(c for _, c in pairs)
        return [r for r, _ in pairs]

    shutil.rmtree(out, ignore_errors=True)
    c = ctx(out)
    c.mapper = mapper
    t0 = time.process_time()
    dedup(DedupConfig(documents=str(src), **cfg), c)
    driver = time.process_time() - t0
    return {"passes": dict(cpu), "work": driver + sum(cpu.values()), "removed": c.results["removed"]}


def datatrove_ray(src, out, bands: int, rows: int, ranges: int, files: int, words, how: str) -> dict:
    """datatrove's four stages under Ray: `how` "executor" (its RayPipelineExecutor) or "tasks"
    (each rank a Ray task through our ray_map). `words`: None for its default tokenizer."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    from executor.ray_backend import ray_map

    _patch_xxhash()  # before the steps are built: they hold the hash function (pickled by value)
    shutil.rmtree(out, ignore_errors=True)
    config = MinhashConfig(n_grams=5, num_buckets=bands, hashes_per_bucket=rows, hash_config=HashConfig(precision=64))
    lang = {} if words is None else {"language": words}

    def reader():
        return JsonlReader(str(src), glob_pattern="*.jsonl.zst", compression="zstd")

    stages = [
        (1, [reader(), MinhashDedupSignature(output_folder=str(out / "sigs"), config=config, **lang)], files),
        (2, [MinhashDedupBuckets(input_folder=str(out / "sigs"), output_folder=str(out / "buckets"), config=config)],
         bands * ranges),
        (3, [MinhashDedupCluster(input_folder=str(out / "buckets"), output_folder=str(out / "remove"), config=config)], 1),
        (4, [reader(), MinhashDedupFilter(input_folder=str(out / "remove")),
             JsonlWriter(output_folder=str(out / "kept"), compression="zstd")], files),
    ]
    cpu: dict[int, float] = collections.defaultdict(float)
    t0 = time.process_time()
    for stage, pipeline, tasks in stages:
        logs = str(out / "logs" / str(stage))
        if how == "executor":
            _rank_cpu_executor()(pipeline=pipeline, tasks=tasks, logging_dir=logs, cpus_per_task=1,
                                 mem_per_cpu_gb=0.5).run()
            cpu[stage] += sum(float((out / "logs" / str(stage) / "cpu" / f"{r:05d}.txt").read_text())
                              for r in range(tasks))
        else:
            ex = LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=logs)

            def rank_task(rank, ex=ex):
                from loguru import logger

                logger.remove()
                ex._run_for_rank(rank)

            rank_task.__name__ = f"datatrove_stage_{stage}"
            cpu[stage] += sum(c for _, c in ray_map(timed(rank_task), list(range(tasks))))
    driver = time.process_time() - t0
    removed = sum(os.path.getsize(out / "remove" / n) // 4 for n in os.listdir(out / "remove")
                  if n.endswith(".remove")) if (out / "remove").exists() else 0
    return {"passes": dict(cpu), "work": driver + sum(cpu.values()), "removed": removed}


def main_ray(args, src, files: int, docs: int) -> None:
    import ray

    from executor import ray_backend

    per = -(-docs // args.ranges)
    ray_backend.start(num_cpus=args.cpus)
    print(f"corpus: {docs} documents in {files} shards; {args.bands} bands x {args.rows} rows, 5-grams, "
          f"{args.ranges} key ranges a band; embedded local Ray, {args.cpus} CPUs; load {os.getloadavg()[0]:.1f}",
          flush=True)
    rows = []
    try:
        for label, words in (("datatrove's default (spaCy)", None), ("str.split", Split())):
            dt_tasks = datatrove_ray(src, WORK / "peer-datatrove", args.bands, args.rows, args.ranges, files, words,
                                     "tasks")
            dt_exec = datatrove_ray(src, WORK / "peer-datatrove", args.bands, args.rows, args.ranges, files, words,
                                    "executor")
            mine = ours_ray(src, WORK / "peer-ours", bands=args.bands, rows=args.rows, verify_threshold=None,
                            keys_per_task=per)
            mine_v = ours_ray(src, WORK / "peer-ours", keys_per_task=per)
            rows.append((label, dt_tasks, dt_exec, mine, mine_v))
            print(f"  {label}: datatrove {dt_tasks['work']:.1f} CPU s as tasks, {dt_exec['work']:.1f} by its "
                  f"executor; ours {mine['work']:.1f} / {mine_v['work']:.1f} (28x4+verify); removed "
                  f"{dt_tasks['removed']} / {mine['removed']} / {mine_v['removed']}; load {os.getloadavg()[0]:.1f}",
                  flush=True)
    finally:
        ray.shutdown()
    print("\n| documents / CPU-second, under Ray | tokenizer | pass 1 | pass 2 | pass 3 | pass 4 | dedup work "
          "(tasks + driver) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, dt_tasks, dt_exec, mine, mine_v in rows:
        for name, r in ((f"datatrove 0.10.1, {args.bands} x {args.rows}, ranks as Ray tasks", dt_tasks),
                        (f"datatrove 0.10.1, {args.bands} x {args.rows}, RayPipelineExecutor", dt_exec),
                        (f"ours, {args.bands} x {args.rows}", mine), ("ours, 28 x 4 + verify", mine_v)):
            cells = "".join(f" {docs / r['passes'][s]:,.0f} |" if r["passes"].get(s) else " - |" for s in (1, 2, 3, 4))
            print(f"| {name} | {label} |{cells} {docs / r['work']:,.0f} |")
    print("\n| ours / datatrove, documents per CPU-second | " + " | ".join(label for label, *_ in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for name, pick in (("ours 14 x 8 / datatrove's ranks as Ray tasks", lambda r: (r[3], r[1])),
                       ("ours 28 x 4 + verify / datatrove's ranks as Ray tasks", lambda r: (r[4], r[1])),
                       ("ours 14 x 8 / datatrove's RayPipelineExecutor", lambda r: (r[3], r[2])),
                       ("ours 28 x 4 + verify / datatrove's RayPipelineExecutor", lambda r: (r[4], r[2]))):
        cells = []
        for r in rows:
            a, b = pick(r)
            cells.append(f"**{b['work'] / a['work']:.2f}x**")
        print(f"| {name} | " + " | ".join(cells) + " |")


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
    ap.add_argument("--ray", action="store_true", help="both under an embedded local Ray, both tokenizers")
    ap.add_argument("--cpus", type=int, default=2, help="--ray: the local Ray's CPUs")
    args = ap.parse_args()
    import logging

    from loguru import logger

    logger.remove()  # datatrove logs every task to the console
    logging.getLogger().setLevel(logging.WARNING)

    src = corpus(args.scale)
    files = len(list(src.glob("*.jsonl.zst")))
    from steps.data.formats import iter_documents
    docs = sum(1 for f in sorted(src.glob("*.jsonl.zst")) for _ in iter_documents(str(f)))
    if args.ray:
        main_ray(args, src, files, docs)
        return
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
