"""Tokenize end to end (read .jsonl.zst, encode, write shards) against the raw encoder and
against datatrove's DocumentTokenizer, side by side, on the same text and thread count.

    .venv/bin/python -m bench.data_tokenize --threads 2 --scale 2 --repeats 3

RAYON_NUM_THREADS is set before `tokenizers` is imported, so every contender (all in this one
process) uses the same encoder thread pool. Ratios are of best-of-N wall times.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import shutil
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--scale", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"

    import numpy as np

    from bench.data_common import WORK, ctx, shards, tokenizer
    from steps.data.formats import TokenDataset, iter_text_batches
    from steps.data.tokenize import TokenizeConfig, tokenize
    from steps.data.tokenizer import load_tokenizer

    src, tok_dir = shards(args.scale), tokenizer(args.vocab)
    tok = load_tokenizer(str(tok_dir))
    files = sorted(str(p) for p in src.glob("*.jsonl.zst"))
    batches = [b for f in files for b in iter_text_batches(f, args.batch)]
    n_bytes = sum(len(t.encode()) for b in batches for t in b)
    n_docs = sum(map(len, batches))
    print(f"corpus: {n_docs} documents, {n_bytes / 1e6:.1f} MB of text in {len(files)} shards; "
          f"vocab {tok.get_vocab_size()}; {args.threads} encoder threads; batches of {args.batch}", flush=True)

    def raw_encode_batch() -> int:
        return sum(len(e) for b in batches for e in tok.encode_batch(b, add_special_tokens=False))

    def raw_encode_batch_fast() -> int:
        return sum(len(e) for b in batches for e in tok.encode_batch_fast(b, add_special_tokens=False))

    def ours() -> int:
        out = WORK / "tok-ours"
        shutil.rmtree(out, ignore_errors=True)
        c = ctx(out)
        tokenize(TokenizeConfig(documents=str(src), tokenizer=str(tok_dir), bos=None, eos="<|eos|>",
                                batch_docs=args.batch, threads=args.threads), c)
        return c.results["tokens"]

    def datatrove_tokenizer() -> int:
        from datatrove.pipeline.readers import JsonlReader
        from datatrove.pipeline.tokens import DocumentTokenizer

        out = WORK / "tok-datatrove"
        shutil.rmtree(out, ignore_errors=True)
        reader = JsonlReader(str(src), glob_pattern="*.jsonl.zst", compression="zstd")
        step = DocumentTokenizer(str(out), tokenizer_name_or_path=str(tok_dir / "tokenizer.json"),
                                 eos_token="<|eos|>", batch_size=args.batch, shuffle_documents=False)
        result = step.run(reader.run(None, 0, 1), 0, 1)
        if result is not None:
            for _ in result:
                pass
        return sum(os.path.getsize(p) for p in out.glob("*.ds")) // 2

    import logging

    logging.disable(logging.WARNING)
    from datatrove.pipeline import tokens as _dt_tokens  # noqa: F401  (imported first: it installs a log handler)
    from loguru import logger

    logger.remove()
    contenders = {"raw encode_batch": raw_encode_batch, "raw encode_batch_fast": raw_encode_batch_fast,
                  "ours end to end": ours, "datatrove DocumentTokenizer": datatrove_tokenizer}
    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for r in range(args.repeats):  # interleaved, so drift in machine speed hits everyone alike
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            tokens[name] = fn()
            dt = time.perf_counter() - t0
            best[name] = min(best.get(name, float("inf")), dt)
            print(f"  round {r}: {name:30s} {dt:7.2f} s  ({tokens[name]:,} tokens)", flush=True)
    print()
    for name, dt in best.items():
        print(f"{name:30s} {n_bytes / dt / 1e6:7.2f} MB/s  {tokens[name] / dt / 1e6:6.2f} Mtok/s  (best {dt:.2f} s)")
    o = best["ours end to end"]
    print(f"\nours / raw encode_batch        = {best['raw encode_batch'] / o:.3f}  (target >= 0.85)")
    print(f"ours / raw encode_batch_fast   = {best['raw encode_batch_fast'] / o:.3f}")
    print(f"ours / datatrove               = {best['datatrove DocumentTokenizer'] / o:.3f}  (target > 1)")
    ds = TokenDataset(str(WORK / "tok-ours"))
    assert ds.num_tokens == tokens["ours end to end"] and ds.dtype == np.uint16
    sys.stdout.flush()


if __name__ == "__main__":
    main()
