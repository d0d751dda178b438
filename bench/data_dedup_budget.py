"""Dedup's memory against what each task declares, pass by pass, at the sizes that broke it:
a pass-1 task at ingest's default shard (100,000 documents), and a corpus holding one boilerplate
document a million times (a cookie banner: one bucket of a million members in every band).

    .venv/bin/python -m bench.data_dedup_budget --pass1-docs 100000 --copies 1000000 --others 50000
    .venv/bin/python -m bench.data_dedup_budget --flat 66000 1000000

`--flat` instead runs corpora of that many distinct short documents (no boilerplate), each with
the default config and ingest's default shard (100,000 documents), and prints every pass's
largest task at each size, and the largest over the smallest (the target: within 1.25).

The step runs in this process with the default config (every task already checks itself against
its declaration and fails past it: steps/data/memory.py); a mapper measures every task the same
way (peak RSS growth while it ran, plus the 0.25 GiB of a fresh worker) and prints, per pass, the
largest task's figure beside what the pass declares, with their ratio. The documents are short
(12 to 40 words): a pass's memory does not depend on the length of a document, only on their
number (signatures and keys are fixed-size); short documents make the corpus quick to hash.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import random
import shutil
import time


PASS_OF = {"_signatures": "pass 1", "pair_task": "pass 2", "star_task": "pass 3", "group_task": "pass 3",
           "_write_kept": "pass 4"}
BANNER = ("We use cookies to improve your experience on our site. By continuing to browse you agree to our use of "
          "cookies. Read our privacy policy to learn more.")


def write_corpus(out, copies: int, others: int, per_shard: int = 100_000) -> int:
    from steps.data.formats import write_documents

    rng = random.Random(0)
    total = copies + others
    order = list(range(total))
    rng.shuffle(order)

    def doc(k):
        if k < copies:
            return {"id": f"b{k}", "text": BANNER}
        return {"id": f"o{k}", "text": " ".join(f"w{rng.randrange(10**7)}" for _ in range(rng.randrange(12, 40)))}

    for s in range(0, total, per_shard):
        write_documents(str(out / f"{s // per_shard:05d}.jsonl.zst"), (doc(k) for k in order[s:s + per_shard]))
    return -(-total // per_shard)


def run(src, out, **config) -> tuple[dict, dict, float, dict]:
    from executor.testing import build_context
    from steps.dedup.dedup import DedupConfig, dedup
    from steps.data.memory import Measure

    peaks: dict[str, float] = {}
    declared: dict[str, float] = {}

    def mapper(fn, items, resources=None):
        part = PASS_OF.get(fn.__name__, fn.__name__)
        results = []
        for item in items:
            m = Measure()
            results.append(fn(item))
            if m.gb >= peaks.get(part, 0.0):  # the largest task, and what it declared (pass 3's vary)
                peaks[part] = m.gb
                declared[part] = resources.memory_gb if resources else 0.0
        return results

    shutil.rmtree(out, ignore_errors=True)
    ctx = build_context(str(out), name="dedup/bench", digest="0" * 64, mapper=mapper)
    t = time.process_time()
    dedup(DedupConfig(documents=str(src), **config), ctx)
    return peaks, declared, time.process_time() - t, ctx.results


def corpus(copies: int, others: int):
    from bench.data_common import WORK

    src = WORK / f"dedup-budget-{copies}-{others}"
    if not (src / "done").exists():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        write_corpus(src, copies, others)
        (src / "done").write_text("")
    return src


def flat(sizes: list[int]) -> None:
    """Every pass's largest task at each corpus size, with the default budget."""
    import os

    from bench.data_common import WORK

    rows = {}
    for n in sizes:
        peaks, declared, cpu, results = run(corpus(0, n), WORK / "dedup-budget-out")
        rows[n] = (peaks, declared)
        print(f"{n:,} documents: {results['pass2_tasks']} pass-2 tasks, {results['pass3_partitions']} pass-3 "
              f"partitions, {results['removed']:,} removed; {cpu:.0f} s of CPU; load {os.getloadavg()[0]:.1f}",
              flush=True)
    parts = sorted({p for peaks, _ in rows.values() for p in peaks})
    print("| pass | " + " | ".join(f"{n:,} documents: largest task / declared" for n in sizes) +
          " | largest / smallest |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for part in parts:
        got = [rows[n][0].get(part, 0.0) for n in sizes]
        cells = " | ".join(f"{g:.2f} / {rows[n][1].get(part, 0.0):.2f} GiB" for g, n in zip(got, sizes))
        print(f"| {part} | {cells} | **{max(got) / min(got):.2f}** |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pass1-docs", type=int, default=100_000)
    ap.add_argument("--copies", type=int, default=1_000_000)
    ap.add_argument("--others", type=int, default=50_000)
    ap.add_argument("--flat", type=int, nargs="+", default=None,
                    help="corpus sizes (distinct short documents): every pass's largest task at each")
    args = ap.parse_args()
    from bench.data_common import WORK

    if args.flat:
        flat(args.flat)
        return

    for title, copies, others in (("one shard at ingest's default size", 0, args.pass1_docs),
                                  (f"a boilerplate document {args.copies:,} times", args.copies, args.others)):
        if title.startswith("one") and not args.pass1_docs or not title.startswith("one") and not args.copies:
            continue
        src = corpus(copies, others)
        peaks, declared, cpu, results = run(src, WORK / "dedup-budget-out")
        print(f"\n{title}: {copies + others:,} documents, {results['removed']:,} removed, "
              f"largest cluster {results['largest_cluster']:,}; {cpu:.0f} s of CPU")
        print("| pass | largest task, measured | declared | measured / declared |")
        print("|---|---:|---:|---:|")
        for part in sorted(peaks):
            print(f"| {part} | {peaks[part]:.2f} GiB | {declared[part]:.2f} GiB | **{peaks[part] / declared[part]:.2f}** |")


if __name__ == "__main__":
    main()
