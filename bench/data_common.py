"""Shared set-up for the data benchmarks: the bundled corpus as document shards (optionally
scaled up with word-shuffled copies) and a cached 32k byte-level BPE trained on it."""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import os
import pathlib
import random
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

from executor import StepContext  # noqa: E402

from executor.testing import build_context
from steps.data.formats import iter_documents, write_documents  # noqa: E402

CORPUS = ROOT / "data/corpus"
WORK = pathlib.Path(os.environ.get("MARIN_BENCH_DIR", "/tmp/marin-bench"))


def corpus_documents() -> list[dict]:
    return [d for name in ("kjv", "pydocs") for d in iter_documents(str(CORPUS / f"{name}.jsonl.zst"))]


def shards(scale: int = 1, docs_per_shard: int = 500) -> pathlib.Path:
    """A folder of .jsonl.zst shards: the corpus, plus `scale - 1` copies whose words are shuffled
    within each document (same vocabulary and lengths, no duplicates)."""
    out = WORK / f"corpus-x{scale}-{docs_per_shard}"
    if (out / "done").exists():
        return out
    docs = corpus_documents()
    batch, k = [], 0
    for copy in range(scale):
        rng = random.Random(copy)
        for d in docs:
            text = d["text"]
            if copy:
                words = text.split(" ")
                rng.shuffle(words)
                text = " ".join(words)
            batch.append({"id": f"{d['id']}#{copy}", "text": text})
            if len(batch) == docs_per_shard:
                write_documents(str(out / f"{k:05d}.jsonl.zst"), batch)
                batch, k = [], k + 1
    if batch:
        write_documents(str(out / f"{k:05d}.jsonl.zst"), batch)
    (out / "done").write_text("")
    return out


def tokenizer(vocab_size: int = 32768) -> pathlib.Path:
    """A byte-level BPE trained on the corpus with the project's own step (cached)."""
    from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer

    out = WORK / f"tokenizer-{vocab_size}"
    if not (out / "tokenizer.json").exists():
        train_tokenizer(TrainTokenizerConfig(documents=str(shards(1)), vocab_size=vocab_size), ctx(out))
    return out


def ctx(output: pathlib.Path, name: str = "bench") -> StepContext:
    return build_context(str(output), name=name, digest="0" * 64)


def timed(fn):
    """`fn` as a task returning (its result, the CPU seconds it took in its process): a mapper's
    tasks timed where they run (a Ray worker's CPU is not the driver's)."""
    def task(item):
        t = time.process_time()
        out = fn(item)
        return out, time.process_time() - t
    task.__name__ = getattr(fn, "__name__", "task")
    return task
