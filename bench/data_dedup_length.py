"""Fuzzy dedup's detection rate by document length: how often an isolated planted pair of known
word 5-gram Jaccard similarity is removed, for documents of 16 to 512 words.

A pair is found exactly when pass 2 finds it (steps/dedup/pairs.py, for a pair alone in its
buckets): the two share at least one of the 28 band keys of 4 rows, and their signatures agree
on at least `verify_threshold` (0.7) of the 112 values. Both are computed with the step's own
`MinHasher` and `band_keys`; the pairs are planted like bench/data_dedup_quality.py's (words
replaced at random until the reference shingles' Jaccard falls in the bin), from random words,
so that no two plants share a shingle by chance.

    .venv/bin/python -m bench.data_dedup_length --pairs 400

Short documents have few shingles (a 16-word document has 12), so one shingle more or less in
common moves the Jaccard in steps of about 0.05 and the 112-value estimate is coarse: the rate
at J 0.5-0.6 (which should stay low) and at J 0.8-0.9 (which should be high) both depend on the
length. docs/data.md "Short documents" has the table.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import random

import numpy as np  # noqa: E402

from steps.dedup.dedup import DedupConfig  # noqa: E402
from steps.dedup.minhash import MinHasher, band_keys, shingles_of  # noqa: E402

BINS = [(0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0)]
LENGTHS = [16, 32, 64, 128, 512]


def plant(words: list[str], lo: float, hi: float, rng: random.Random) -> str | None:
    base = shingles_of(" ".join(words))
    for _ in range(200):  # short documents: few Jaccard values are possible, so try many variants
        q = rng.uniform(0.0, 0.5)
        text = " ".join(w if rng.random() >= q else f"zz{rng.randrange(10**9)}" for w in words)
        other = shingles_of(text)
        j = len(base & other) / len(base | other)
        if lo <= j < hi:
            return text
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=400, help="planted pairs per (length, bin)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = DedupConfig(documents="x")
    hasher = MinHasher(num_perm=cfg.bands * cfg.rows, ngram=cfg.ngram, seed=cfg.seed)
    rng = random.Random(args.seed)
    print(f"{cfg.bands} bands x {cfg.rows} rows, verify_threshold {cfg.verify_threshold}, {cfg.ngram}-word shingles; "
          f"{args.pairs} planted pairs per cell (fewer where a length cannot reach the bin)")
    print("\n| words | shingles | " + " | ".join(f"J {lo}-{hi}" for lo, hi in BINS) + " |")
    print("|---:|---:|" + "---:|" * len(BINS))
    for length in LENGTHS:
        cells = []
        for lo, hi in BINS:
            a, b = [], []
            for _ in range(args.pairs):
                words = [f"w{rng.randrange(10**9)}" for _ in range(length)]
                text = plant(words, lo, hi, rng)
                if text is not None:
                    a.append(" ".join(words))
                    b.append(text)
            if not a:
                cells.append("-")
                continue
            sa, _ = hasher.signatures(a)
            sb, _ = hasher.signatures(b)
            shared = (band_keys(sa, cfg.bands, cfg.rows) == band_keys(sb, cfg.bands, cfg.rows)).any(axis=1)
            est = (sa == sb).mean(axis=1)
            found = shared & (est >= cfg.verify_threshold)
            cells.append(f"{found.mean():.2f} ({len(a)})")
        print(f"| {length} | {length - cfg.ngram + 1} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
