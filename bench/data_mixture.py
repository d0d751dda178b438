"""Mixture sampler at the scale of the 535B voyage: realized shares against the weights, the
switch at the stage boundary, and the cost of random access.

    .venv/bin/python -m bench.data_mixture

Budget 18.75T tokens in sequences of 4096 (4.58e9 sequences), 80% pretrain then 20% midtrain.
Shares are counted exactly from every block's quotas (the same quotas `locate` serves), and
`locate` is checked against them on random blocks.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import random
import time


def main() -> None:
    import numpy as np

    from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, plan_mixture

    pre = {"web": 0.72, "code": 0.15, "math": 0.05, "books": 0.05, "wiki": 0.03}
    mid = {"web": 0.30, "code": 0.25, "math": 0.20, "instruct": 0.15, "books": 0.07, "wiki": 0.03}
    names = sorted(set(pre) | set(mid))
    cfg = MixtureConfig(datasets={n: n for n in names}, token_budget=18_750 * 10**9, seq_len=4096,
                        stages=(MixtureStage(0.8, pre), MixtureStage(0.2, mid)), seed=0)
    sizes = {"web": 20e12, "code": 4e12, "math": 1e12, "books": 0.5e12, "wiki": 0.1e12, "instruct": 0.3e12}
    t0 = time.perf_counter()
    manifest = plan_mixture(cfg, {n: int(s) for n, s in sizes.items()})
    s = MixtureSampler(manifest)
    print(f"{len(s):,} sequences; plan in {time.perf_counter() - t0:.2f} s; warnings: {manifest['warnings']}")
    print("epochs:", {n: round(e, 3) for n, e in manifest["epochs"].items()})
    worst = 0.0
    for k, stage in enumerate(manifest["stages"]):
        n = stage["end"] - stage["start"]
        t0 = time.perf_counter()
        counts = np.zeros(len(names), dtype=np.int64)
        for j in range(s._blocks(k)):  # every block's exact quota
            counts += s._block_quotas(k, j)[1]
        dt = time.perf_counter() - t0
        print(f"stage {k}: sequences {stage['start']:,} .. {stage['end']:,} ({s._blocks(k):,} blocks, counted in {dt:.1f} s)")
        for i, name in enumerate(names):
            w = stage["weights"][name]
            share = counts[i] / n
            rel = abs(share - w) / w if w else 0.0
            worst = max(worst, rel)
            print(f"   {name:9s} weight {w:.4f}  realized {share:.9f}  off by {abs(share - w):.2e} "
                  f"({100 * rel:.1e}% of the weight)")
    print(f"worst relative deviation from a weight: {100 * worst:.1e}% (target within 0.1%)")
    b = manifest["stages"][1]["start"]
    before, after = s.locate(b - 1), s.locate(b)
    print(f"switch: sequence {b - 1:,} is stage {before.stage} ({before.dataset}), sequence {b:,} is stage "
          f"{after.stage} ({after.dataset}); boundary = 0.8 x budget exactly: {b == round(0.8 * len(s))}")
    assert before.stage == 0 and after.stage == 1
    assert all(s.locate(i).dataset != "instruct" for i in range(b - 5000, b))
    # locate agrees with the quotas on random blocks, and costs O(1)
    rng = random.Random(0)
    for _ in range(5):
        k = rng.randrange(2)
        j = rng.randrange(s._blocks(k))
        start = manifest["stages"][k]["start"] + j * s.block
        got = np.bincount([names.index(s.locate(start + t).dataset) for t in range(s.block)], minlength=len(names))
        assert (got == s._block_quotas(k, j)[1]).all()
    idx = [rng.randrange(len(s)) for _ in range(20000)]
    t0 = time.perf_counter()
    for i in idx:
        s.locate(i)
    cold = (time.perf_counter() - t0) / len(idx)
    t0 = time.perf_counter()
    for i in range(10**9, 10**9 + 20000):
        s.locate(i)
    warm = (time.perf_counter() - t0) / 20000
    print(f"locate: {cold * 1e6:.0f} us at random indices (a new block each), {warm * 1e6:.1f} us sequential")


if __name__ == "__main__":
    main()
