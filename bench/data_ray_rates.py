"""Ingest's and dedup's per-core rates under Ray, on documents of web-like length, beside the same
steps in one process (how the data plan's first rates were measured).

    .venv/bin/python -m bench.data_ray_rates --docs 16000 --cpus 2

The corpus: documents whose lengths are drawn from a log-normal (median 2.7 KB, sigma 1.0: mean
about 4.4 KB, the data plan's 1,000 tokens of 4.4 bytes), clipped to 200 B - 100 KB, each a
contiguous span of the bundled corpus's words (English prose and Python docs) shuffled (spans
overlap, the corpus being small: shuffled, they share no n-grams), 1% exact copies
and 1% near copies (2% of words replaced, the plan's duplicate share), in shards of 1,000. Ingest
reads them as raw JSONL.zst with an extra field, as in bench/data_plan.py.

Each step runs twice, its tasks through a mapper that times every task's own CPU
(`time.process_time` inside the task): in this process (`local_map`), and under an embedded local
Ray (`ray.init(num_cpus=--cpus)`, the executor's `ray_map`, each task asking Ray for what the step
declares). Per pass: the tasks' CPU seconds, summed; "step" adds the driver's own CPU while the step
ran (the step function's work between maps, Ray's submit and get). Ray's daemons and its workers
starting up are not counted. The rate the plan uses is documents (or bytes) over "step".
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import math
import os
import random
import shutil
import time

PASS_OF = {"_signatures": "pass 1", "pair_task": "pass 2", "star_task": "pass 3", "group_task": "pass 3",
           "_write_kept": "pass 4"}


def write_corpus(out, docs: int, per_shard: int = 1000, seed: int = 0) -> tuple[int, int]:
    """(documents, bytes of text) of the corpus written as raw JSONL.zst shards under `out`."""
    from bench.data_common import corpus_documents
    from steps.data.formats import write_documents

    words = " ".join(d["text"] for d in corpus_documents()).split()
    rng = random.Random(seed)
    made: list[dict] = []
    total = 0
    for k in range(docs):
        r = rng.random()
        if made and r < 0.01:  # an exact copy of an earlier document
            text = rng.choice(made)["text"]
        elif made and r < 0.02:  # a near copy: 2% of its words replaced
            w = rng.choice(made)["text"].split(" ")
            text = " ".join(x if rng.random() >= 0.02 else f"x{rng.randrange(10**6)}" for x in w)
        else:
            size = min(100_000, max(200, int(math.exp(rng.gauss(math.log(2700), 1.0)))))
            start = rng.randrange(len(words))
            span, n = [], 0
            while n < size:
                w = words[(start + len(span)) % len(words)]
                span.append(w)
                n += len(w) + 1
            rng.shuffle(span)  # its words shuffled: spans that overlap share no n-grams (no unplanted duplicates)
            text = " ".join(span)
        made.append({"id": f"d{k}", "text": text, "url": f"https://example.org/{k}"})
        total += len(text.encode())
    for s in range(0, docs, per_shard):
        write_documents(str(out / f"{s // per_shard:05d}.jsonl.zst"), made[s:s + per_shard])
    return docs, total


class Meter:
    """A mapper (`ctx.map`'s signature) over `inner` that sums each pass's task CPU."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cpu: dict[str, float] = {}
        self.tasks: dict[str, int] = {}

    def __call__(self, fn, items, resources=None):
        from bench.data_common import timed

        part = PASS_OF.get(fn.__name__, fn.__name__)
        pairs = self.inner(timed(fn), items, resources)
        self.cpu[part] = self.cpu.get(part, 0.0) + sum(c for _, c in pairs)
        self.tasks[part] = self.tasks.get(part, 0) + len(pairs)
        return [r for r, _ in pairs]


def run_step(name: str, fn, config, out, inner) -> dict:
    from executor.testing import build_context

    shutil.rmtree(out, ignore_errors=True)
    meter = Meter(inner)
    ctx = build_context(str(out), name=name, digest="0" * 64, mapper=meter)
    t0, w0 = time.process_time(), time.perf_counter()
    fn(config, ctx)
    step = time.process_time() - t0  # in one process, the tasks' CPU is the driver's
    if inner.__name__ != "local_map":  # under Ray, the driver's and the tasks' in the workers
        step += sum(meter.cpu.values())
    return {"passes": meter.cpu, "tasks": meter.tasks, "step": step, "wall": time.perf_counter() - w0, "results": ctx.results}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=16_000)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")

    from bench.data_common import WORK
    from executor import ray_backend
    from executor.context import local_map
    from steps.data.ingest import IngestConfig, ingest
    from steps.dedup.dedup import DedupConfig, dedup

    raw = WORK / f"ray-rates-{args.docs}"
    marker = raw / "done"
    if not marker.exists():
        shutil.rmtree(raw, ignore_errors=True)
        raw.mkdir(parents=True)
        docs, text = write_corpus(raw, args.docs)
        marker.write_text(f"{docs} {text}")
    docs, text = map(int, marker.read_text().split())
    print(f"corpus: {docs:,} documents, {text / 1e6:.1f} MB of text ({text / docs:,.0f} B a document), "
          f"{len(list(raw.glob('*.jsonl.zst')))} shards; load {os.getloadavg()[0]:.1f}", flush=True)

    rows = {}
    for where in ("one process", "Ray"):
        if where == "Ray":
            ray_backend.start(num_cpus=args.cpus)
            inner = ray_backend.ray_map
        else:
            inner = local_map
        ing = run_step("raw/bench", ingest, IngestConfig(input=str(raw)), WORK / "ray-rates-ingest", inner)
        dd = run_step("dedup/bench", dedup, DedupConfig(documents=str(WORK / "ray-rates-ingest")),
                      WORK / "ray-rates-dedup", inner)
        rows[where] = (ing, dd)
        print(f"{where}: ingest {ing['step']:.1f} s of CPU ({ing['wall']:.1f} s wall), dedup {dd['step']:.1f} s "
              f"({dd['wall']:.1f} s wall), {dd['results']['removed']:,} removed; load {os.getloadavg()[0]:.1f}",
              flush=True)
    ray_backend.stop()

    print("\n| CPU seconds per 1,000 documents | in one process | under Ray | Ray / one process |")
    print("|---|---:|---:|---:|")
    local, ray = rows["one process"], rows["Ray"]
    for label, a, b in [("ingest: tasks", sum(local[0]["passes"].values()), sum(ray[0]["passes"].values())),
                        ("ingest: step", local[0]["step"], ray[0]["step"])] + \
            [(f"dedup {p}", local[1]["passes"].get(p, 0.0), ray[1]["passes"].get(p, 0.0))
             for p in ("pass 1", "pass 2", "pass 3", "pass 4")] + \
            [("dedup: step", local[1]["step"], ray[1]["step"])]:
        print(f"| {label} | {a * 1000 / docs:.3f} | {b * 1000 / docs:.3f} | **{b / a:.2f}** |")
    print("\n| per core (step CPU) | in one process | under Ray | unit |")
    print("|---|---:|---:|---|")
    print(f"| ingest | {text / local[0]['step'] / 1e6:.2f} | {text / ray[0]['step'] / 1e6:.2f} | MB of text/s |")
    print(f"| dedup | {docs / local[1]['step']:,.0f} | {docs / ray[1]['step']:,.0f} | documents/s |")
    print(f"| dedup | {text / local[1]['step'] / 1e6:.2f} | {text / ray[1]['step'] / 1e6:.2f} | MB of text/s |")


if __name__ == "__main__":
    main()
