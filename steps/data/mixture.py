"""mixture: a weighted, staged mixture of tokenized datasets, and the sampler the trainer reads.

A mixture is a small manifest (`mixture.json`), never a copy of tokens. The budget is cut into
`token_budget // seq_len` sequences of `seq_len` tokens, numbered 0, 1, ... (global indices).

Stages: stage k covers the global indices [start_k, end_k), its share of the budget rounded to
whole sequences; the switch happens exactly at `start_k`. A plain `weights` is one stage.

Blocks: each stage is cut into blocks of `block_size` sequences (the last block of a stage takes
the remainder, so it holds between one and two blocks' worth). Dataset d's draws in the first m
sequences of a stage, at block boundaries, are floor(m * w_d) for every dataset but the one with
the largest weight (the "absorber"), which takes the rest; so each block has exact integer
quotas, they sum to the block, and every dataset's cumulative count stays within one sequence
of its target (the absorber's within the number of datasets). Inside a block the slots are
shuffled by a generator seeded with (seed, stage, block).

A dataset's n-th draw overall (counting across stages) is sequence n mod N_d of epoch
n // N_d, where N_d = tokens // seq_len and each epoch visits the sequences in the order of a
seeded Feistel permutation. Everything is a closed form of the global index: O(1) random access,
the same order on any number of workers (worker w of W takes w, w+W, ...), resumable anywhere.

`consumption(manifest, first, end)` counts, for global sequences `[first, end)`, the sequences and
tokens drawn from each dataset, source and licence, by the sampler's closed forms (per-block
integer quotas), not the declared weights, so the counts are exact: the pretrain step's figures
are what its optimizer steps read, and the model card's are the same.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from executor import InputPath, License, StepContext, VoyageError, step_type
from executor.licenses import NOASSERTION, from_json_map
from steps.data.formats import MANIFEST, TokenDataset, join, read_json, write_json
from steps.data.provenance import LICENSES_KEY, manifest_licenses, note_sources, to_manifest
from steps.data.paths import ref, resolve

MIXTURE_FORMAT = "marin-mixture/1"
MIXTURE_FILE = "mixture.json"


@dataclass(frozen=True)
class MixtureStage:
    """`fraction` of the token budget drawn at `weights` (dataset name -> weight)."""

    fraction: float
    weights: dict[str, float]


@dataclass(frozen=True)
class MixtureConfig:
    """Tokenized datasets by name, and how to mix them."""

    datasets: dict[str, InputPath]  # name -> tokenized dataset: output_of(tokenize step)
    token_budget: int
    seq_len: int
    weights: dict[str, float] | None = None  # one stage; or give `stages`
    stages: tuple[MixtureStage, ...] = ()
    seed: int = 0
    block_size: int = 2048  # sequences per block
    max_epochs: float = 4.0  # warn when any dataset is repeated more often than this

    def __post_init__(self) -> None:
        check_mixture(self)

    def resolved_stages(self) -> tuple[MixtureStage, ...]:
        return self.stages or (MixtureStage(1.0, dict(self.weights or {})),)


def check_mixture(config: MixtureConfig) -> None:
    """Raise VoyageError naming what is wrong with a mixture's weights, stages or sizes."""
    names = set(config.datasets)
    if not names:
        raise VoyageError("mixture: no datasets")
    if (config.weights is None) == (not config.stages):
        raise VoyageError("mixture: give either `weights` or `stages`, not both or neither")
    if config.seq_len < 1 or config.token_budget < config.seq_len:
        raise VoyageError(f"mixture: token_budget {config.token_budget} must hold at least one sequence of "
                          f"seq_len {config.seq_len}")
    if config.block_size < len(names) ** 2:
        raise VoyageError(f"mixture: block_size {config.block_size} must be at least the number of datasets "
                          f"squared ({len(names) ** 2}) for exact per-block quotas")
    stages = config.resolved_stages()
    for k, stage in enumerate(stages):
        where = "weights" if config.weights is not None else f"stages[{k}].weights"
        unknown = sorted(set(stage.weights) - names)
        if unknown:
            raise VoyageError(f"mixture: {where} names unknown datasets {unknown}; known: {sorted(names)}")
        bad = sorted(n for n, w in stage.weights.items() if not (isinstance(w, (int, float)) and math.isfinite(w)))
        if bad:
            raise VoyageError(f"mixture: {where} has non-finite weights for {bad}")
        negative = sorted(n for n, w in stage.weights.items() if w < 0)
        if negative:
            raise VoyageError(f"mixture: {where} has negative weights for {negative}")
        if sum(stage.weights.values()) <= 0:
            raise VoyageError(f"mixture: {where} sum to zero ({stage.weights})")
        if not stage.fraction > 0:
            raise VoyageError(f"mixture: stages[{k}].fraction must be > 0, got {stage.fraction}")
    total = sum(s.fraction for s in stages)
    if abs(total - 1.0) > 1e-9:
        raise VoyageError(f"mixture: stage fractions sum to {total}, not 1")


@step_type(version="2")
def mixture(config: MixtureConfig, ctx: StepContext) -> None:
    """Write `mixture.json`: sizes, stage boundaries, draws and epochs per dataset, and each
    dataset's licences; the record's provenance gets the exact tokens per source and licence."""
    sizes = {}
    for name, url in sorted(config.datasets.items()):
        manifest = read_json(join(url, MANIFEST))
        licenses = manifest_licenses(manifest)
        note_sources(ctx, licenses)
        # Named relative to this folder when in the same prefix: a copied prefix reads its own copy.
        sizes[name] = {"url": ref(ctx, url), "tokens": int(manifest["tokens"]),
                       "documents": int(manifest["documents"]), LICENSES_KEY: to_manifest(licenses)}
    manifest = plan_mixture(config, {n: s["tokens"] for n, s in sizes.items()})
    for name in sizes:
        manifest["datasets"][name].update(sizes[name])
    for warning in manifest["warnings"]:
        ctx.logger.warning("mixture: %s", warning)
    write_json(ctx.path(MIXTURE_FILE), manifest)
    # What the whole budget draws, per stage and in all: the quotas, not the declared weights.
    tokens = consumption(manifest, 0, manifest["sequences"])
    tokens["stages"] = [dict(consumption(manifest, s["start"], s["end"]), stage=k)
                        for k, s in enumerate(manifest["stages"])]
    ctx.provenance["tokens"] = tokens
    ctx.results.update(sequences=manifest["sequences"], tokens=manifest["sequences"] * config.seq_len,
                       epochs=manifest["epochs"], warnings=manifest["warnings"],
                       stage_starts=[s["start"] for s in manifest["stages"]])


def load_mixture(url: str) -> dict[str, Any]:
    """The manifest of a mixture step's output folder (or of its mixture.json), every dataset's
    `url` resolved against the folder (steps.data.paths)."""
    path = url if url.endswith(".json") else join(url, MIXTURE_FILE)
    manifest = read_json(path)
    folder = path.rpartition("/")[0]
    for info in manifest.get("datasets", {}).values():
        if "url" in info:
            info["url"] = resolve(info["url"], folder)
    return manifest


def plan_mixture(config: MixtureConfig, tokens: Mapping[str, int]) -> dict[str, Any]:
    """The mixture manifest for datasets of the given sizes (tokens per name)."""
    names = sorted(config.datasets)
    total = config.token_budget // config.seq_len
    stages, start, acc = [], 0, 0.0
    for k, stage in enumerate(config.resolved_stages()):
        acc += stage.fraction
        end = total if k == len(config.resolved_stages()) - 1 else min(total, round(acc * total))
        wsum = sum(stage.weights.values())
        weights = {n: stage.weights.get(n, 0.0) / wsum for n in names}
        absorber = max(names, key=lambda n: (weights[n], -names.index(n)))
        stages.append({"start": start, "end": end, "weights": weights, "absorber": absorber})
        start = end
    manifest: dict[str, Any] = {
        "format": MIXTURE_FORMAT, "seq_len": config.seq_len, "token_budget": config.token_budget,
        "sequences": total, "seed": config.seed, "block_size": config.block_size, "stages": stages,
        "datasets": {n: {"sequences": int(tokens[n]) // config.seq_len} for n in names}, "warnings": []}
    sampler = MixtureSampler(manifest, datasets={})
    draws = {n: int(sampler.draws_before(len(stages), 0)[i]) for i, n in enumerate(names)}
    for n in names:
        if draws[n] and manifest["datasets"][n]["sequences"] == 0:
            raise VoyageError(f"mixture: dataset {n!r} has {tokens[n]} tokens, less than one sequence of "
                              f"{config.seq_len}, but a positive weight")
    epochs = {n: (draws[n] / manifest["datasets"][n]["sequences"]) if draws[n] else 0.0 for n in names}
    manifest["draws"], manifest["epochs"] = draws, epochs
    manifest["warnings"] = [f"dataset {n!r} is repeated {e:.2f} times, past the limit of {config.max_epochs:g}"
                            for n, e in epochs.items() if e > config.max_epochs]
    return manifest


@dataclass
class Location:
    """Where global sequence `index` comes from."""

    index: int
    stage: int
    dataset: str
    draw: int  # the dataset's n-th draw, counting from 0 across stages
    epoch: int
    sequence: int  # index of the seq_len window inside the dataset
    token_start: int


class MixtureSampler:
    """Random access to a mixture: `locate(i)`, `sequence(i)`, and per-worker index streams.

    Built from a mixture manifest (dict) or the URL of a mixture step's output; opens the token
    datasets lazily (`datasets` may map names to already-open `TokenDataset`s).
    """

    def __init__(self, manifest: Mapping[str, Any] | str, datasets: Mapping[str, TokenDataset] | None = None) -> None:
        if isinstance(manifest, str):
            manifest = load_mixture(manifest)
        if manifest.get("format") != MIXTURE_FORMAT:
            raise ValueError(f"not a mixture manifest (format {manifest.get('format')!r})")
        self.manifest = manifest
        self.names = sorted(manifest["datasets"])
        self.seq_len = int(manifest["seq_len"])
        self.size = int(manifest["sequences"])
        self.seed = int(manifest["seed"])
        self.block = int(manifest["block_size"])
        self.stages = manifest["stages"]
        self.windows = np.array([manifest["datasets"][n]["sequences"] for n in self.names], dtype=np.int64)
        self._w = [np.array([s["weights"][n] for n in self.names]) for s in self.stages]
        self._absorber = [self.names.index(s["absorber"]) for s in self.stages]
        self._open: dict[str, TokenDataset] = dict(datasets or {})
        self._stage_starts = np.array([s["start"] for s in self.stages] + [self.size], dtype=np.int64)
        self._block_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return self.size

    # -- counts, closed form ---------------------------------------------------------------------
    def _stage_len(self, k: int) -> int:
        return int(self.stages[k]["end"] - self.stages[k]["start"])

    def _blocks(self, k: int) -> int:
        return max(1, self._stage_len(k) // self.block)

    def _cumulative(self, k: int, m: int) -> np.ndarray:
        """Draws of every dataset in the first m sequences of stage k (m at a block boundary)."""
        counts = np.floor(m * self._w[k] + 1e-9).astype(np.int64)
        counts[self._absorber[k]] = 0
        counts[self._absorber[k]] = m - counts.sum()
        return counts

    def _block_quotas(self, k: int, j: int) -> tuple[int, np.ndarray]:
        n = self._stage_len(k)
        lo = j * self.block
        hi = n if j == self._blocks(k) - 1 else lo + self.block
        if self._blocks(k) == 1 and n < len(self.names) ** 2:  # too short for the cumulative scheme
            return lo, _largest_remainder(n, self._w[k])
        return lo, self._cumulative(k, hi) - self._cumulative(k, lo)

    def draws_before(self, k: int, m: int) -> np.ndarray:
        """Draws of every dataset before sequence m of stage k (all earlier stages included)."""
        before = np.zeros(len(self.names), dtype=np.int64)
        for s in range(k):
            before += self._block_quotas(s, self._blocks(s) - 1)[1] + self._cumulative_at_block(s, self._blocks(s) - 1)
        if k < len(self.stages) and m:
            j = min(m // self.block, self._blocks(k) - 1)
            before += self._cumulative_at_block(k, j)
            labels, ranks, _ = self._block(k, j)
            inside = labels[:m - j * self.block]
            before += np.bincount(inside, minlength=len(self.names))
        return before

    def draws_until(self, index: int) -> np.ndarray:
        """Draws of every dataset among global sequences [0, index) (index up to len(self)):
        exact, from the per-block quotas and one block's slots."""
        if not 0 <= index <= self.size:
            raise IndexError(f"sequence {index} out of range 0..{self.size}")
        if index == self.size:
            return self.draws_before(len(self.stages), 0)
        k = self.stage_of(index)
        return self.draws_before(k, index - int(self._stage_starts[k]))

    def _cumulative_at_block(self, k: int, j: int) -> np.ndarray:
        if self._blocks(k) == 1:
            return np.zeros(len(self.names), dtype=np.int64)
        return self._cumulative(k, j * self.block)

    def _block(self, k: int, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dataset of each slot, rank of the slot among its dataset's slots, quotas) of one block."""
        key = (k, j)
        if key not in self._block_cache:
            _, quotas = self._block_quotas(k, j)
            labels = np.repeat(np.arange(len(self.names)), quotas)
            labels = np.random.Generator(np.random.PCG64([self.seed, k, j])).permutation(labels)
            ranks = np.empty_like(labels)
            for d in range(len(self.names)):
                where = np.flatnonzero(labels == d)
                ranks[where] = np.arange(where.size)
            if len(self._block_cache) > 8:
                self._block_cache.pop(next(iter(self._block_cache)))
            self._block_cache[key] = (labels, ranks, quotas)
        return self._block_cache[key]

    # -- random access -----------------------------------------------------------------------------
    def stage_of(self, index: int) -> int:
        return int(np.searchsorted(self._stage_starts, index, side="right")) - 1

    def locate(self, index: int) -> Location:
        """Which dataset, epoch and token window global sequence `index` reads."""
        if not 0 <= index < self.size:
            raise IndexError(f"sequence {index} out of range 0..{self.size}")
        k = self.stage_of(index)
        m = index - int(self._stage_starts[k])
        j = min(m // self.block, self._blocks(k) - 1)
        labels, ranks, _ = self._block(k, j)
        d = int(labels[m - j * self.block])
        draw = int(self._stage_base(k)[d] + self._cumulative_at_block(k, j)[d] + ranks[m - j * self.block])
        windows = int(self.windows[d])
        epoch, i = divmod(draw, windows)
        seq = feistel(i, windows, (self.seed, d, epoch))
        return Location(index, k, self.names[d], draw, epoch, seq, seq * self.seq_len)

    @functools.lru_cache(maxsize=None)
    def _stage_base(self, k: int) -> np.ndarray:
        return self.draws_before(k, 0)

    def dataset(self, name: str) -> TokenDataset:
        if name not in self._open:
            self._open[name] = TokenDataset(self.manifest["datasets"][name]["url"])
        return self._open[name]

    def sequence(self, index: int) -> np.ndarray:
        """The `seq_len` tokens of global sequence `index`."""
        loc = self.locate(index)
        return self.dataset(loc.dataset).tokens(loc.token_start, self.seq_len)

    def worker_indices(self, worker: int, workers: int, start: int = 0) -> Iterator[int]:
        """The global indices worker `worker` of `workers` reads, from global step `start` on
        (step s covers indices s*workers .. s*workers+workers-1)."""
        return iter(range(start * workers + worker, self.size, workers))


def _largest_remainder(n: int, weights: np.ndarray) -> np.ndarray:
    exact = n * weights
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:n - counts.sum()]] += 1
    return counts


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def _feistel_params(n: int, key: tuple[int, ...]) -> tuple[int, int, int]:
    """(bits a half, the half's mask, the round seed) of the network over range(n) and `key`."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    seed = 0
    for part in key:
        seed = _mix64(seed ^ (part & _MASK64) ^ 0x9E3779B97F4A7C15)
    return half, (1 << half) - 1, seed


def feistel(i: int, n: int, key: tuple[int, ...], rounds: int = 4) -> int:
    """A pseudo-random permutation of range(n) evaluated at i: a balanced Feistel network over
    the next even power of two, cycle-walking until the value falls inside range(n)."""
    if n <= 1:
        return 0
    half, mask, seed = _feistel_params(n, key)
    x = i
    while True:
        left, right = x >> half, x & mask
        for r in range(rounds):
            left, right = right, left ^ (_mix64(right ^ seed ^ (r << 56)) & mask)
        x = (left << half) | right
        if x < n:
            return x


def feistel_inverse(x: int, n: int, key: tuple[int, ...], rounds: int = 4) -> int:
    """The i with `feistel(i, n, key) == x`: the rounds undone in reverse order, cycle-walking
    backwards until the value falls inside range(n)."""
    if not 0 <= x < max(n, 1):
        raise ValueError(f"{x} is outside range({n})")
    if n <= 1:
        return 0
    half, mask, seed = _feistel_params(n, key)
    y = x
    while True:
        left, right = y >> half, y & mask
        for r in reversed(range(rounds)):
            left, right = right ^ (_mix64(left ^ seed ^ (r << 56)) & mask), left
        y = (left << half) | right
        if y < n:
            return y


# -- tokens consumed --------------------------------------------------------------------------

def _source_key(sources: Mapping[str, License], dataset: str) -> tuple[str, str]:
    """(source key, licence key) a dataset's draws are counted under: its one source and licence;
    several joined (`a + b`, `X AND Y`, SPDX's word for both at once); unknown if none."""
    if not sources:
        return f"unknown:{dataset}", NOASSERTION.id
    names = sorted(sources)
    ids = sorted({sources[n].id for n in names})
    return " + ".join(names), " AND ".join(ids)


def consumption(manifest: Mapping[str, Any], first: int, end: int) -> dict[str, Any]:
    """Sequences and tokens of global sequences [first, end) of a mixture, per dataset, per source
    and per licence (tokens = sequences x seq_len: the windows read)."""
    sampler = MixtureSampler(dict(manifest), datasets={})
    first, end = max(0, int(first)), min(int(end), len(sampler))
    counts = sampler.draws_until(end) - sampler.draws_until(first) if end > first else \
        np.zeros(len(sampler.names), dtype=np.int64)
    return tally(manifest, {n: int(c) for n, c in zip(sampler.names, counts)}, first, end)


def tally(manifest: Mapping[str, Any], sequences: Mapping[str, int], first: int, end: int) -> dict[str, Any]:
    """The per-dataset, per-source and per-licence record of `sequences` drawn per dataset."""
    seq_len = int(manifest["seq_len"])
    by_dataset: dict[str, Any] = {}
    by_source: dict[str, Any] = {}
    by_license: dict[str, Any] = {}
    for name in sorted(sequences):
        n = int(sequences[name])
        info = manifest["datasets"].get(name, {})
        sources = from_json_map(info.get(LICENSES_KEY))
        source, lic = _source_key(sources, name)
        by_dataset[name] = {"sequences": n, "tokens": n * seq_len, "sources": sorted(sources)}
        if not n:
            continue
        s = by_source.setdefault(source, {"sequences": 0, "tokens": 0, "license": lic})
        s["sequences"] += n
        s["tokens"] += n * seq_len
        lc = by_license.setdefault(lic, {"sequences": 0, "tokens": 0})
        lc["sequences"] += n
        lc["tokens"] += n * seq_len
    total = sum(int(v) for v in sequences.values())
    return {"seq_len": seq_len, "sequences": [first, end], "total": {"sequences": total, "tokens": total * seq_len},
            "by_dataset": by_dataset, "by_source": dict(sorted(by_source.items())),
            "by_license": dict(sorted(by_license.items()))}
