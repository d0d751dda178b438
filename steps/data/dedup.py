"""dedup: exact (content hash) and fuzzy (MinHash LSH) deduplication across all shards.

Four passes, each resumable from its own markers (the step type is resumable):
1. per input shard (one task per `shards_per_task` shards): a 128-bit content hash (blake2b) per
   document, MinHash signatures over word n-grams and one LSH key per band, saved under `work/`;
2. per band, and once for the content hashes (one task each): the keys of every shard sorted
   together; documents sharing a key become candidate pairs (each with the first of its bucket,
   and, when verifying, with its predecessor too);
3. in the step's own process: fuzzy candidates are optionally verified (their signatures must
   agree on at least `verify_threshold` of the permutations), then connected components over
   all pairs (vectorized union-find: min-label propagation with pointer jumping). The keeper of
   every cluster is its smallest global id (shard index, then position), so the result does not
   depend on the order of work;
4. per shard: the kept documents are streamed to `documents/IIIII.jsonl.zst`.

Documents are identified by a global id `shard << 32 | position`. Memory per task is bounded by
one shard (pass 1, 4) or 32 bytes per document (pass 2); pass 3 holds the candidate pairs.
The output is a documents folder like ingest's (a manifest lists the shards) plus `report.json`:
counts, cluster sizes, and example pairs with their estimated Jaccard similarity; and
`duplicates.npy`, uint64 [removed, 2]: every removed document's global id and its keeper's.
"""

from __future__ import annotations

import collections
import hashlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor import InputPath, StepContext, VoyageError, is_local, run_only, step_type
from steps.data.formats import DOCS_FORMAT, MANIFEST, DocumentWriter, document_shards, iter_documents, \
    iter_text_batches, join, read_json, url_fs, write_bytes, write_json
from steps.data.minhash import MinHasher, band_keys
from steps.data.provenance import LICENSES_KEY, folder_licenses, note_sources, to_manifest
from steps.data.refs import ref

SNIPPET = 300


@dataclass(frozen=True)
class DedupConfig:
    """Which duplicates to remove and how fuzzy matching is tuned."""

    documents: InputPath  # a documents folder (ingest output) or a glob of shards
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
    batch_docs: int = run_only(default=512)
    shards_per_task: int = run_only(default=1)

    def __post_init__(self) -> None:
        if self.bands < 1 or self.rows < 1 or self.ngram < 1:
            raise VoyageError(f"dedup: bands, rows and ngram must be >= 1 (got {self.bands}, {self.rows}, {self.ngram})")
        if self.verify_threshold is not None and not 0.0 < self.verify_threshold <= 1.0:
            raise VoyageError(f"dedup: verify_threshold must be in (0, 1], got {self.verify_threshold}")


@dataclass(frozen=True)
class _Job:
    output: str
    shards: tuple[tuple[int, str], ...]
    config: DedupConfig
    sources: tuple[str, ...] = ()  # how each shard's ledger names it (steps.data.refs), pass 4


@dataclass(frozen=True)
class _BandJob:
    output: str
    band: int  # -1: the content hashes
    names: tuple[str, ...]
    verify: bool


@step_type(version="2", resumable=True)
def dedup(config: DedupConfig, ctx: StepContext) -> None:
    """Remove exact and near duplicates across all shards; keep the smallest id of each cluster."""
    inputs = document_shards(config.documents)
    if not inputs:
        raise FileNotFoundError(f"dedup: no document shards in {config.documents!r}")
    names = tuple(f"{i:05d}" for i in range(len(inputs)))
    per = max(1, config.shards_per_task)

    todo = [(i, u) for i, u in enumerate(inputs) if not ctx.exists(f"work/s1/{names[i]}.json")]
    ctx.map(_signatures, [_Job(ctx.output, tuple(todo[k:k + per]), config) for k in range(0, len(todo), per)])

    items = ([-1] if config.exact else []) + (list(range(config.bands)) if config.fuzzy else [])
    items = [b for b in items if not ctx.exists(f"work/pairs/{b}.npy")]
    verify = config.verify_threshold is not None
    ctx.map(_band_pairs, [_BandJob(ctx.output, b, names, verify) for b in items])

    if not ctx.exists("work/s3.json"):
        _components(config, ctx, names)
    s3 = read_json(ctx.path("work/s3.json"))

    todo = [(i, u) for i, u in enumerate(inputs) if not ctx.exists(f"ledger/{names[i]}.json")]
    ledger = ctx.path("ledger")
    ctx.map(_write_kept, [_Job(ctx.output, tuple(todo[k:k + per]), config,
                               tuple(ref(ctx, u, ledger) for _, u in todo[k:k + per]))
                          for k in range(0, len(todo), per)])

    shards, snippets, kept, total = [], {}, 0, 0
    for name in names:
        ledger = read_json(ctx.path(f"ledger/{name}.json"))
        shards.append({"path": f"documents/{name}.jsonl.zst", "documents": ledger["kept"]})
        snippets.update(ledger["snippets"])
        kept += ledger["kept"]
        total += ledger["kept"] + ledger["removed"]
    report = dict(s3["report"], documents_in=total, documents_kept=kept, removed=total - kept)
    report["example_pairs"] = [dict(p, first=snippets.get(str(p["first"])), second=snippets.get(str(p["second"])))
                               for p in s3["examples"]]
    write_json(ctx.path("report.json"), report)
    licenses = folder_licenses(config.documents)  # the kept documents are under their sources' licences
    note_sources(ctx, licenses)
    write_json(ctx.path(MANIFEST), {"format": DOCS_FORMAT, "documents": kept, "shards": shards,
                                    LICENSES_KEY: to_manifest(licenses)})
    ctx.fs.rm(ctx.fs_path("work"), recursive=True)
    ctx.results.update({k: v for k, v in report.items() if k != "example_pairs" and k != "cluster_sizes"})


# -- pass 1: hashes, signatures, band keys per shard ------------------------------------------

def _signatures(job: _Job) -> int:
    cfg = job.config
    hasher = MinHasher(num_perm=cfg.bands * cfg.rows, ngram=cfg.ngram, seed=cfg.seed)
    for index, url in job.shards:
        name = f"{index:05d}"
        hashes, keys, sigs = [], [], []
        n = 0
        for texts in iter_text_batches(url, cfg.batch_docs):
            hashes.append(np.frombuffer(b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16)
                                                 .digest() for t in texts), dtype=np.uint64).reshape(-1, 2))
            if cfg.fuzzy:
                sig, has = hasher.signatures(texts)
                k = band_keys(sig, cfg.bands, cfg.rows)
                gid = (np.uint64(index) << np.uint64(32)) | np.arange(n, n + len(texts), dtype=np.uint64)
                k[~has] = ~gid[~has, None]  # no shingles: a key of its own, never shared
                keys.append(k)
                if cfg.verify_threshold is not None:
                    sigs.append(sig)
            n += len(texts)
        _save(join(job.output, f"work/hash/{name}.npy"), _cat(hashes, (0, 2), np.uint64))
        if cfg.fuzzy:
            _save(join(job.output, f"work/keys/{name}.npy"), np.ascontiguousarray(_cat(keys, (0, cfg.bands), np.uint64).T))
        if sigs:
            _save(join(job.output, f"work/sig/{name}.npy"), np.concatenate(sigs))
        write_json(join(job.output, f"work/s1/{name}.json"), {"documents": n})
    return len(job.shards)


def _cat(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype)


def _save(url: str, arr: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, arr)
    write_bytes(url, buf.getvalue())


def _load(url: str, mmap: bool = True) -> np.ndarray:
    fs, path = url_fs(url)
    if mmap and is_local(fs):
        return np.load(path, mmap_mode="r")
    return np.load(io.BytesIO(fs.cat_file(path)))


# -- pass 2: candidate pairs per band ---------------------------------------------------------

def _band_pairs(job: _BandJob) -> int:
    keys, gids = [], []
    for i, name in enumerate(job.names):
        if job.band < 0:
            keys.append(np.asarray(_load(join(job.output, f"work/hash/{name}.npy"))))
        else:
            keys.append(np.asarray(_load(join(job.output, f"work/keys/{name}.npy"))[job.band]))
        gids.append((np.uint64(i) << np.uint64(32)) | np.arange(len(keys[-1]), dtype=np.uint64))
    key, gid = np.concatenate(keys), np.concatenate(gids)
    if job.band < 0:
        order = np.lexsort((key[:, 1], key[:, 0]))
        key = key[order]
        same = np.all(key[1:] == key[:-1], axis=1)
    else:
        order = np.argsort(key, kind="stable")
        key = key[order]
        same = key[1:] == key[:-1]
    gid = gid[order]
    pairs = _bucket_pairs(gid, same, chain=job.verify and job.band >= 0)
    _save(join(job.output, f"work/pairs/{job.band}.npy"), pairs)
    return int(pairs.shape[0])


def _bucket_pairs(gid: np.ndarray, same: np.ndarray, chain: bool) -> np.ndarray:
    """Pairs within runs of equal keys (`same[i]`: element i+1 has the key of element i): every
    member with the run's first member, and with its predecessor when `chain`."""
    if gid.size < 2:
        return np.zeros((0, 2), np.uint64)
    idx = np.arange(gid.size)
    new_run = np.concatenate([[True], ~same])
    first = np.maximum.accumulate(np.where(new_run, idx, 0))
    member = np.flatnonzero(~new_run)
    pairs = [np.stack([gid[first[member]], gid[member]], axis=1)]
    if chain:
        later = member[first[member] != member - 1]
        pairs.append(np.stack([gid[later - 1], gid[later]], axis=1))
    out = np.concatenate(pairs).astype(np.uint64)
    return np.sort(out, axis=1)


# -- pass 3: verification and connected components --------------------------------------------

def _components(config: DedupConfig, ctx: StepContext, names: tuple[str, ...]) -> None:
    exact = _load(ctx.path("work/pairs/-1.npy"), mmap=False) if config.exact else np.zeros((0, 2), np.uint64)
    fuzzy = [np.asarray(_load(ctx.path(f"work/pairs/{b}.npy"), mmap=False)) for b in range(config.bands)] \
        if config.fuzzy else []
    fuzzy = np.unique(np.concatenate(fuzzy), axis=0) if fuzzy else np.zeros((0, 2), np.uint64)
    candidates = len(fuzzy)
    estimate = None
    if len(fuzzy) and config.verify_threshold is not None:
        estimate = _estimate(ctx, fuzzy)
        ok = estimate >= config.verify_threshold
        fuzzy, estimate = fuzzy[ok], estimate[ok]

    nodes, keeper = connected_components(np.concatenate([exact, fuzzy]))
    x_nodes, x_keeper = connected_components(exact)
    removed = nodes[keeper != nodes]
    exact_removed = int(np.count_nonzero(x_keeper != x_nodes))
    sizes = np.bincount(np.searchsorted(nodes, keeper))
    sizes = sizes[sizes > 1]

    # examples: the first near-duplicate (not identical) pairs, by id
    exact_set = {tuple(p) for p in exact.tolist()}
    examples = []
    for k, (a, b) in enumerate(fuzzy.tolist()):
        if len(examples) >= config.examples:
            break
        if (a, b) in exact_set:
            continue
        est = float(estimate[k]) if estimate is not None else None
        examples.append({"first": int(a), "second": int(b), "estimated_jaccard": est})
    want = collections.defaultdict(list)
    for p in examples:
        for g in (p["first"], p["second"]):
            want[g >> 32].append(g & 0xFFFFFFFF)

    _save(ctx.path("duplicates.npy"), np.stack([removed, keeper[keeper != nodes]], axis=1))
    shard_of = (removed >> np.uint64(32)).astype(np.int64)
    for i, name in enumerate(names):
        _save(ctx.path(f"work/drop/{name}.npy"),
              np.sort((removed[shard_of == i] & np.uint64(0xFFFFFFFF)).astype(np.int64)))
        _save(ctx.path(f"work/want/{name}.npy"), np.array(sorted(set(want.get(i, []))), dtype=np.int64))
    hist = collections.Counter(sizes.tolist())
    report = {"exact_duplicates_removed": exact_removed, "fuzzy_duplicates_removed": int(removed.size) - exact_removed,
              "clusters": int(sizes.size), "largest_cluster": int(sizes.max()) if sizes.size else 0,
              "cluster_sizes": {str(k): v for k, v in sorted(hist.items())}, "fuzzy_candidate_pairs": candidates,
              "fuzzy_pairs_kept": int(len(fuzzy)), "exact_pairs": int(len(exact)),
              "bands": config.bands, "rows": config.rows, "ngram": config.ngram,
              "verify_threshold": config.verify_threshold}
    write_json(ctx.path("work/s3.json"), {"report": report, "examples": examples})


def _estimate(ctx: StepContext, pairs: np.ndarray) -> np.ndarray:
    """Estimated Jaccard of every pair, loading at most a few shards' signatures at a time."""
    sa, sb = (pairs[:, 0] >> np.uint64(32)).astype(np.int64), (pairs[:, 1] >> np.uint64(32)).astype(np.int64)
    la, lb = (pairs[:, 0] & np.uint64(0xFFFFFFFF)).astype(np.int64), (pairs[:, 1] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    order = np.lexsort((sb, sa))
    out = np.zeros(len(pairs))
    cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

    def sig(shard: int) -> np.ndarray:
        if shard not in cache:
            cache[shard] = _load(ctx.path(f"work/sig/{shard:05d}.npy"))
            while len(cache) > 4:
                cache.popitem(last=False)
        cache.move_to_end(shard)
        return cache[shard]

    bounds = np.flatnonzero(np.diff(sa[order]) | np.diff(sb[order])) + 1
    for group in np.split(order, bounds):
        a, b = int(sa[group[0]]), int(sb[group[0]])
        out[group] = (np.asarray(sig(a)[la[group]]) == np.asarray(sig(b)[lb[group]])).mean(axis=1)
    return out


def connected_components(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, keeper): every id in `pairs` (sorted) and the smallest id of its component."""
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

def _write_kept(job: _Job) -> int:
    for (index, url), source in zip(job.shards, job.sources):
        name = f"{index:05d}"
        drop = np.asarray(_load(join(job.output, f"work/drop/{name}.npy"), mmap=False))
        want = set(np.asarray(_load(join(job.output, f"work/want/{name}.npy"), mmap=False)).tolist())
        snippets: dict[str, Any] = {}
        k = kept = 0
        with DocumentWriter(join(job.output, f"documents/{name}.jsonl.zst")) as writer:
            for pos, doc in enumerate(iter_documents(url)):
                if pos in want:
                    snippets[str((index << 32) | pos)] = {"id": doc.get("id"), "text": doc["text"][:SNIPPET]}
                if k < drop.size and drop[k] == pos:
                    k += 1
                    continue
                writer.write(doc)
                kept += 1
        write_json(join(job.output, f"ledger/{name}.json"), {"kept": kept, "removed": int(drop.size),
                                                             "snippets": snippets, "source": source})
    return len(job.shards)
