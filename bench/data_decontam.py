"""Decontamination throughput per core, against a plain Python set of 13-gram tuples (the
GPT-3-style reference), and the count it removes on the laptop voyage's corpus.

    .venv/bin/python -m bench.data_decontam --scale 2 --repeats 3
    .venv/bin/python -m bench.data_decontam --scale 2 --repeats 2 --sizes 100000 1000000 8000000

With `--sizes`: the task's rate against the eval side's size (synthetic eval texts of 200 words
drawn from the corpus's vocabulary, so the lookups miss as most do), its build's peak memory
(RSS growth, `steps.data.memory`) per n-gram, and the plan's modelled rate at that size
(`steps.data.budget.decontam_rate`) beside it, with their ratio.

Contenders run interleaved in one process, each timed by process CPU time (best of N):
- ours: the decontaminate step's per-shard function (`_decontaminator`): read and decompress the shards,
  parse JSON, normalise, hash 256 documents' 13-grams at a time, one binary search a batch, write
  the kept documents and the ledger;
- ours, no write: the same hashing and lookup over the same documents, nothing written;
- set: the same normalised words, each document's 13-grams as tuples looked up in a Python set of
  the eval side's tuples (reading and parsing included, nothing written).
Two eval sides: the laptop voyage's held-out passages (a few hundred n-grams) and a large suite
(every 13-gram of a word-shuffled copy of the corpus: ~1M n-grams, about what MMLU's test set
gives), to show what the size of the eval side costs.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import random
import shutil
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    args = ap.parse_args()
    if args.sizes:
        return by_size(args)

    from bench.data_common import CORPUS, ROOT, WORK, corpus_documents, ctx, shards
    from steps.data.decontam import BATCH, EVALS, DecontamConfig, EvalSet, NgramHasher, _chunks, \
        _decontaminator, build_index, decontaminate, eval_texts, words
    from steps.data.formats import iter_documents
    from steps.data.shard_io import Shard

    src = shards(args.scale)
    files = sorted(str(p) for p in src.glob("*.jsonl.zst"))
    nbytes = sum(len(d["text"].encode()) for f in files for d in iter_documents(f))
    ndocs = sum(1 for f in files for _ in iter_documents(f))
    heldout = list(eval_texts(EvalSet("heldout", documents=str(ROOT / "data/evals/heldout_passages.jsonl"))))
    rng = random.Random(99)
    suite = []
    for d in corpus_documents():
        ws = d["text"].split(" ")
        rng.shuffle(ws)
        suite.append(" ".join(ws))
    sides = {"held-out passages": heldout, "large suite": suite}
    print(f"corpus x{args.scale}: {ndocs:,} documents, {nbytes / 1e6:.1f} MB of text in {len(files)} shards")

    rows = []
    for side, texts in sides.items():
        t = time.process_time()
        index, stats = build_index({side: texts}, 13)
        build_s = time.process_time() - t
        tuples = set()
        for text in texts:
            ws = words(text)
            tuples.update(tuple(ws[i:i + 13]) for i in range(len(ws) - 12))
        out = WORK / "decontam-bench"
        best = {"ours": float("inf"), "ours, no write": float("inf"), "set": float("inf")}
        found = {}
        for _ in range(args.repeats):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            (out / EVALS).write_bytes(index.to_bytes())
            t = time.process_time()
            one = _decontaminator(str(out), 13, "remove")
            entries = [one(Shard(i, f, f)) for i, f in enumerate(files)]
            best["ours"] = min(best["ours"], time.process_time() - t)
            found["ours"] = sum(len(e["contaminated"]) for e in entries)
            t = time.process_time()
            hasher, alone = NgramHasher(13), 0
            for f in files:
                for batch in _chunks(iter_documents(f), BATCH):
                    grams, owner = hasher.batch([d["text"] for d in batch])
                    alone += int((index.masks_of(grams, owner, len(batch)) != 0).sum())
            best["ours, no write"] = min(best["ours, no write"], time.process_time() - t)
            found["ours, no write"] = alone
            t = time.process_time()
            hits = 0
            for f in files:
                for d in iter_documents(f):
                    ws = words(d["text"])
                    hits += any(tuple(ws[i:i + 13]) in tuples for i in range(len(ws) - 12))
            best["set"] = min(best["set"], time.process_time() - t)
            found["set"] = hits
        assert found["ours"] == found["set"] == found["ours, no write"], found  # the same documents, by hash and by tuple
        rows.append((side, stats[side]["ngrams"], index.hashes.nbytes + index.masks.nbytes, build_s, best, found["ours"]))

    print("\n| eval side | eval n-grams | index | build | ours, the task | ours, no write | set of tuples, no write "
          "| ours no write / set | contaminated |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for side, grams, size, build_s, best, n in rows:
        mbs = {k: nbytes / v / 1e6 for k, v in best.items()}
        print(f"| {side} | {grams:,} | {size / 1e6:.1f} MB | {build_s:.2f} s | {mbs['ours']:.2f} MB/s "
              f"({ndocs / best['ours']:,.0f} docs/s) | {mbs['ours, no write']:.2f} MB/s | {mbs['set']:.2f} MB/s | "
              f"**{best['set'] / best['ours, no write']:.2f}** | {n:,} |")

    # the laptop voyage's decontamination: the bundled sources against its held-out passages
    print("\nlaptop voyage (data/corpus against data/evals/heldout_passages.jsonl, 13-grams):")
    for name in ("kjv", "pydocs"):
        out = WORK / f"decontam-laptop-{name}"
        shutil.rmtree(out, ignore_errors=True)
        c = ctx(out, f"decontam/{name}")
        decontaminate(DecontamConfig(documents=str(CORPUS / f"{name}.jsonl.zst"),
                                     evals=(EvalSet("heldout", documents="data/evals/heldout_passages.jsonl"),),
                                     root=str(ROOT)), c)
        print(f"  {name}: {c.results['contaminated']} of {c.results['documents']:,} documents removed "
              f"({c.results['removed']})")


def by_size(args) -> None:
    """The task's rate and the build's memory at each eval-side size, beside the plan's model."""
    from bench.data_common import WORK, shards
    from steps.data.decontam import BUILD_BYTES_PER_NGRAM, EVALS, _decontaminator, build_index
    from steps.data.formats import iter_documents
    from steps.data.memory import Measure
    from steps.data.budget import decontam_rate
    from steps.data.shard_io import Shard

    src = shards(args.scale)
    files = sorted(str(p) for p in src.glob("*.jsonl.zst"))
    nbytes = sum(len(d["text"].encode()) for f in files for d in iter_documents(f))
    vocab = sorted({w for f in files for d in iter_documents(f) for w in d["text"].split()[:50]})
    print(f"corpus x{args.scale}: {nbytes / 1e6:.1f} MB of text in {len(files)} shards; vocabulary {len(vocab):,}")
    print("\n| eval n-grams | index | build | build peak / n-gram | ours, the task | plan's model | plan / measured |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        rng = random.Random(size)
        texts = [" ".join(rng.choices(vocab, k=200)) for _ in range(-(-size // 188))]
        m = Measure()
        t = time.process_time()
        index, stats = build_index({"suite": texts}, 13)
        build_s, peak = time.process_time() - t, m.gb - 0.25
        del texts
        grams = int(index.hashes.size)
        out = WORK / "decontam-sizes"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / EVALS).write_bytes(index.to_bytes())
        del index
        best = float("inf")
        for _ in range(args.repeats):
            t = time.process_time()
            one = _decontaminator(str(out), 13, "remove")
            for i, f in enumerate(files):
                one(Shard(i, f, f))
            best = min(best, time.process_time() - t)
        rate = nbytes / best
        model, how = decontam_rate(grams)
        print(f"| {grams:,} | {grams * 16 / 1e6:.0f} MB | {build_s:.1f} s | {peak * 2**30 / grams:.0f} B "
              f"(declared {BUILD_BYTES_PER_NGRAM}) | {rate / 1e6:.2f} MB/s | {model / 1e6:.2f} MB/s ({how}) | "
              f"**{model / rate:.2f}** |")


if __name__ == "__main__":
    main()
