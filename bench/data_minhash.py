"""MinHash signatures per core: ours (vectorized numpy, from raw text) against datasketch
(`MinHash.update_batch` on the same word 5-gram shingles, prebuilt, so its shingling is not
even counted), with the same number of permutations, on one thread.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.data_minhash --perm 112 --docs 2000
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--perm", type=int, default=112)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import numpy as np
    from datasketch import MinHash

    from bench import kit
    from bench.data_common import corpus_documents
    from steps.dedup.minhash import MinHasher, shingles_of

    texts = [d["text"] for d in corpus_documents()][: args.docs]
    words = sum(len(t.split()) for t in texts)
    print(f"{len(texts)} documents, {words / len(texts):.0f} words each on average, {args.perm} permutations, "
          f"1 thread", flush=True)
    hasher = MinHasher(num_perm=args.perm)

    def ours() -> None:
        for k in range(0, len(texts), 512):
            hasher.signatures(texts[k:k + 512])

    shingled = kit.timed(lambda: [[s for s in shingles_of(t)] for t in texts])
    shingles, shingling = shingled.value, shingled.wall_min

    def datasketch() -> None:
        for s in shingles:
            m = MinHash(num_perm=args.perm)
            m.update_batch(s)

    best = {}
    for _ in range(args.repeats):  # interleaved, so that a change of load hits both
        for name, fn in (("ours (text -> signature)", ours), ("datasketch (shingles -> signature)", datasketch)):
            best[name] = min(best.get(name, float("inf")), kit.timed(fn).wall_min)
    for name, dt in best.items():
        print(f"{name:38s} {len(texts) / dt:9.0f} docs/s  {dt / len(texts) * 1e6:8.1f} us/doc")
        kit.emit(name, quiet=True, docs=len(texts), perm=args.perm, docs_per_s=round(len(texts) / dt),
                 us_per_doc=round(dt / len(texts) * 1e6, 1), wall_min_s=dt)
    print(f"{'(datasketch shingling, not counted)':38s} {shingling / len(texts) * 1e6:27.1f} us/doc")
    ratio = best["datasketch (shingles -> signature)"] / best["ours (text -> signature)"]
    print(f"\nours / datasketch per core = {ratio:.2f}x  (target >= 2)")
    # sanity: both estimate the same Jaccard on a near-duplicate pair
    a = texts[0]
    b = a.replace(" and ", " AND ALSO ", 5)
    sa, sb = shingles_of(a), shingles_of(b)
    ma, mb = MinHash(num_perm=args.perm), MinHash(num_perm=args.perm)
    ma.update_batch(list(sa))
    mb.update_batch(list(sb))
    sig, _ = hasher.signatures([a, b])
    print(f"check: true J {len(sa & sb) / len(sa | sb):.3f}, ours {np.mean(sig[0] == sig[1]):.3f}, "
          f"datasketch {ma.jaccard(mb):.3f}")


if __name__ == "__main__":
    main()
