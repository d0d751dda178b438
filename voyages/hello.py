"""A small voyage of real work, to exercise the executor before the ML steps exist.

    marin-run voyages/hello.py --dry-run
    marin-run voyages/hello.py --n_files 6

Fan-out: `hello/text/{i}` writes a pseudo-random text shard each, `hello/count/{i}` counts its
words (half a CPU each, so two run per core). Fan-in: `hello/merge` adds the counts up, and
`hello/report` (asking for memory as well) writes the top words as Markdown.
"""

from __future__ import annotations

import collections
import json
import random
from dataclasses import dataclass

from executor import InputPath, Resources, Step, StepContext, output_of, run_only, step_type

VOCAB = ("ray", "step", "digest", "voyage", "token", "expert", "router", "shard", "lease", "prefix",
         "cache", "record", "plan", "mixture", "dedup", "train", "eval", "bucket", "node", "rack")


@dataclass(frozen=True)
class HelloConfig:
    """The voyage's knobs (`marin-run voyages/hello.py --help`)."""

    n_files: int = 4
    words_per_file: int = 5000
    seed: int = 0
    top_k: int = 10
    zipf: float = 1.1


@dataclass(frozen=True)
class TextConfig:
    index: int
    words: int
    seed: int
    zipf: float = 1.1


@step_type(version="1")
def write_text(config: TextConfig, ctx: StepContext) -> None:
    """Write one shard of Zipf-distributed words."""
    rng = random.Random(config.seed * 1_000_003 + config.index)
    weights = [1.0 / (rank + 1) ** config.zipf for rank in range(len(VOCAB))]
    words = rng.choices(VOCAB, weights=weights, k=config.words)
    with ctx.open("text.txt", "w") as f:
        for i in range(0, len(words), 12):
            f.write(" ".join(words[i:i + 12]) + "\n")
    ctx.results["words"] = config.words


@dataclass(frozen=True)
class CountConfig:
    text: InputPath  # output_of(text step, "text.txt"): a URL when the step runs
    log_every: int = run_only(default=0)


@step_type(version="1")
def count_words(config: CountConfig, ctx: StepContext) -> None:
    """Count the words of one shard."""
    counts: collections.Counter = collections.Counter()
    with ctx.open_input(config.text, mode="r") as f:
        for line in f:
            counts.update(line.split())
    with ctx.open("counts.json", "w") as f:
        json.dump(dict(sorted(counts.items())), f, indent=0)


@dataclass(frozen=True)
class MergeConfig:
    counts: tuple[InputPath, ...]


@step_type(version="1")
def merge_counts(config: MergeConfig, ctx: StepContext) -> None:
    """Add up the counts of every shard."""
    total: collections.Counter = collections.Counter()
    for url in config.counts:
        with ctx.open_input(url, mode="r") as f:
            total.update(json.load(f))
    with ctx.open("total.json", "w") as f:
        json.dump(dict(sorted(total.items())), f, indent=0)
    ctx.results["distinct_words"] = len(total)
    ctx.results["words"] = sum(total.values())


@dataclass(frozen=True)
class ReportConfig:
    total: InputPath
    top_k: int = 10


@step_type(version="1")
def report(config: ReportConfig, ctx: StepContext) -> None:
    """Write the most frequent words as a Markdown table."""
    with ctx.open_input(config.total, mode="r") as f:
        total = collections.Counter(json.load(f))
    n = sum(total.values())
    lines = ["| word | count | share |", "|---|---:|---:|"]
    lines += [f"| {w} | {c} | {c / n:.3f} |" for w, c in total.most_common(config.top_k)]
    with ctx.open("report.md", "w") as f:
        f.write("\n".join(lines) + "\n")


def voyage(config: HelloConfig) -> list[Step]:
    """Fan out over `n_files` shards, count each, fan in, report."""
    counts = []
    for i in range(config.n_files):
        text = Step(f"hello/text/{i}", write_text, TextConfig(i, config.words_per_file, config.seed, config.zipf))
        counts.append(Step(f"hello/count/{i}", count_words, CountConfig(text=output_of(text, "text.txt")),
                           resources=Resources(cpus=0.5)))
    merged = Step("hello/merge", merge_counts,
                  MergeConfig(counts=tuple(output_of(c, "counts.json") for c in counts)))
    final = Step("hello/report", report, ReportConfig(total=output_of(merged, "total.json"), top_k=config.top_k),
                 resources=Resources(cpus=1, memory_gb=0.25))
    return [final]
