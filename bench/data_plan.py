"""Per-core throughputs of the data steps, the figures the data plan of `marin-run voyages/535b.py
--dry-run` is computed from (steps/data/budget.py, RATES).

    .venv/bin/python -m bench.data_plan --scale 2 --repeats 1

Each step function runs in this process over the bench corpus (data_common: the bundled corpus
and word-shuffled copies, 500 documents a shard), without Ray, one thread; the figure is its
input over the process CPU time it took (best of `--repeats`), per core. Also the compression
ratio of the zstd shards (the plan's bytes read and written) and the step's tracemalloc peak (a run of its own, not timed).
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import shutil
import time
import tracemalloc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"

    from bench.data_common import WORK, ctx, shards, tokenizer
    from steps.data.decontam import DecontamConfig, EvalSet, decontaminate
    from steps.dedup.dedup import DedupConfig, dedup
    from steps.data.formats import iter_documents, write_documents
    from steps.data.ingest import IngestConfig, ingest
    from steps.data.tokenize import TokenizeConfig, tokenize

    src = shards(args.scale)
    files = sorted(src.glob("*.jsonl.zst"))
    docs = [d for f in files for d in iter_documents(str(f))]
    text = sum(len(d["text"].encode()) for d in docs)
    stored = sum(f.stat().st_size for f in files)
    raw = WORK / f"plan-raw-x{args.scale}"
    if not raw.exists():  # ingest's input: the same documents as raw JSONL.zst with an extra field
        for k, f in enumerate(files):
            write_documents(str(raw / f"{k:05d}.jsonl.zst"),
                            (dict(d, url=f"https://example.org/{d['id']}") for d in iter_documents(str(f))))
    tok = tokenizer()
    eval_file = WORK / "plan-evals.jsonl"
    write_documents(str(eval_file), docs[::50])  # every 50th document: ~1% contaminated, a 40k-n-gram eval side

    def measure(name, run):
        """Best CPU time of `repeats` untraced runs, then one run under tracemalloc for the peak
        (tracing slows Python several times over: never timed)."""
        best = float("inf")
        for k in range(args.repeats + 1):
            out = WORK / f"plan-{name}"
            shutil.rmtree(out, ignore_errors=True)
            if k == args.repeats:
                tracemalloc.start()
            t = time.process_time()
            c = run(out)
            if k < args.repeats:
                best = min(best, time.process_time() - t)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return best, peak, c

    rows = []
    s, peak, _ = measure("ingest", lambda out: ingest(IngestConfig(input=str(raw)), c := ctx(out)) or c)
    rows.append(("ingest", text / s / 1e6, "MB of text/s", peak))
    s, peak, c = measure("dedup", lambda out: dedup(DedupConfig(documents=str(src)), c := ctx(out)) or c)
    rows.append(("dedup (all passes, 28 x 4, verified)", len(docs) / s, "documents/s", peak))
    s, peak, c = measure("decontam", lambda out: decontaminate(
        DecontamConfig(documents=str(src), evals=(EvalSet("e", documents=str(eval_file)),)), c := ctx(out)) or c)
    rows.append(("decontaminate", text / s / 1e6, "MB of text/s", peak))
    s, peak, c = measure("tokenize", lambda out: tokenize(
        TokenizeConfig(documents=str(src), tokenizer=str(tok), bos=None, eos="<|eos|>", threads=1), c := ctx(out)) or c)
    tokens = c.results["tokens"]
    rows.append(("tokenize (1 encoder thread)", tokens / s / 1e6, "M tokens/s", peak))

    print(f"corpus x{args.scale}: {len(docs):,} documents, {text / 1e6:.1f} MB of text, {stored / 1e6:.1f} MB as "
          f"zstd shards (ratio {text / stored:.2f}); {tokens / len(docs):,.0f} tokens a document, "
          f"{text / tokens:.2f} bytes a token (the bench tokenizer)\n")
    print("| step | per core | unit | tracemalloc peak in the step |")
    print("|---|---:|---|---:|")
    for name, rate, unit, peak in rows:
        print(f"| {name} | {rate:,.2f} | {unit} | {peak / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
