"""What the trainer reads: the steps of each phase, the tokenizer check, and the batches.

Optimizer step s reads the mixture's global sequences s*B .. s*B + B-1 (B = data.batch_size),
whatever the number of workers: data-parallel rank r of W (its place in the topology-sorted
mesh, steps/train/topology.py) takes the r-th contiguous slice of B/W, cut into micro-batches.
So the global order depends only on the mixture, and resuming at step s is reading from s*B on. Torch-free (numpy only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from executor import VoyageError
from steps.data.formats import join, read_tokens_manifest
from steps.data.mixture import MIXTURE_FILE, MixtureSampler, load_mixture


@dataclass(frozen=True)
class Phases:
    """The optimizer steps of a mixture at a batch size: pretrain [0, switch), midtrain
    [switch, total). With one stage, switch == total (pretrain is the whole run)."""

    total: int
    switch: int
    seq_len: int

    def range_of(self, phase: str) -> tuple[int, int]:
        return (0, self.switch) if phase == "pretrain" else (self.switch, self.total)


def read_mixture(url: str) -> dict[str, Any]:
    """The mixture manifest of a mixture step's output folder (or of the file itself)."""
    path = url if url.endswith(".json") else join(url, MIXTURE_FILE)
    try:
        return load_mixture(path)  # its datasets' relative names resolved (steps.data.paths)
    except FileNotFoundError as e:
        raise VoyageError(f"data.mixture: no mixture manifest at {path}") from e


def phases(manifest: dict[str, Any], batch_size: int) -> Phases:
    """Pretrain and midtrain step ranges of a mixture at `batch_size` sequences per step."""
    total = int(manifest["sequences"]) // batch_size
    if total < 1:
        raise VoyageError(f"data.batch_size: {batch_size} is more than the mixture's {manifest['sequences']} sequences")
    stages = manifest["stages"]
    switch = int(stages[-1]["start"]) // batch_size if len(stages) > 1 else total
    return Phases(total=total, switch=min(switch, total), seq_len=int(manifest["seq_len"]))


def mixture_vocab(manifest: dict[str, Any]) -> tuple[int, str]:
    """(vocab size, tokenizer) shared by every dataset of the mixture, or a VoyageError."""
    seen: dict[tuple[int, str], list[str]] = {}
    for name, info in sorted(manifest["datasets"].items()):
        tokens = read_tokens_manifest(info["url"])
        key = (int(tokens["vocab_size"]), str(tokens.get("tokenizer", "")))
        seen.setdefault(key, []).append(name)
    if len(seen) > 1:
        parts = "; ".join(f"{names} use {tok!r} ({vocab} ids)" for (vocab, tok), names in seen.items())
        raise VoyageError(f"data.mixture: its datasets were tokenized differently: {parts}")
    return next(iter(seen))


def check_vocab(model_vocab: int | None, manifest: dict[str, Any], field: str = "model.vocab_size") -> int:
    """The model's vocabulary size: the mixture's, which a given `model_vocab` must equal."""
    vocab, tokenizer = mixture_vocab(manifest)
    if model_vocab is not None and model_vocab != vocab:
        raise VoyageError(f"{field}: the model has {model_vocab} ids but the mixture's datasets use tokenizer "
                          f"{tokenizer!r} with {vocab} ids")
    return vocab


def check_batch(batch_size: int, mesh: Any, microbatch: int) -> int:
    """Micro-batches per optimizer step on each data-parallel rank, or a VoyageError naming the
    field and the mesh. `mesh` is a resolved ParallelConfig (every rank of dp_replicate x
    dp_shard reads its own share; expert parallelism borrows ranks from dp_shard and adds none)
    or a plain number of data-parallel workers."""
    dp = mesh if isinstance(mesh, int) else mesh.dp
    where = f"{dp} workers" if isinstance(mesh, int) else f"the {dp} data-parallel ranks of the mesh {mesh.describe()}"
    if batch_size % dp:
        raise VoyageError(f"data.batch_size: {batch_size} sequences do not divide across {where} "
                          f"(trainer.workers / Resources.workers, trainer.parallel)")
    share = batch_size // dp
    micro = microbatch or share
    if share % micro:
        raise VoyageError(f"trainer.microbatch: {micro} does not divide the {share} sequences of each of "
                          f"{where} (data.batch_size {batch_size})")
    return share // micro


class Batches:
    """The token windows of one worker: `step(s)` -> micro-batches, each int64 [m, seq_len].

    The next `ahead` steps' sequences are fetched on a background thread with coalesced range
    reads (steps/train/readahead.py), bitwise the same batches; `ahead=0` reads each step when
    asked. `wait_s` is the time `step` spent waiting for data."""

    def __init__(self, manifest: dict[str, Any], batch_size: int, rank: int, workers: int, microbatch: int,
                 ahead: int = 4) -> None:
        from steps.train.readahead import ReadAhead

        self.sampler = MixtureSampler(manifest)
        self.batch_size, self.rank, self.workers = batch_size, rank, workers
        self.share = batch_size // workers
        self.micro = microbatch or self.share
        self.reader = ReadAhead(self.sampler, self.indices, self.sampler.size // batch_size, depth=ahead)

    def indices(self, s: int) -> range:
        """The global sequences this worker reads at step `s`."""
        first = s * self.batch_size + self.rank * self.share
        return range(first, first + self.share)

    @property
    def wait_s(self) -> float:
        return self.reader.wait_s

    def step(self, s: int) -> list[np.ndarray]:
        rows = self.reader.rows(s).astype(np.int64)
        return [rows[i:i + self.micro] for i in range(0, self.share, self.micro)]

    def close(self) -> None:
        """Stop the read-ahead thread (it also stops with the process)."""
        self.reader.close()
