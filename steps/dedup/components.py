"""Dedup pass 3: connected components of the duplicate pairs, over Ray tasks, by large-star and
small-star rounds (Kiveris et al., "Connected Components in MapReduce and Beyond", 2014).

The graph is only the documents that have a duplicate; its edges are hash-partitioned over `parts`
tasks by node (`part(u) = mix(u) % parts`), and every round is two maps:
- large-star: partition p receives every edge at both its ends (u -> v and v -> u); for each of
  its nodes u, with m the least of u and its neighbours, it links every neighbour v > u to m;
- small-star: partition p receives each edge (hi, lo) at its larger end; for each of its nodes
  u, with m the least of its smaller neighbours, it links u and every smaller neighbour to m.
Each map writes its edges, as (larger, smaller), into one file per destination partition:
`{work}/{round}{l|s}/{dst:04d}/{src:04d}.npy`. A map's tasks also return an order-free digest of
the edge set they received (each edge reaches exactly one task at its larger end, so the sum of
the tasks' digests is the set's); the rounds stop when a whole round leaves the set unchanged.
Then every component is a star around its smallest id, its keeper (the rule of the single-process
`connected_components`, so the result is the same).

A final map reads the last large-star input once more and writes each star's edges
(removed id, keeper) into one file per group of shards (`{work}/stars/{group:04d}/{part:04d}.npy`),
then one task per group sorts its pairs by removed id into `work/drop/{group:05d}.npy`. No task
holds more than its partition's edges (or its group's removed documents); the step's own process
holds only digests, a histogram and each map's counts of the entries it sent to each partition
(or group), from which the next map's tasks declare their memory: a partition that receives a
cluster's star of millions asks for what it receives (`components(memory_of=...)`).
"""

from __future__ import annotations

import collections
import dataclasses
import io
from dataclasses import dataclass
from typing import Callable

import numpy as np

from steps.data.formats import join, url_fs, write_bytes
from steps.dedup.minhash import _mix

U64 = np.uint64
MASK = (1 << 64) - 1


@dataclass(frozen=True)
class StarJob:
    """One partition of one map of the rounds."""

    work: str  # the folder of the rounds
    read: str  # the map's input folder (under work), or "" for the pair files in `files`
    write: str  # the output folder (under work)
    part: int
    parts: int
    kind: str  # "scatter", "large", "small" or "emit"
    files: tuple[str, ...] = ()  # scatter: the pair files this task spreads
    shards_per_group: int = 1  # emit: shards per group file


def save(url: str, arr: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, arr)
    write_bytes(url, buf.getvalue())


def load(url: str) -> np.ndarray:
    fs, path = url_fs(url)
    return np.load(io.BytesIO(fs.cat_file(path)))


def partition_of(nodes: np.ndarray, parts: int) -> np.ndarray:
    return (_mix(nodes.astype(U64)) % U64(parts)).astype(np.int64)


def digest(edges: np.ndarray) -> int:
    """An order-free digest of a set of (larger, smaller) edges (sum of mixed edges mod 2^64)."""
    if not len(edges):
        return 0
    h = _mix(_mix(edges[:, 0]) ^ edges[:, 1])
    return int(np.sum(h, dtype=U64))


def _read_part(job: StarJob) -> np.ndarray:
    """The partition's edges from every file sent to it, without repeats. The same edge comes
    from every band that found it (29 sections of a boilerplate bucket's pairs), so repeats are
    dropped as the files are read, whenever what is pending outgrows what is kept: the task holds
    its distinct edges and about as many again, not every copy."""
    fs, path = url_fs(join(job.work, job.read, f"{job.part:04d}"))
    try:
        names = sorted(fs.ls(path, detail=False))
    except FileNotFoundError:
        names = []
    kept = np.zeros((0, 2), U64)
    pending: list[np.ndarray] = []
    held = 0
    for n in names:
        if not n.endswith(".npy"):
            continue
        part = np.load(io.BytesIO(fs.cat_file(n))).astype(U64)
        if len(part):
            pending.append(part)
            held += len(part)
        if held > max(len(kept), 1 << 16):
            kept = np.unique(np.concatenate([kept] + pending), axis=0)
            pending, held = [], 0
    return np.concatenate([kept] + pending) if pending else kept


def _write_parts(job: StarJob, edges: np.ndarray, key: np.ndarray) -> dict[int, int]:
    """Edges to the partitions of `key`, one file per destination that gets any (a reader lists
    its folder; the map finished, so every file its tasks wrote is there); {destination: edges
    sent}, from which the next map's tasks are sized."""
    dest = partition_of(key, job.parts)
    order = np.argsort(dest, kind="stable")
    edges, dest = edges[order], dest[order]
    bounds = np.searchsorted(dest, np.arange(job.parts + 1))
    sent = {}
    for d in np.flatnonzero(np.diff(bounds)).tolist():
        save(join(job.work, job.write, f"{d:04d}", f"{job.part:04d}.npy"), edges[bounds[d]:bounds[d + 1]])
        sent[d] = int(bounds[d + 1] - bounds[d])
    return sent


def _both_ways(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(directed edges u -> v, both ways; their u) for large-star."""
    directed = np.concatenate([edges, edges[:, ::-1]])
    return directed, directed[:, 0]


def _groups(directed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort directed edges by source; (sorted edges, start of each source's run, its min neighbour)."""
    directed = directed[np.lexsort((directed[:, 1], directed[:, 0]))]
    starts = np.flatnonzero(np.concatenate([[True], directed[1:, 0] != directed[:-1, 0]]))
    mins = np.minimum.reduceat(directed[:, 1], starts) if len(directed) else np.zeros(0, U64)
    return directed, starts, mins


def star_task(job: StarJob) -> dict:
    """Run one partition of one map (see the module's doc); returns its digest and counts."""
    return _KINDS[job.kind](job)


def _scatter(job: StarJob) -> dict:
    parts = [load(f) for f in job.files]
    parts = [p for p in parts if len(p)]
    pairs = np.concatenate(parts).astype(U64) if parts else np.zeros((0, 2), U64)
    edges = _canonical(pairs)
    directed, src = _both_ways(edges)
    return {"edges": int(len(edges)), "sent": _write_parts(job, directed, src)}


def _canonical(pairs: np.ndarray) -> np.ndarray:
    """(larger, smaller) edges, without self-loops or repeats."""
    if not len(pairs):
        return np.zeros((0, 2), U64)
    hi, lo = np.maximum(pairs[:, 0], pairs[:, 1]), np.minimum(pairs[:, 0], pairs[:, 1])
    e = np.stack([hi, lo], axis=1)[hi != lo]
    return np.unique(e, axis=0) if len(e) else np.zeros((0, 2), U64)


def _large(job: StarJob) -> dict:
    directed = np.unique(_read_part(job), axis=0)
    # each undirected edge arrived twice, once at each end; count it at its larger end only
    mine = directed[directed[:, 0] > directed[:, 1]]
    info = {"digest": digest(mine), "edges": int(len(mine))}
    out = np.zeros((0, 2), U64)
    if len(directed):
        directed, starts, mins = _groups(directed)
        u = directed[:, 0]
        m = np.minimum(np.repeat(mins, np.diff(np.append(starts, len(directed)))), u)
        keep = directed[:, 1] > u
        out = np.stack([directed[keep, 1], m[keep]], axis=1)
    if job.kind == "emit":
        return dict(info, **_emit(job, directed if len(directed) else np.zeros((0, 2), U64)))
    out = _canonical(out)
    return dict(info, sent=_write_parts(job, out, out[:, 0]))  # small-star groups by the larger end


def _small(job: StarJob) -> dict:
    edges = np.unique(_read_part(job), axis=0)  # (larger, smaller), each at its larger end
    info = {"digest": digest(edges), "edges": int(len(edges))}
    out = np.zeros((0, 2), U64)
    if len(edges):
        edges, starts, mins = _groups(edges)
        m = np.repeat(mins, np.diff(np.append(starts, len(edges))))
        linked = np.stack([edges[:, 1], m], axis=1)  # each smaller neighbour to the least of them
        hubs = np.stack([edges[starts, 0], mins], axis=1)  # and the node itself
        out = _canonical(np.concatenate([linked, hubs]))
    directed, src = _both_ways(out)
    return dict(info, sent=_write_parts(job, directed, src))


def _emit(job: StarJob, directed: np.ndarray) -> dict:
    """At convergence: every star around a root u (u less than all its neighbours) is a cluster
    of |neighbours| + 1 whose keeper is u. Its (removed, keeper) pairs go to their shard groups."""
    hist: collections.Counter = collections.Counter()
    stars = np.zeros((0, 2), U64)
    if len(directed):
        starts = np.flatnonzero(np.concatenate([[True], directed[1:, 0] != directed[:-1, 0]]))
        sizes = np.diff(np.append(starts, len(directed)))
        src = directed[starts, 0]
        mins = np.minimum.reduceat(directed[:, 1], starts)
        root = mins > src
        hist.update((sizes[root] + 1).tolist())
        member = np.repeat(root, sizes)
        stars = np.stack([directed[member, 1], directed[member, 0]], axis=1)
    group = ((stars[:, 0] >> U64(32)) // U64(job.shards_per_group)).astype(np.int64) if len(stars) else \
        np.zeros(0, np.int64)
    order = np.argsort(group, kind="stable")
    stars, group = stars[order], group[order]
    sent = {}
    for g in np.unique(group).tolist():
        lo, hi = np.searchsorted(group, [g, g + 1])
        save(join(job.work, "stars", f"{g:05d}", f"{job.part:04d}.npy"), stars[lo:hi])
        sent[g] = int(hi - lo)
    return {"hist": {str(k): v for k, v in hist.items()}, "removed": int(len(stars)), "sent": sent}


_KINDS: dict[str, Callable[[StarJob], dict]] = {"scatter": _scatter, "large": _large, "small": _small,
                                                "emit": _large}


@dataclass(frozen=True)
class GroupJob:
    """Sort one shard group's (removed, keeper) pairs into its drop file."""

    work: str
    group: int
    out: str  # the drop file's URL


def group_task(job: GroupJob) -> int:
    """Gather a group's star files into one array sorted by removed id (uint64 [k, 2])."""
    fs, path = url_fs(join(job.work, "stars", f"{job.group:05d}"))
    try:
        names = sorted(n for n in fs.ls(path, detail=False) if n.endswith(".npy"))
    except FileNotFoundError:
        names = []
    parts = [np.load(io.BytesIO(fs.cat_file(n))) for n in names]
    pairs = np.concatenate(parts).astype(U64) if parts else np.zeros((0, 2), U64)
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")] if len(pairs) else pairs
    save(job.out, pairs)
    return int(len(pairs))


def _pack(pair_files: list[tuple[str, int]], parts: int) -> list[list[str]]:
    """The pair files (URL, pairs) in order, cut into scatter tasks of at most the pairs of a
    partition (or one file, if a file is larger), so that no scatter task holds more than its
    share whatever the pairs of one file (an empty list: one task of no files)."""
    total = sum(n for _, n in pair_files)
    limit = max(1, -(-total // parts))
    out: list[list[str]] = [[]]
    held = 0
    for url, n in pair_files:
        if out[-1] and held + n > limit:
            out.append([])
            held = 0
        out[-1].append(url)
        held += n
    return out


def _received(results: list[dict], count: int) -> list[int]:
    """What each of `count` destinations received from a map's tasks (their `sent`)."""
    got = [0] * count
    for r in results:
        for d, n in r.get("sent", {}).items():
            got[int(d)] += n
    return got


def _sized_map(mapper: Callable, fn: Callable, jobs: list, entries: list[int], resources, memory_of) -> list:
    """`mapper(fn, jobs, resources)`, each job declaring what `memory_of(its entries)` says when that
    is more than `resources` does (a partition holding a cluster's star, a group holding its removed
    documents): one call for the jobs within the common declaration, one for each larger figure."""
    if resources is None or memory_of is None or not resources.memory_gb:
        return mapper(fn, jobs, resources)
    by: dict[float, list[int]] = {}
    for i, n in enumerate(entries):
        by.setdefault(max(resources.memory_gb, memory_of(n)), []).append(i)
    out: list = [None] * len(jobs)
    for gb, idx in sorted(by.items()):
        for i, r in zip(idx, mapper(fn, [jobs[i] for i in idx], dataclasses.replace(resources, memory_gb=gb))):
            out[i] = r
    return out


def components(mapper: Callable, work: str, drop: str, pair_files: list[tuple[str, int]], parts: int, shards: int,
               shards_per_group: int, resources=None, max_rounds: int = 64, memory_of=None) -> dict:
    """Connected components of the pairs in `pair_files` ((URL, pairs) each), written as one drop file per group of
    `shards_per_group` shards (`{drop}/{group:05d}.npy`); returns {"groups", "hist", "removed",
    "rounds", "edges"}. `mapper` is `ctx.map`; `work` a scratch folder of the rounds. Every task
    declares `resources`, or, with `memory_of` (GiB for a task's input entries), more where its
    input is larger: each map's tasks are sized from what the map before sent to them."""
    parts = max(1, parts)
    # a scatter task makes two entries of a pair (both ways): it takes half a partition's share
    packed = _pack(pair_files, 2 * parts)
    sizes = dict(pair_files)
    scatter = [StarJob(work, "", "0l", p, parts, "scatter", tuple(files)) for p, files in enumerate(packed)]
    done = _sized_map(mapper, star_task, scatter, [2 * sum(sizes[f] for f in files) for files in packed], resources,
                      memory_of)
    edges = sum(r["edges"] for r in done)
    incoming = _received(done, parts)
    before = None
    rounds = 0
    while True:
        if rounds >= max_rounds:
            raise RuntimeError(f"dedup: connected components did not converge in {max_rounds} rounds")
        large = _sized_map(mapper, star_task, [StarJob(work, f"{rounds}l", f"{rounds}s", p, parts, "large")
                                               for p in range(parts)], incoming, resources, memory_of)
        d_large = sum(r["digest"] for r in large) & MASK
        small = _sized_map(mapper, star_task, [StarJob(work, f"{rounds}s", f"{rounds + 1}l", p, parts, "small")
                                               for p in range(parts)], _received(large, parts), resources, memory_of)
        d_small = sum(r["digest"] for r in small) & MASK
        incoming = _received(small, parts)
        rounds += 1
        if before is not None and before == d_large == d_small:
            break  # a whole round (this large-star and small-star) changed nothing
        before = d_small if d_large == d_small else None
    emitted = _sized_map(mapper, star_task, [StarJob(work, f"{rounds}l", "", p, parts, "emit",
                                                     shards_per_group=shards_per_group) for p in range(parts)],
                         incoming, resources, memory_of)
    hist: collections.Counter = collections.Counter()
    for r in emitted:
        hist.update({int(k): v for k, v in r["hist"].items()})
    groups = -(-shards // shards_per_group) if shards else 0
    _sized_map(mapper, group_task, [GroupJob(work, g, join(drop, f"{g:05d}.npy")) for g in range(groups)],
               _received(emitted, groups), resources, memory_of)
    return {"groups": groups, "hist": dict(sorted(hist.items())), "removed": sum(r["removed"] for r in emitted),
            "rounds": rounds, "edges": edges}
