"""dedup: exact (content hash) and fuzzy (MinHash LSH) deduplication across all shards of one or
several sources, in passes of Ray tasks whose memory depends on their own slice of the work, never
on the corpus (docs/data.md "dedup" has each pass's files):

1. per task of `shards_per_task` input shards: a 128-bit content hash (blake2b) and a MinHash
   signature over word n-grams per document, written as the task's sorted runs
   (`steps.dedup.runs`): the content hashes, and one section per LSH band, each sorted by
   key, with what verifying a pair needs carried beside each key (the second half of the hash;
   the whole signature when `verify_threshold` is set);
2. per (section, key range) (`steps.dedup.pairs`): the runs of every pass-1 task merged as a
   stream, one range each; pairs within each bucket, verified there (estimated Jaccard >= the threshold);
   `keys_per_task` records of a section make one range, so a task's memory is its range's;
3. connected components of the verified pairs only (`steps.dedup.components`): large-star /
   small-star rounds over `pairs_per_task`-sized hash partitions; the keeper of every cluster is
   its smallest global id, so the result does not depend on the order of work; the removed ids,
   with their keepers, sorted into one drop file per group of shards;
4. per shard: the kept documents streamed to `documents/IIIII.jsonl.zst`.

Documents are identified by a global id `shard << 32 | position`, shards numbered across the
sources in the order of their names (so the keeper of a cluster spanning sources is in the source
first by name). One source (`documents` a folder or glob) gives a documents folder like ingest's;
several (`documents` a dict {source: folder}) give one documents folder per source, `SOURCE/`, each
with its own manifest and licences, and a root manifest listing them all. Beside them:
`report.json` (counts, cluster sizes, removals per pair of sources, example pairs with their
estimated Jaccard), `sources.json` (each source's first global shard), and `duplicates.npy`,
uint64 [removed, 2]: every removed document's global id and its keeper's, sorted.
"""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from executor import AtomicFile, InputPath, Resources, StepContext, VoyageError, run_only, step_type
from steps.dedup.components import components, load
from steps.dedup.pairs import EXACT, PairJob, pair_task, pair_task_bytes
from steps.dedup.runs import CHUNK, MIN_CHUNK, key_ranges, record_dtype, sort_section, write_run
from steps.data.formats import DOCS_FORMAT, MANIFEST, DocumentWriter, document_shards, iter_documents, \
    iter_text_batches, join, read_json, write_json
from steps.data.memory import GiB, WORKER_GB, checked
from steps.dedup.minhash import MinHasher, band_keys
from steps.data.provenance import LICENSES_KEY, folder_licenses, note_sources, to_manifest, union
from steps.data.paths import ref

SNIPPET = 300
BASE_MEMORY = WORKER_GB  # GiB a task's worker holds before it does anything (Python, numpy, fsspec)
PASS1_SCRATCH_GB = 0.1  # pass 1 beside its run: a batch's shingle hashing, the reader's and the writer's buffers
TASK_SCRATCH_GB = 0.05  # a pass-2 or pass-3 task beside what its budget holds
MIN_RUN_DOCS = 1024  # the fewest documents of a pass-1 run, whatever the budget
# a pass-3 task, per edge entry it receives: the edges both ways, sorted, their copies (a star of
# a million edges received once measured 94 B an entry; received four times over, 44)
PASS3_BYTES_PER_ENTRY = 16 * 8


@dataclass(frozen=True)
class DedupConfig:
    """Which duplicates to remove, across which sources, and how fuzzy matching is tuned."""

    # a documents folder (ingest output) or a glob of shards; or {source: folder} to deduplicate
    # several sources together in one id space (each keeps its own documents folder and licences)
    documents: InputPath | dict[str, InputPath]
    exact: bool = True
    fuzzy: bool = True
    ngram: int = 5
    # 28 bands x 4 rows (the same 112 permutations as the 14 x 8 of the issue) with a check of
    # each candidate pair's estimated Jaccard: 14 x 8 can find at most ~92% of isolated pairs at
    # J = 0.8 by its banding curve; 28 x 4 finds ~100% and the check drops the J 0.5-0.6 pairs it
    # also catches (bench/data_dedup_quality.py; docs/design.md).
    bands: int = 28
    rows: int = 4
    seed: int = 0
    verify_threshold: float | None = 0.7  # keep a fuzzy pair only if its estimated Jaccard is >= this
    examples: int = 8  # example pairs in the report
    # documents hashed at once: 64 is as fast as 512 and needs a sixth of the scratch (17 vs 106 MiB
    # of tracemalloc peak on the bundled corpus: bench/data_dedup_peer.py)
    batch_docs: int = run_only(default=64)
    shards_per_task: int = run_only(default=1)
    # The task budget: records of one section a pass-2 task merges (its memory, with the records'
    # size), and duplicate edges of one pass-3 partition. They change the number of tasks, never
    # the result.
    keys_per_task: int = run_only(default=1 << 20)
    pairs_per_task: int = run_only(default=1 << 22)
    task_memory_gb: float = run_only(default=1.0)  # declared to Ray by each pass-1 and pass-4 task

    def __post_init__(self) -> None:
        if self.bands < 1 or self.rows < 1 or self.ngram < 1:
            raise VoyageError(f"dedup: bands, rows and ngram must be >= 1 (got {self.bands}, {self.rows}, {self.ngram})")
        if self.verify_threshold is not None and not 0.0 < self.verify_threshold <= 1.0:
            raise VoyageError(f"dedup: verify_threshold must be in (0, 1], got {self.verify_threshold}")
        if self.keys_per_task < 1 or self.pairs_per_task < 1:
            raise VoyageError(f"dedup: keys_per_task and pairs_per_task must be >= 1 (got {self.keys_per_task}, "
                              f"{self.pairs_per_task})")
        if isinstance(self.documents, Mapping):
            if not self.documents:
                raise VoyageError("dedup: documents is an empty dict: name at least one source")
            for name in self.documents:
                if not isinstance(name, str) or not name or name.startswith((".", "_")) or "/" in name:
                    raise VoyageError(f"dedup: documents[{name!r}]: a source name is one folder name "
                                      "(not empty, no '/', not starting with '.' or '_')")

    def sources(self) -> list[tuple[str, Any]]:
        """(source name, documents) in id order: by name; one unnamed source for a plain folder."""
        if isinstance(self.documents, Mapping):
            return sorted(self.documents.items())
        return [("", self.documents)]


@dataclass(frozen=True)
class _Job:
    output: str
    shards: tuple[tuple[int, str], ...]  # (global shard index, URL)
    config: DedupConfig
    sources: tuple[str, ...] = ()  # pass 4: how each shard's ledger names its input (steps.data.paths)
    where: tuple[tuple[str, int], ...] = ()  # pass 4: (source name, shard index in the source) per shard
    firsts: tuple[tuple[str, int], ...] = ()  # pass 4: (source, its first global shard), in id order
    drop: str = ""  # pass 4: the drop file of the shards' group
    want: tuple[tuple[int, ...], ...] = ()  # pass 4: positions whose snippets the report shows, per shard


def _by_source(config: DedupConfig) -> dict[str, Any]:
    """Each source's folder holds that source's documents alone: a step reading `SOURCE/` is
    reached by that source's licence only (executor.lineage); the root (report, duplicates) by all."""
    return dict(config.documents) if isinstance(config.documents, Mapping) else {}


@step_type(version="3", resumable=True, partitions=_by_source)
def dedup(config: DedupConfig, ctx: StepContext) -> None:
    """Remove exact and near duplicates across all shards of all sources; keep the smallest id of
    each cluster."""
    shards, where, firsts = _inputs(config)
    names = tuple(f"{i:05d}" for i in range(len(shards)))
    per = max(1, config.shards_per_task)
    small = Resources(cpus=1, memory_gb=config.task_memory_gb)

    # pass 1: sorted runs per shard
    runs = _runs_done(ctx)
    covered = {i for r in runs for i in r["shards"]}
    todo = [(i, u) for i, u in enumerate(shards) if i not in covered]
    runs += ctx.map(checked(_signatures, ctx.name, "pass 1", small.memory_gb),
                    [_Job(ctx.output, tuple(todo[k:k + per]), config) for k in range(0, len(todo), per)],
                    resources=small)
    runs.sort(key=lambda r: r["shards"][0])

    # pass 2: pairs per (section, key range)
    results = _pairs(config, ctx, runs)

    # pass 3: connected components over the pairs
    if not ctx.exists("work/s3.json"):
        _components(config, ctx, len(shards), results)
    s3 = read_json(ctx.path("work/s3.json"))

    # pass 4: the kept documents, shard by shard
    spg = int(s3["shards_per_group"])
    want = collections.defaultdict(set)
    for p in s3["examples"]:
        for g in (p["first"], p["second"]):
            want[g >> 32].add(g & 0xFFFFFFFF)
    todo = [(i, u) for i, u in enumerate(shards) if not ctx.exists(f"ledger/{names[i]}.json")]
    ledger = ctx.path("ledger")
    jobs = []
    for k in range(0, len(todo), per):
        for g in sorted({i // spg for i, _ in todo[k:k + per]}):  # one drop file a task
            part = tuple((i, u) for i, u in todo[k:k + per] if i // spg == g)
            jobs.append(_Job(ctx.output, part, config, tuple(ref(ctx, u, ledger) for _, u in part),
                             tuple(where[i] for i, _ in part), tuple(firsts), ctx.path(f"work/drop/{g:05d}.npy"),
                             tuple(tuple(sorted(want.get(i, ()))) for i, _ in part)))
    ctx.map(checked(_write_kept, ctx.name, "pass 4", small.memory_gb), jobs, resources=small)
    _finish(config, ctx, names, where, s3)


def _inputs(config: DedupConfig) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """Every input shard in id order, (source, index in the source) of each, and each source's
    first global shard."""
    shards: list[str] = []
    where: list[tuple[str, int]] = []
    firsts: list[tuple[str, int]] = []
    for name, spec in config.sources():
        found = document_shards(spec)
        if not found:
            raise FileNotFoundError(f"dedup: no document shards in {spec!r}" + (f" (source {name})" if name else ""))
        firsts.append((name, len(shards)))
        where += [(name, k) for k in range(len(found))]
        shards += found
    if len(shards) >= 2**32:
        raise VoyageError(f"dedup: {len(shards)} shards; global ids hold at most 2^32")
    return shards, where, firsts


def _checked_map(ctx: StepContext, part: str):
    """`ctx.map` whose tasks each check their memory against what they declare."""
    def mapper(fn, items, resources=None):
        return ctx.map(checked(fn, ctx.name, part, resources.memory_gb if resources else None), items, resources)
    return mapper


def _gb(nbytes: float) -> float:
    """A task's declaration: the worker, a task's fixed scratch (numpy temporaries, a file read,
    its result), and what its budget lets it hold."""
    return round(BASE_MEMORY + TASK_SCRATCH_GB + nbytes / 2**30, 3)


# -- pass 1: sorted runs per task -------------------------------------------------------------

def pass1_bytes_per_doc(cfg: DedupConfig) -> int:
    """What pass 1 holds a document of its run at its peak: the accumulated band keys, signature,
    content hash and id (twice while they are joined), or once with one section being sorted (the
    record, its sort order, the key column and the gathered signature)."""
    width = cfg.bands * cfg.rows if cfg.fuzzy and cfg.verify_threshold is not None else 0
    held = (cfg.bands * 8 if cfg.fuzzy else 0) + width * 4 + 16 + 8
    section = record_dtype(max(2, width)).itemsize + 8 + 8 + width * 4 + 16
    return max(2 * held, held + section)


def run_docs(cfg: DedupConfig) -> int:
    """Documents in one pass-1 run, so that the task stays within `task_memory_gb`: a shard (or a
    task's shards) holding more becomes several runs, which pass 2 merges like any other."""
    room = (cfg.task_memory_gb - BASE_MEMORY - PASS1_SCRATCH_GB) * GiB
    return max(MIN_RUN_DOCS, int(room // pass1_bytes_per_doc(cfg)))


def _signatures(job: _Job) -> dict:
    """The task's shards as sorted runs of `run_docs` documents each (up to a batch more; pass 2 merges one
    run per pass-1 task when its shards fit one, as many as the operator chose, not one per
    shard), then its marker `work/s1/FIRST.json` naming them."""
    cfg = job.config
    hasher = MinHasher(num_perm=cfg.bands * cfg.rows, ngram=cfg.ngram, seed=cfg.seed)
    limit = run_docs(cfg)
    name = f"{job.shards[0][0]:05d}"
    acc: dict[str, list[np.ndarray]] = {"hashes": [], "keys": [], "sigs": [], "gids": []}
    runs: list[list] = []
    held = 0
    counts = []

    def flush() -> None:
        nonlocal held
        run = name if not runs else f"{name}-{len(runs):04d}"
        _write_runs(join(job.output, f"work/runs/{run}"), cfg, acc, held)
        runs.append([run, held])
        for v in acc.values():
            v.clear()
        held = 0

    for index, url in job.shards:
        n = 0
        for texts in iter_text_batches(url, cfg.batch_docs):
            gid = (np.uint64(index) << np.uint64(32)) | np.arange(n, n + len(texts), dtype=np.uint64)
            acc["gids"].append(gid)
            acc["hashes"].append(np.frombuffer(b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"),
                                                                        digest_size=16).digest() for t in texts),
                                               dtype=np.uint64).reshape(-1, 2))
            if cfg.fuzzy:
                sig, has = hasher.signatures(texts)
                k = band_keys(sig, cfg.bands, cfg.rows)
                k[~has] = ~gid[~has, None]  # no shingles: a key of its own, never shared
                acc["keys"].append(k)
                if cfg.verify_threshold is not None:
                    acc["sigs"].append(sig)
            n += len(texts)
            held += len(texts)
            if held >= limit:
                flush()
        if n >= 2**32:
            raise VoyageError(f"dedup: {url} holds {n} documents; a shard holds at most 2^32")
        counts.append(n)
    if held or not runs:
        flush()
    marker = {"run": name, "shards": [i for i, _ in job.shards], "documents": counts, "runs": runs}
    write_json(join(job.output, f"work/s1/{name}.json"), marker)
    return marker


def _write_runs(base: str, cfg: DedupConfig, acc: dict[str, list[np.ndarray]], n: int) -> None:
    """One run's files (`.exact`, `.bands`) from the accumulated arrays (emptied as they are joined)."""
    gid = _take(acc["gids"], (0,), np.uint64)
    h = _take(acc["hashes"], (0, 2), np.uint64)
    if cfg.exact:
        write_run(base + ".exact", [sort_section(h[:, 0].copy(), gid, h[:, 1].copy().view(np.uint32).reshape(-1, 2))])
    del h
    if cfg.fuzzy:
        k = _take(acc["keys"], (0, cfg.bands), np.uint64)
        sig = _take(acc["sigs"], (0, cfg.bands * cfg.rows), np.uint32) if acc["sigs"] else np.zeros((n, 0), np.uint32)
        write_run(base + ".bands", (sort_section(k[:, b].copy(), gid, sig) for b in range(cfg.bands)))


def _take(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The parts joined, the list emptied (so the parts are freed as soon as the join is done)."""
    out = _cat(parts, empty_shape, dtype)
    parts.clear()
    return out


def _cat(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype)


# -- pass 2: pairs per (section, key range) ---------------------------------------------------

def _runs_done(ctx: StepContext) -> list[dict]:
    """The markers of the runs pass 1 finished (one listing of their folder)."""
    try:
        found = ctx.fs.ls(ctx.fs_path("work/s1"), detail=False)
    except FileNotFoundError:
        return []
    return [json.loads(ctx.fs.cat_file(f)) for f in sorted(found) if f.endswith(".json")]


def _pairs(config: DedupConfig, ctx: StepContext, runs_done: list[dict]) -> list[dict]:
    """Run the pass-2 tasks not yet done; the counts of every (section, range), in order."""
    sections = ([EXACT] if config.exact else []) + (list(range(config.bands)) if config.fuzzy else [])
    # every run of every pass-1 task (a marker without `runs` is one run, as pass 1 wrote before)
    found = [(n, c) for r in runs_done for n, c in r.get("runs", [[r["run"], sum(r["documents"])]])]
    names = [n for n, _ in found]
    counts = [c for _, c in found]
    ranges = key_ranges(max(1, -(-sum(counts) // config.keys_per_task)))
    width = config.bands * config.rows if config.verify_threshold is not None else 0
    # The task's budget of records is shared by its readers: each reads its run's part of the
    # range in pieces of at most CHUNK records and of budget / runs (at least MIN_CHUNK), so the
    # task holds at most its budget whatever the number of runs, and no more than a few chunks
    # when the runs are few (flat from a thousand documents to a million).
    chunk = min(CHUNK, max(MIN_CHUNK, config.keys_per_task // max(1, len(names))))
    jobs, done = [], {}
    for s in sections:
        run = "exact" if s == EXACT else "bands"
        runs = tuple((ctx.path(f"work/runs/{n}.{run}"), c) for n, c in zip(names, counts))
        for r, (lo, hi) in enumerate(ranges):
            job = PairJob(ctx.output, s, r, lo, hi, runs, 2 if s == EXACT else width,
                          None if s == EXACT else config.verify_threshold, config.examples, chunk, len(ranges))
            if ctx.exists(f"work/pairs/{len(ranges)}/{s}/{r:05d}.json"):
                done[(s, r)] = read_json(job.name + ".json")
            else:
                jobs.append(job)
    mem = Resources(cpus=1, memory_gb=pass2_gb(config, len(names)))
    for job, res in zip(jobs, ctx.map(checked(pair_task, ctx.name, "pass 2", mem.memory_gb), jobs, resources=mem)):
        done[(job.section, job.index)] = res
    out = []
    for s in sections:
        for r in range(len(ranges)):
            res = done[(s, r)]
            stem = f"work/pairs/{len(ranges)}/{s}/{r:05d}"
            parts = res.get("parts")  # before parts: one file of all the range's pairs
            files = [[f"{stem}.{p:04d}.npy", n] for p, n in enumerate(parts)] if parts is not None else \
                [[f"{stem}.npy", res["pairs"]]]
            out.append(dict(res, section=s, index=r, files=files))
    return out


def pass2_gb(config: DedupConfig, runs: int) -> float:
    """What a pass-2 task declares: a chunk of each of `runs` runs, a block of a bucket, a part
    of pairs (`steps.dedup.pairs.pair_task_bytes`)."""
    width = config.bands * config.rows if config.verify_threshold is not None else 0
    chunk = min(CHUNK, max(MIN_CHUNK, config.keys_per_task // max(1, runs)))
    return _gb(pair_task_bytes(runs, chunk, width))


# -- pass 3: connected components -------------------------------------------------------------

def _components(config: DedupConfig, ctx: StepContext, shards: int, results: list[dict]) -> None:
    if ctx.exists("work/cc"):  # a crashed attempt's rounds: start them again
        ctx.fs.rm(ctx.fs_path("work/cc"), recursive=True)
    files = [(ctx.path(f), n) for r in results for f, n in r["files"]]
    total = sum(r["pairs"] for r in results)
    parts = max(1, -(-total // config.pairs_per_task))
    spg = max(1, -(-shards // parts))  # shards per drop file: as many files as partitions
    mem = Resources(cpus=1, memory_gb=_gb(config.pairs_per_task * PASS3_BYTES_PER_ENTRY))
    # a partition receiving more than pairs_per_task entries (the star of a cluster of millions: a
    # boilerplate document) declares what it receives, at the same bytes an entry
    cc = components(_checked_map(ctx, "pass 3"), ctx.path("work/cc"), ctx.path("work/drop"), files, parts, shards,
                    spg, mem, memory_of=lambda entries: _gb(entries * PASS3_BYTES_PER_ENTRY))
    exact_removed = sum(r["exact_removed"] for r in results if r["section"] == EXACT)
    fuzzy = [r for r in results if r["section"] != EXACT]
    examples = sorted({tuple(e) for r in fuzzy for e in r["examples"]}, key=lambda e: (e[0], e[1]))
    seen, picked = set(), []
    for a, b, est in examples:
        if (a, b) not in seen and len(picked) < config.examples:
            seen.add((a, b))
            picked.append({"first": int(a), "second": int(b), "estimated_jaccard": est})
    hist = {int(k): v for k, v in cc["hist"].items()}
    report = {"exact_duplicates_removed": exact_removed, "fuzzy_duplicates_removed": cc["removed"] - exact_removed,
              "clusters": sum(hist.values()), "largest_cluster": max(hist) if hist else 0,
              "cluster_sizes": {str(k): v for k, v in sorted(hist.items())},
              # summed over bands: a pair found in several bands counts once in each
              "fuzzy_candidate_pairs": sum(r["candidates"] for r in fuzzy),
              "fuzzy_pairs_verified": sum(r.get("verified", r["pairs"]) for r in fuzzy),
              "fuzzy_pairs_written": sum(r["pairs"] for r in fuzzy),
              "exact_pairs": sum(r["pairs"] for r in results if r["section"] == EXACT),
              "duplicate_edges": cc["edges"], "component_rounds": cc["rounds"],
              "pass2_tasks": len(results), "pass3_partitions": parts,
              "bands": config.bands, "rows": config.rows, "ngram": config.ngram,
              "verify_threshold": config.verify_threshold}
    write_json(ctx.path("work/s3.json"), {"report": report, "examples": picked, "shards_per_group": spg,
                                          "groups": cc["groups"]})


def connected_components(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, keeper): every id in `pairs` (sorted) and the smallest id of its component, in one
    process (min-label propagation with pointer jumping): the reference the distributed pass 3
    must agree with, and a tool for small pair lists."""
    if len(pairs) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    nodes = np.unique(pairs)
    u = np.searchsorted(nodes, pairs[:, 0])
    v = np.searchsorted(nodes, pairs[:, 1])
    label = np.arange(nodes.size)
    while True:
        m = np.minimum(label[u], label[v])
        new = label.copy()
        np.minimum.at(new, u, m)
        np.minimum.at(new, v, m)
        while True:  # pointer jumping: every node points at its root's label
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            return nodes, nodes[label]
        label = new


# -- pass 4: write the kept documents ---------------------------------------------------------

def _source_at(firsts: tuple[tuple[str, int], ...], shard: int) -> str:
    name = firsts[0][0]
    for n, first in firsts:
        if first <= shard:
            name = n
    return name


def _write_kept(job: _Job) -> int:
    group = load(job.drop)  # (removed, keeper), sorted by removed id: this group's shards only
    for (index, url), source, (src, local), want in zip(job.shards, job.sources, job.where, job.want):
        lo, hi = np.searchsorted(group[:, 0], [np.uint64(index) << np.uint64(32), np.uint64(index + 1) << np.uint64(32)])
        drop = (group[lo:hi, 0] & np.uint64(0xFFFFFFFF)).astype(np.int64)
        by_keeper = collections.Counter(_source_at(job.firsts, int(s)) for s in (group[lo:hi, 1] >> np.uint64(32)).tolist())
        wanted = set(want)
        snippets: dict[str, Any] = {}
        k = kept = 0
        with DocumentWriter(join(job.output, _shard_path(src, local))) as writer:
            for pos, doc in enumerate(iter_documents(url)):
                if pos in wanted:
                    snippets[str((index << 32) | pos)] = {"id": doc.get("id"), "text": doc["text"][:SNIPPET]}
                if k < drop.size and drop[k] == pos:
                    k += 1
                    continue
                writer.write(doc)
                kept += 1
        write_json(join(job.output, f"ledger/{index:05d}.json"),
                   {"kept": kept, "removed": int(drop.size), "snippets": snippets, "source": source,
                    "dedup_source": src, "removed_by_keeper_source": dict(sorted(by_keeper.items()))})
    return len(job.shards)


def _shard_path(source: str, local: int) -> str:
    return f"{source}/documents/{local:05d}.jsonl.zst" if source else f"documents/{local:05d}.jsonl.zst"


# -- the outputs ------------------------------------------------------------------------------

def _finish(config: DedupConfig, ctx: StepContext, names: tuple[str, ...], where: list[tuple[str, int]],
            s3: dict[str, Any]) -> None:
    per_source: dict[str, dict[str, Any]] = {name: {"shards": [], "kept": 0, "in": 0} for name, _ in config.sources()}
    snippets: dict[str, Any] = {}
    pairs: collections.Counter = collections.Counter()
    for name, (src, local) in zip(names, where):
        ledger = read_json(ctx.path(f"ledger/{name}.json"))
        s = per_source[src]
        s["shards"].append({"path": _shard_path(src, local), "documents": ledger["kept"]})
        s["kept"] += ledger["kept"]
        s["in"] += ledger["kept"] + ledger["removed"]
        snippets.update(ledger["snippets"])
        for keeper, n in ledger["removed_by_keeper_source"].items():
            pairs[(src, keeper)] += n
    kept = sum(s["kept"] for s in per_source.values())
    total = sum(s["in"] for s in per_source.values())
    report = dict(s3["report"], documents_in=total, documents_kept=kept, removed=total - kept)
    report["example_pairs"] = [dict(p, first=snippets.get(str(p["first"])), second=snippets.get(str(p["second"])))
                               for p in s3["examples"]]
    multi = isinstance(config.documents, Mapping)
    if multi:
        report["by_source"] = {n: {"documents_in": s["in"], "documents_kept": s["kept"]} for n, s in per_source.items()}
        # removals per pair of sources: "A <- B" counts documents of A removed for a keeper in B
        report["removed_by_pair"] = {f"{a} <- {b}": n for (a, b), n in sorted(pairs.items())}
    write_json(ctx.path("report.json"), report)
    _write_duplicates(ctx, int(s3["groups"]))

    licenses: dict[str, Any] = {}
    firsts, first = [], 0
    for name, spec in config.sources():
        lic = folder_licenses(spec)  # the kept documents are under their sources' licences
        licenses = union(licenses, lic)
        s = per_source[name]
        firsts.append({"name": name, "first_shard": first, "shards": len(s["shards"]),
                       "documents_in": s["in"], "documents_kept": s["kept"]})
        first += len(s["shards"])
        if multi:  # each source's own folder: its documents, its licences only
            write_json(ctx.path(name, MANIFEST), {
                "format": DOCS_FORMAT, "documents": s["kept"], LICENSES_KEY: to_manifest(lic),
                "shards": [dict(sh, path=sh["path"][len(name) + 1:]) for sh in s["shards"]]})
    note_sources(ctx, licenses)
    write_json(ctx.path("sources.json"), {"sources": firsts})
    write_json(ctx.path(MANIFEST), {"format": DOCS_FORMAT, "documents": kept,
                                    "shards": [sh for s in per_source.values() for sh in s["shards"]],
                                    LICENSES_KEY: to_manifest(licenses)})
    ctx.fs.rm(ctx.fs_path("work"), recursive=True)
    ctx.results.update({k: v for k, v in report.items() if k not in ("example_pairs", "cluster_sizes", "by_source")})


def _write_duplicates(ctx: StepContext, groups: int) -> None:
    """`duplicates.npy`: the groups' drop files end to end (each sorted, the groups in shard
    order, so the whole is sorted), streamed: one group in memory at a time."""
    sizes = []
    for g in range(groups):
        fs, path = ctx.fs, ctx.fs_path(f"work/drop/{g:05d}.npy")
        with fs.open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, _ = read(f)
        sizes.append(shape[0])
    with AtomicFile(ctx.path("duplicates.npy")) as out:
        np.lib.format.write_array_header_1_0(out, {"descr": "<u8", "fortran_order": False, "shape": (sum(sizes), 2)})
        for g in range(groups):
            out.write(np.ascontiguousarray(load(ctx.path(f"work/drop/{g:05d}.npy")).astype("<u8")).tobytes())
