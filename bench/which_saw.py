"""`--which-saw` cost: on the laptop voyage's prefix, and on a synthetic mixture at the 535B
budget's scale (18.75T tokens in sequences of 4096: 4.58e9 sequences), against the target of
1 s per document with bounded memory.

    .venv/bin/python -m bench.which_saw [--prefix out] [--documents 200]

Laptop: the voyage is run first if its prefix is not complete (`marin-run voyages/535b.py
--laptop`); then documents of both sources are answered end to end (`which_saw`: the scan of the
source's ingested shards for the id, dedup's ledger, the token offsets, the inverse sampler, the
training steps' checkpoints), and the inverse alone is timed over every window of a document.

535B scale: the mixture of voyages/535b.py's eight declared sources and their weights (stage
fractions 0.8 / 0.2, blocks of 2048) is planned without data (the inverse needs only the
manifest); token spans of documents of 2k, 20k and 200k tokens at random places of every dataset
are turned into the global sequences that read them, each checked by the sampler's forward
`locate`. Memory: the peak of Python allocations (tracemalloc) while answering, and the process's
peak RSS.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc

from bench import kit  # noqa: E402

ROOT = str(kit.ROOT)
TARGET_S = 1.0


def laptop(prefix: str, documents: int) -> None:
    import importlib.util

    from executor.api import plan_steps
    from steps.data.formats import document_shards, iter_documents
    from steps.data.mixture import MixtureSampler
    from steps.provenance.inverse import MixtureInverse
    from steps.provenance.which_saw import which_saw

    voyage = os.path.join(ROOT, "voyages", "535b.py")
    spec = importlib.util.spec_from_file_location("voyage_535b_bench", voyage)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    steps = module.voyage(module.VoyageConfig(laptop=True))
    plan = plan_steps(steps, prefix)
    needed = ("mixture/laptop", "pretrain/laptop", "midtrain/laptop")
    if not all(plan[n].has_output for n in needed):
        print(f"running the laptop voyage into {prefix} first ...", flush=True)
        subprocess.run([os.path.join(ROOT, ".venv", "bin", "marin-run"), voyage, "--laptop", "--prefix", prefix,
                        "--no-live-page"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    plan = plan_steps(steps, prefix)
    plan_s = time.perf_counter() - t0
    rng = random.Random(0)
    times, inverse_times, sequences = [], [], []
    for source in ("kjv", "pydocs"):
        ids = [d["id"] for url in document_shards(plan.path(plan.dag[f"raw/{source}"]))
               for d in iter_documents(url)]
        picks = rng.sample(ids, min(documents // 2, len(ids)))
        for doc_id in picks:
            t0 = time.perf_counter()
            answer = which_saw(plan, source, doc_id)
            times.append(time.perf_counter() - t0)
            sequences.append(len(answer.sequences))
        sampler = MixtureSampler(plan.path(plan.dag["mixture/laptop"]))
        inverse = MixtureInverse(sampler)
        for doc_id in picks[:20]:
            answer = which_saw(plan, source, doc_id)
            t0 = time.perf_counter()
            inverse.reads(source, *answer.span)
            inverse_times.append(time.perf_counter() - t0)
    print(f"laptop voyage ({prefix}): plan {plan_s * 1e3:.0f} ms (once per command); {len(times)} documents of both "
          f"sources, {statistics.mean(sequences):.1f} sequences each on average")
    _row("which_saw end to end, per document", times)
    _row("  of which the inverse sampler", inverse_times)


def scale(documents: int) -> None:
    import importlib.util

    from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, plan_mixture
    from steps.provenance.inverse import MixtureInverse

    spec = importlib.util.spec_from_file_location("voyage_535b_bench", os.path.join(ROOT, "voyages", "535b.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    sources = module.FULL_SOURCES
    cfg = MixtureConfig(datasets={s.name: s.name for s in sources}, token_budget=int(18.75e12), seq_len=4096,
                        stages=(MixtureStage(0.8, {s.name: s.pretrain for s in sources if s.pretrain}),
                                MixtureStage(0.2, {s.name: s.midtrain for s in sources if s.midtrain})),
                        block_size=2048)
    t0 = time.perf_counter()
    manifest = plan_mixture(cfg, {s.name: int(s.tokens) for s in sources})
    sampler = MixtureSampler(manifest)
    inverse = MixtureInverse(sampler)
    setup = time.perf_counter() - t0
    print(f"\n535B scale: {len(sampler):,} sequences of 4096 in blocks of 2048, {len(sources)} datasets, "
          f"epochs {', '.join(f'{n} {e:.2f}' for n, e in manifest['epochs'].items())}; set-up {setup:.2f} s")
    rng = random.Random(0)
    tracemalloc.start()
    for length in (2_000, 20_000, 200_000):
        times, counts = [], []
        for _ in range(documents):
            name = rng.choice([n for n in sampler.names if manifest["draws"][n]])
            tokens = manifest["datasets"][name]["sequences"] * 4096
            start = rng.randrange(tokens - length)
            t0 = time.perf_counter()
            reads = inverse.reads(name, start, start + length)
            times.append(time.perf_counter() - t0)
            counts.append(len(reads))
        _row(f"a document of {length:,} tokens ({statistics.mean(counts):.1f} sequences read it on average)", times)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"memory: peak Python allocations while answering {peak / 2**20:.1f} MiB; process peak RSS {rss:.0f} MiB "
          "(bounded: one block of 2048 slots per window, the sampler caches 9 blocks)")


def _row(what: str, times: list[float]) -> None:
    times = sorted(times)
    p50, p99, worst = times[len(times) // 2], times[min(len(times) - 1, int(0.99 * len(times)))], times[-1]
    print(f"  {what}: median {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {worst * 1e3:.2f} ms  "
          f"-> {worst / TARGET_S:.4f} x the 1 s target (max)")
    kit.emit(what.strip(), quiet=True, n=len(times), median_ms=round(p50 * 1e3, 3), p99_ms=round(p99 * 1e3, 3),
             max_ms=round(worst * 1e3, 3), x_target=round(worst / TARGET_S, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", default=os.path.join(ROOT, "out"))
    parser.add_argument("--documents", type=int, default=200)
    args = parser.parse_args()
    laptop(os.path.abspath(args.prefix), args.documents)
    scale(args.documents)


if __name__ == "__main__":
    main()
