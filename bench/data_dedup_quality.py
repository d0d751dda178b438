"""Dedup quality on planted near-duplicates of known Jaccard similarity.

Originals are real documents of the bundled corpus (>= 150 words). For a share of them one
variant is planted whose word 5-gram Jaccard similarity to its original is exactly known (words
are replaced at random until the similarity, computed on the reference shingles, falls in the
target bin). Originals and variants are shuffled across 4 shards and deduplicated by the dedup
step; a planted pair is found when both end in the same component. Merges between two originals
are false merges when their true similarity is below 0.5.

    .venv/bin/python -m bench.data_dedup_quality --pairs-per-bin 300
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import random
import shutil
import time

BINS = [(0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0)]
CONFIGS = {
    "default 14x8": dict(bands=14, rows=8),
    "28x4 + verify 0.7": dict(bands=28, rows=4, verify_threshold=0.7),
    "20x5 + verify 0.7": dict(bands=20, rows=5, verify_threshold=0.7),
}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def plant(words: list[str], lo: float, hi: float, rng: random.Random, shingles_of) -> tuple[str, float] | None:
    """A variant of `words` whose shingle Jaccard to the original lies in [lo, hi)."""
    base = shingles_of(" ".join(words))
    qlo, qhi = 0.0, 1.0
    for _ in range(30):  # bisect on the share of words replaced
        q = (qlo + qhi) / 2
        out = [w if rng.random() >= q else f"zz{rng.randrange(10**9)}" for w in words]
        text = " ".join(out)
        j = jaccard(base, shingles_of(text))
        if lo <= j < hi:
            return text, j
        if j >= hi:
            qlo = q
        else:
            qhi = q
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs-per-bin", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import numpy as np

    from bench.data_common import WORK, corpus_documents, ctx
    from steps.dedup.dedup import DedupConfig, dedup
    from steps.data.formats import write_documents
    from steps.dedup.minhash import candidate_probability, shingles_of

    rng = random.Random(args.seed)
    originals = [d for d in corpus_documents() if len(d["text"].split()) >= 150]
    rng.shuffle(originals)
    docs, planted = [], []  # planted: (original index, variant index, true J, bin)
    for i, d in enumerate(originals):
        docs.append({"id": d["id"], "text": d["text"], "kind": "original"})
    k = 0
    for b, (lo, hi) in enumerate(BINS):
        made = 0
        while made < args.pairs_per_bin and k < len(originals):
            found = plant(originals[k]["text"].split(), lo, hi, rng, shingles_of)
            if found:
                docs.append({"id": f"variant-of-{originals[k]['id']}", "text": found[0], "kind": "variant"})
                planted.append((k, len(docs) - 1, found[1], b))
                made += 1
            k += 1
    print(f"{len(originals)} originals, {len(planted)} planted variants in bins {BINS}", flush=True)

    order = list(range(len(docs)))
    rng.shuffle(order)
    src = WORK / "dedup-quality"
    shutil.rmtree(src, ignore_errors=True)
    where = {}
    shard_docs: list[list[dict]] = [[] for _ in range(4)]
    for pos, idx in enumerate(order):
        s = pos % 4
        where[idx] = (s << 32) | len(shard_docs[s])
        shard_docs[s].append({"id": docs[idx]["id"], "text": docs[idx]["text"]})
    for s, items in enumerate(shard_docs):
        write_documents(str(src / f"in/{s}.jsonl.zst"), items)
    gid_to_doc = {g: i for i, g in where.items()}
    shingle_cache: dict[int, set] = {}

    def sh(i: int) -> set:
        if i not in shingle_cache:
            shingle_cache[i] = shingles_of(docs[i]["text"])
        return shingle_cache[i]

    for name, extra in CONFIGS.items():
        out = src / name.replace(" ", "_")
        t0 = time.perf_counter()
        c = ctx(out)
        dedup(DedupConfig(documents=str(src / "in"), **extra), c)
        dt = time.perf_counter() - t0
        dup = np.load(out / "duplicates.npy")
        root = {int(a): int(b) for a, b in dup}
        comp = lambda i: root.get(where[i], where[i])  # noqa: E731
        print(f"\n== {name}: {dt:.1f} s, removed {c.results['removed']}, clusters {c.results['clusters']}, "
              f"fuzzy candidates {c.results['fuzzy_candidate_pairs']}")
        for b, (lo, hi) in enumerate(BINS):
            pairs = [p for p in planted if p[3] == b]
            found = sum(comp(p[0]) == comp(p[1]) for p in pairs)
            mean_j = sum(p[2] for p in pairs) / max(1, len(pairs))
            expect = sum(candidate_probability(p[2], extra["bands"], extra["rows"]) for p in pairs) / max(1, len(pairs))
            print(f"  J in [{lo:.1f}, {hi:.1f}): {found:4d}/{len(pairs):4d} found = {found / max(1, len(pairs)):.3f}"
                  f"   (mean J {mean_j:.3f}; LSH candidate chance {expect:.3f})")
        high = [p for p in planted if p[2] >= 0.8]
        recall = sum(comp(p[0]) == comp(p[1]) for p in high) / len(high)
        mid = [p for p in planted if 0.5 <= p[2] < 0.6]
        detected = sum(comp(p[0]) == comp(p[1]) for p in mid) / len(mid)
        # merges between originals: false when their true similarity is below 0.5
        groups: dict[int, list[int]] = {}
        for i in range(len(originals)):
            groups.setdefault(comp(i), []).append(i)
        false, genuine = 0, 0
        for members in groups.values():
            for x in range(len(members)):
                for y in range(x + 1, len(members)):
                    if jaccard(sh(members[x]), sh(members[y])) < 0.5:
                        false += 1
                    else:
                        genuine += 1
        print(f"  recall at J >= 0.8: {recall:.4f} (target >= 0.99); detected in J 0.5-0.6: {detected:.3f} "
              f"(target <= 0.15); false merges among originals: {false} (target 0); "
              f"originals merged with true J >= 0.5: {genuine}")
        assert all(gid_to_doc[int(a)] is not None for a in dup[:, 0])


if __name__ == "__main__":
    main()
