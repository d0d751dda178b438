"""Dedup's memory against what each task declares, pass by pass, at the sizes that broke it:
a pass-1 task at ingest's default shard (100,000 documents), and a corpus holding one boilerplate
document a million times (a cookie banner: one bucket of a million members in every band).

    .venv/bin/python -m bench.data_dedup_budget --pass1-docs 100000 --copies 1000000 --others 50000

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


def run(src, out, **config) -> tuple[dict, dict, float]:
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
            peaks[part] = max(peaks.get(part, 0.0), m.gb)
            declared[part] = resources.memory_gb if resources else 0.0
        return results

    shutil.rmtree(out, ignore_errors=True)
    ctx = build_context(str(out), name="dedup/bench", digest="0" * 64, mapper=mapper)
    t = time.process_time()
    dedup(DedupConfig(documents=str(src), **config), ctx)
    return peaks, declared, time.process_time() - t, ctx.results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pass1-docs", type=int, default=100_000)
    ap.add_argument("--copies", type=int, default=1_000_000)
    ap.add_argument("--others", type=int, default=50_000)
    args = ap.parse_args()
    from bench.data_common import WORK

    for title, copies, others in (("one shard at ingest's default size", 0, args.pass1_docs),
                                  (f"a boilerplate document {args.copies:,} times", args.copies, args.others)):
        if title.startswith("one") and not args.pass1_docs or not title.startswith("one") and not args.copies:
            continue
        src = WORK / f"dedup-budget-{copies}-{others}"
        if not (src / "done").exists():
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir(parents=True)
            write_corpus(src, copies, others)
            (src / "done").write_text("")
        peaks, declared, cpu, results = run(src, WORK / "dedup-budget-out")
        print(f"\n{title}: {copies + others:,} documents, {results['removed']:,} removed, "
              f"largest cluster {results['largest_cluster']:,}; {cpu:.0f} s of CPU")
        print("| pass | largest task, measured | declared | measured / declared |")
        print("|---|---:|---:|---:|")
        for part in sorted(peaks):
            print(f"| {part} | {peaks[part]:.2f} GiB | {declared[part]:.2f} GiB | **{peaks[part] / declared[part]:.2f}** |")


if __name__ == "__main__":
    main()
