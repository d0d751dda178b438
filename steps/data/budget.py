"""The data plan: what each data step of a voyage costs at full size, before anything runs.

For each data step (ingest, dedup by pass, decontaminate, tokenize) of each source: its tasks,
core-hours, the peak memory of one task, bytes read and written, and the wall time on the CPU
nodes the voyage declares; the resources each step (and so each of its tasks) asks Ray for come
from it. A task that cannot fit one node (more CPUs or memory than a node has) stops the voyage
at plan time (VoyageError: exit 2, one line), instead of waiting forever for a node Ray never has.

Every figure is computed from a source's declared tokens and the per-core throughputs in `RATES`,
each measured by a bench script (its command beside it, and how: under Ray, or in one process only;
the plan's last line says which rates are which, and which are extrapolated), and from the
formats' own sizes:

- documents: tokens / TOKENS_PER_DOC; text: tokens x BYTES_PER_TOKEN; a zstd shard holds
  text / ZSTD_RATIO bytes; shards: documents / DOCS_PER_SHARD (ingest's `max_docs_per_shard`);
- dedup (steps/dedup/dedup.py, its own memory formulas): pass 1 a task a shard writing one sorted
  run a section (28 bands + exact) of records (key, id, the 112-word signature carried for
  verification: 464 bytes), holding `pass1_bytes_per_doc` a document; pass 2 one task per
  (section, key range) of `keys_per_task` records, holding a chunk of each run (`pass2_gb`);
  pass 3 hash partitions of `pairs_per_task` pair entries (a duplicate's pair found in each of the
  29 sections), two scatters, two maps a round, an emit and a group sort each; pass 4 a task a shard.
  Its core-hours are the whole step's measured rate; its memory the largest pass's;
- decontaminate: the eval index (16 bytes an eval n-gram, held twice while it loads) beside one
  batch of documents; the rate by the eval side's size (`decontam_rate`: measured at three sizes,
  interpolated between, extrapolated past the largest, and the plan says which);
- tokenize: uint32 tokens (a 128k vocabulary), `cpus` encoder threads a task.

Wall time: a step's core-hours over the cores it can use at once: on each node as many tasks as
both its cores and its memory allow, and never more tasks than it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from executor import Resources, VoyageError
from steps.data.memory import WORKER_GB

GiB = 2**30
TOKENS_PER_DOC = 1_000  # shared/DATA.md (the data facts the project was given): ~1k tokens a document at the voyage's size
BYTES_PER_TOKEN = 4.4  # shared/DATA.md (the data facts the project was given): text bytes a Llama 3 token
DOCS_PER_SHARD = 100_000  # ingest's max_docs_per_shard
DEDUP_SECTIONS = 29  # 28 bands + the exact-hash section
DEDUP_RECORD = 464  # bytes: key, global id, the 112-word signature (steps.dedup.runs.record_dtype)
KEYS_PER_TASK = 1 << 20  # DedupConfig.keys_per_task
PAIRS_PER_TASK = 1 << 22  # DedupConfig.pairs_per_task
DUPLICATE_SHARE = 0.01  # near-duplicate documents ("~0.5 TB of raw pairs at 1%")
COMPONENT_ROUNDS = 6  # large-star/small-star rounds (logarithmic in the largest cluster)
EVAL_NGRAM_BYTES = 16  # decontam.EvalIndex: a uint64 hash and a uint64 set mask
WORDS_PER_TOKEN = 0.75


@dataclass(frozen=True)
class Rate:
    """A per-core throughput, the command that measured it, and how (the plan prints it)."""

    value: float
    unit: str
    command: str
    basis: str = "measured in one process only (not under Ray)"


BENCH = ".venv/bin/python bench/data_plan.py --scale 2 --repeats 1"
RAY_BENCH = ".venv/bin/python bench/data_ray_rates.py --docs 32000 --cpus 2"
UNDER_RAY = "measured under Ray (an embedded local Ray of 2 CPUs, documents of 4.5 KB)"
ONE_PROCESS = "measured in one process only (not under Ray)"
# Ingest and dedup: measured under Ray on documents of the plan's size (docs/benchmarks.md "Rates
# under Ray", 2026-12-03, two runs: ingest 41.6 and 42.0 MB/s, dedup 7.19 and 7.31 MB/s of text; the
# lower taken). The figures they replace were measured in one process on documents of 2.9 KB (41.7
# MB/s; 2,443 documents/s of 656 tokens = 1.60M tokens/s): the same within 4%. Tokenize was
# measured in one process only (2026-12-01, load about 5 on the 2-core machine).
RATES = {
    "ingest": Rate(41.6e6, "bytes of text/s", RAY_BENCH, UNDER_RAY),
    "dedup": Rate(7.19e6 / BYTES_PER_TOKEN, "tokens/s (7.19 MB of text/s: 1,599 documents of 4,494 bytes)",
                  RAY_BENCH, UNDER_RAY),
    "decontaminate": Rate(6.96e6, "bytes of text/s at a 1.2M-n-gram eval side",
                          ".venv/bin/python bench/data_decontam.py --scale 2 --repeats 2 --sizes 1000000",
                          "by the eval side's size: decontam_rate, per step below"),
    "tokenize": Rate(0.71e6, "tokens/s a thread", BENCH.replace("--repeats 1", "--repeats 3"), ONE_PROCESS),
}
ZSTD_RATIO = Rate(2.97, "text bytes / zstd shard bytes", BENCH)
# The decontaminate task's rate falls as the eval index outgrows the caches (a lookup is a binary
# search over it). Measured at three eval-side sizes (eval n-grams, bytes of text/s a core;
# docs/benchmarks.md "Decontamination against the eval side's size", 2026-12-03, load 30-40 on the
# 2-core machine, process CPU time). The rates of the independent data check (7.87 MB/s at 106 n-grams, 8.4
# at 1M, 2.33 at 7.4M) lie within 13% of the model drawn through these.
DECONTAM_BENCH = ".venv/bin/python bench/data_decontam.py --scale 2 --repeats 2 --sizes 100000 1000000 8000000"
DECONTAM_RATES = ((118_380, 9.07e6), (1_181_658, 6.96e6), (9_466_072, 2.34e6))


def decontam_rate(eval_ngrams: float) -> tuple[float, str]:
    """(bytes of text/s a core, how it is known) at an eval side of `eval_ngrams` n-grams: the
    time a byte is taken as piecewise linear in log2(eval n-grams) through `DECONTAM_RATES`
    ("measured" at a point, "interpolated" between two, flat below the smallest), and past the
    largest "extrapolated" along the last segment's slope (each doubling of the index past the
    caches costs a lookup about one more miss)."""
    pts = [(math.log2(n), 1.0 / r) for n, r in DECONTAM_RATES]
    x = math.log2(max(eval_ngrams, 1.0))
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if abs(x - x0) < 1e-9:
            return 1.0 / y0, "measured"
        if x0 < x < x1:
            return 1.0 / (y0 + (y1 - y0) * (x - x0) / (x1 - x0)), "interpolated"
    if abs(x - pts[-1][0]) < 1e-9:
        return 1.0 / pts[-1][1], "measured"
    if x < pts[0][0]:
        return 1.0 / pts[0][1], "extrapolated: flat below the smallest measured"
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return 1.0 / (y1 + (y1 - y0) * (x - x1) / (x1 - x0)), "extrapolated"


@dataclass(frozen=True)
class CpuNodes:
    """The CPU nodes a voyage's data steps run on."""

    count: int
    cores: int
    memory_gb: float

    def describe(self) -> str:
        return f"{self.count} nodes of {self.cores} cores and {self.memory_gb:g} GiB"


@dataclass
class StepPlan:
    """One data step at full size."""

    name: str
    tasks: int
    cpus: int  # a task's
    memory_gb: float  # a task's peak
    core_hours: float
    read_bytes: float
    written_bytes: float
    wall_hours: float = 0.0
    detail: str = ""
    rate: str = ""

    def resources(self) -> Resources:
        """What the step (and each of its tasks) asks Ray for."""
        return Resources(cpus=self.cpus, memory_gb=round(self.memory_gb, 2))


@dataclass(frozen=True)
class DataSource:
    """What the plan needs of a source: its declared tokens and its dedup group."""

    name: str
    tokens: float
    group: str = ""


@dataclass
class DataPlan:
    nodes: CpuNodes
    steps: list[StepPlan] = field(default_factory=list)

    def __getitem__(self, name: str) -> StepPlan:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def resources(self, name: str) -> Resources:
        return self[name].resources()


def plan_data(sources: Sequence[DataSource], nodes: CpuNodes, heldout_tokens: float = 0.0,
              eval_tokens: float = 0.0, tokenize_threads: int = 8) -> DataPlan:
    """The plan of ingest, dedup (per group), decontaminate and tokenize for `sources`; a
    VoyageError naming the step when one task cannot fit a node."""
    plan = DataPlan(nodes)
    groups: dict[str, list[DataSource]] = {}
    for src in sources:
        groups.setdefault(src.group or src.name, []).append(src)
        plan.steps.append(_ingest(src.name, src.tokens))
    for group, members in groups.items():
        plan.steps.append(_dedup(group, sum(m.tokens for m in members)))
    eval_ngrams = (heldout_tokens + eval_tokens) * WORDS_PER_TOKEN
    for src in sources:
        plan.steps.append(_decontam(src.name, src.tokens, eval_ngrams))
        plan.steps.append(_tokenize(src.name, src.tokens, tokenize_threads))
    if heldout_tokens:
        plan.steps.append(_ingest("heldout", heldout_tokens))
        plan.steps.append(_tokenize("heldout", heldout_tokens, tokenize_threads))
    for step in plan.steps:
        _check_fits(step, nodes)
        step.wall_hours = _wall(step, nodes)
    return plan


def _shards(tokens: float) -> int:
    return max(1, math.ceil(tokens / TOKENS_PER_DOC / DOCS_PER_SHARD))


def _zst(tokens: float) -> float:
    return tokens * BYTES_PER_TOKEN / ZSTD_RATIO.value


def ingest_task_gb() -> float:
    """An ingest task: it streams, a 1 MB read chunk, a 1 MB writer buffer and its copy, a
    Parquet batch of 1,024 rows, one record."""
    return WORKER_GB + 0.25


def tokenize_task_gb(batch_docs: int = 1024, tokens_per_doc: float = TOKENS_PER_DOC) -> float:
    """A tokenize task: two batches as text and ids, and the tokenizer (a 128k BPE: ~0.5 GB in Rust)."""
    return WORKER_GB + 0.5 + 2 * batch_docs * tokens_per_doc * (BYTES_PER_TOKEN + 12) / GiB


def decontam_task_gb(eval_ngrams: float) -> float:
    """A decontaminate task: the eval index (16 bytes an n-gram, twice while it loads) beside one
    batch of documents."""
    return WORKER_GB + 0.25 + 2 * eval_ngrams * EVAL_NGRAM_BYTES / GiB


def _ingest(name: str, tokens: float) -> StepPlan:
    text = tokens * BYTES_PER_TOKEN
    return StepPlan(f"raw/{name}", _shards(tokens), 1, ingest_task_gb(), text / RATES["ingest"].value / 3600,
                    _zst(tokens), _zst(tokens), rate="ingest")


def _dedup(group: str, tokens: float) -> StepPlan:
    from steps.dedup.dedup import PASS1_SCRATCH_GB, PASS3_BYTES_PER_ENTRY, DedupConfig, pass1_bytes_per_doc, pass2_gb

    cfg = DedupConfig(documents="")
    docs = tokens / TOKENS_PER_DOC
    shards = _shards(tokens)
    per_shard = docs / shards
    runs = docs * DEDUP_SECTIONS * DEDUP_RECORD
    # pass 1: a shard's run (declared as the largest pass, so a shard is one run)
    p1_gb = WORKER_GB + PASS1_SCRATCH_GB + per_shard * pass1_bytes_per_doc(cfg) / GiB
    ranges = math.ceil(docs / KEYS_PER_TASK)
    p2_tasks = DEDUP_SECTIONS * ranges
    p2_gb = pass2_gb(cfg, shards)  # a chunk of each shard's run, a block, a part of pairs
    # pass 3 as the code cuts it: partitions of pairs_per_task pair entries over all sections (a
    # duplicate's pair is found again in every band it shares; here in all 29, as an exact copy
    # is), and its maps: the scatter (two tasks a partition: each makes two entries of a pair), two
    # a round, the emit, the group sort
    entries = docs * DUPLICATE_SHARE * DEDUP_SECTIONS
    edges = docs * DUPLICATE_SHARE  # distinct: a star edge a removed document
    parts = max(1, math.ceil(entries / PAIRS_PER_TASK))
    p3_tasks = parts * (2 * COMPONENT_ROUNDS + 4)
    # a task within the budget; a partition receiving a cluster's star of millions declares more
    # (steps.dedup.components: what it receives, PASS3_BYTES_PER_ENTRY an entry)
    p3_gb = WORKER_GB + 0.05 + PAIRS_PER_TASK * PASS3_BYTES_PER_ENTRY / GiB
    p4_gb = WORKER_GB + 0.25
    passes = [("pass 1", shards, p1_gb), ("pass 2", p2_tasks, p2_gb), ("pass 3", p3_tasks, p3_gb),
              ("pass 4", shards, p4_gb)]
    detail = "; ".join(f"{p} {n:,} x {gb:.2f} GiB" for p, n, gb in passes)
    rounds = 2 * edges * 16 * 2 * COMPONENT_ROUNDS  # both ways, two maps a round
    return StepPlan(f"dedup/{group}", sum(n for _, n, _ in passes), 1, max(gb for _, _, gb in passes),
                    tokens / RATES["dedup"].value / 3600,
                    2 * _zst(tokens) + runs + entries * 16 + rounds,
                    runs + _zst(tokens) * (1 - DUPLICATE_SHARE) + entries * 16 + rounds,
                    detail=detail, rate="dedup")


def _decontam(name: str, tokens: float, eval_ngrams: float) -> StepPlan:
    gb = decontam_task_gb(eval_ngrams)
    rate, how = decontam_rate(eval_ngrams)
    return StepPlan(f"decontam/{name}", _shards(tokens), 1, gb, tokens * BYTES_PER_TOKEN / rate / 3600,
                    _zst(tokens) + eval_ngrams * 8, _zst(tokens),
                    detail=f"eval index {eval_ngrams:.3g} n-grams: {rate / 1e6:.2f} MB/s a core, {how}",
                    rate="decontaminate")


def _tokenize(name: str, tokens: float, threads: int) -> StepPlan:
    return StepPlan(f"tokenized/{name}", _shards(tokens), threads, tokenize_task_gb(), tokens / RATES["tokenize"].value / 3600,
                    _zst(tokens), tokens * 4 + _shards(tokens) * DOCS_PER_SHARD * 8, rate="tokenize")


def _slots(step: StepPlan, nodes: CpuNodes) -> int:
    return min(nodes.cores // step.cpus, int(nodes.memory_gb // step.memory_gb))


def _check_fits(step: StepPlan, nodes: CpuNodes) -> None:
    if step.cpus > nodes.cores or step.memory_gb > nodes.memory_gb:
        raise VoyageError(f"data plan: a task of {step.name} needs {step.cpus} CPUs and {step.memory_gb:.1f} GiB, a CPU "
                          f"node has {nodes.cores} cores and {nodes.memory_gb:g} GiB ({nodes.describe()})")


def _wall(step: StepPlan, nodes: CpuNodes) -> float:
    cores = min(nodes.count * _slots(step, nodes), step.tasks) * step.cpus
    return step.core_hours / max(cores, 1)


def format_data_plan(plan: DataPlan) -> str:
    """The plan as the dry-run prints it: a table, totals, and where each throughput comes from."""
    lines = [f"data plan at full size, on {plan.nodes.describe()} (steps/data/budget.py):",
             f"  {'step':<26} {'tasks':>9} {'task':>14} {'core-hours':>11} {'read':>9} {'written':>9} {'wall':>9}"]
    for s in plan.steps:
        lines.append(f"  {s.name:<26} {s.tasks:>9,} {s.cpus:>3} cpu {s.memory_gb:>5.2f} GiB {s.core_hours:>11,.0f} "
                     f"{_size(s.read_bytes):>9} {_size(s.written_bytes):>9} {_hours(s.wall_hours):>9}")
        if s.detail:
            lines.append(f"  {'':<26} {s.detail}")
    total = sum(s.core_hours for s in plan.steps)
    lines.append(f"  {'all':<26} {sum(s.tasks for s in plan.steps):>9,} {'':>14} {total:>11,.0f}"
                 f" {_size(sum(s.read_bytes for s in plan.steps)):>9} "
                 f"{_size(sum(s.written_bytes for s in plan.steps)):>9} {_hours(sum(s.wall_hours for s in plan.steps)):>9}"
                 " (steps one after another)")
    lines.append(f"  from: {TOKENS_PER_DOC:,} tokens a document, {BYTES_PER_TOKEN} bytes a token, "
                 f"{DOCS_PER_SHARD:,} documents a shard, zstd {ZSTD_RATIO.value:g}x ({ZSTD_RATIO.command}); per core:")
    for name, r in RATES.items():
        lines.append(f"    {name:<14} {_rate(r.value)} {r.unit}, {r.basis}  ({r.command})")
    sizes = ", ".join(f"{n:,.0f} n-grams {v / 1e6:.2f} MB/s" for n, v in DECONTAM_RATES)
    lines.append(f"    decontaminate by eval-side size, measured at {sizes}  ({DECONTAM_BENCH})")
    lines.append("  " + rates_known(plan))
    return "\n".join(lines)


def rates_known(plan: DataPlan) -> str:
    """One line: which of the plan's rates are measured under Ray, which in one process only, and
    which are extrapolated (the decontam rate past its largest measured eval side)."""
    ray = [n for n, r in RATES.items() if r.basis == UNDER_RAY]
    one = [n for n, r in RATES.items() if r.basis == ONE_PROCESS]
    how = {s.name: s.detail.rpartition(", ")[2] for s in plan.steps if s.rate == "decontaminate"}
    far = sorted(n for n, h in how.items() if h.startswith("extrapolated"))
    near = sorted(n for n, h in how.items() if not h.startswith("extrapolated"))
    parts = [f"measured under Ray: {', '.join(ray) or 'none'}", f"measured in one process only: {', '.join(one) or 'none'}"]
    if far:
        parts.append(f"extrapolated: decontaminate in {', '.join(far)} (an eval side past the largest measured)")
    if near:
        parts.append(f"decontaminate measured or interpolated in {', '.join(near)}")
    return "rates: " + "; ".join(parts)


def _size(n: float) -> str:
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB"


def _hours(h: float) -> str:
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def _rate(v: float) -> str:
    return f"{v / 1e6:,.2f}M" if v >= 1e6 else f"{v:,.0f}"
