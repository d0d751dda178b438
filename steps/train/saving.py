"""Saving checkpoints that count: finite, verified, and (optionally) uploaded in the background.

A checkpoint folder counts once its meta.json exists (steps/train/checkpoint.py). `Saver` writes
that marker only when everything before it holds:

1. **finite**: every floating tensor of the model and optimizer state is finite (one flag per
   tensor, one device sync, an all-reduce across ranks); else `NonFinite`, nothing is written;
2. **uploaded**: DCP's save returned (sync) or its future completed (async);
3. **verified readable**: DCP's `.metadata` reads back and names every tensor of the state, every
   data file is as long as the items it must hold, and a sample of tensors (a different sample at each step, so that over a run every tensor is read
   back) loads from the store with the same bytes (sha256) as the state had when it was saved;
4. **recorded**: the size and sha256 of every file go into meta.json's `files`, which every load
   checks (steps/train/checkpoint.py). Each rank hashes the files it wrote: with async saves in a
   thread of its own once its upload is done, so the digests cost training no stall.

Async (`trainer.async_checkpoint`): DCP's `async_save` stages the state into host memory (pinned
on CUDA) before it returns, so training waits for that copy only; the upload runs in DCP's
thread. The marker is then written by the training thread, never by the upload thread: after
the first step at which the upload has completed on every rank (one all-reduce of a flag a step
while an upload runs), or at the next checkpoint, or at the end. The upload's own collectives
run on a gloo group of their own (sharing the training's group, they interleaved with its
all-reduces and gloo aborted on the mismatch). An attempt that dies during an upload leaves a folder without meta.json: the previous checkpoint is
still the one in force, and the next attempt deletes the unfinished folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import json
import logging
import pickle
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.state_dict import get_state_dict

from executor import LeaseLost, NonFinite, write_atomic
from steps.train import checkpoint
from steps.train.checkpoint import FILES, META, RUN, Writer, non_finite  # noqa: F401  (non_finite: saving's API)
from steps.train.checkpoint import flat_tensors as _tensors
from steps.train.checkpoint_policy import CheckpointConfig
from steps.train.ranks import barrier, is_main, local, reduce_int, rng_state

log = logging.getLogger("marin.train")
SAMPLED = 4  # tensors read back per checkpoint


def checksum(t: torch.Tensor) -> str:
    """sha256 of a tensor's (local shard's) bytes."""
    shard = local(t).detach().contiguous().cpu()
    return hashlib.sha256(shard.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def sample_keys(keys: list[str], step: int, n: int = SAMPLED) -> list[str]:
    """`n` keys, a different window at each step (the same on every rank)."""
    if len(keys) <= n:
        return list(keys)
    start = (step * n) % len(keys)
    return [keys[(start + i) % len(keys)] for i in range(n)]


def _nested(flat: dict[str, torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, t in flat.items():
        head, _, rest = key.partition(".")
        out.setdefault(head, {})[rest] = t
    return out


def verify(url: str, expected: dict[str, torch.Tensor], sums: dict[str, str]) -> None:
    """Raise if the checkpoint at `url` is not readable: its `.metadata` must name every tensor
    of `expected` with its shape, and the tensors of `sums` must load with those checksums."""
    meta = FsspecReader(url).read_metadata()
    have = meta.state_dict_metadata
    missing = [k for k in expected if k not in have]
    if missing:
        raise IOError(f"checkpoint {url} is unreadable: its .metadata lacks {missing[:3]}")
    wrong = [k for k, t in expected.items() if hasattr(have[k], "size") and tuple(have[k].size) != tuple(t.shape)]
    if wrong:
        raise IOError(f"checkpoint {url}: tensors of another shape in .metadata: {wrong[:3]}")
    # Every data file as long as the items .metadata places in it: an upload cut short is caught
    # whichever tensors it cut (one listing of the folder).
    need: dict[str, int] = {}
    for item in meta.storage_data.values():
        need[item.relative_path] = max(need.get(item.relative_path, 0), item.offset + item.length)
    fs, path = fsspec.core.url_to_fs(url)
    sizes = {posixpath.basename(e["name"]): e["size"] for e in fs.ls(path, detail=True)}
    short = [f for f, n in sorted(need.items()) if sizes.get(f, -1) < n]
    if short:
        raise IOError(f"checkpoint {url}: data files missing or cut short: {short[:3]}")
    # Tensors as DCP keys them ("model.x"): a nested {model: {x: t}} dict loads them.
    fresh = {k: torch.empty_like(expected[k]) for k in sums}
    dcp.load(_nested(fresh), storage_reader=FsspecReader(url), no_dist=not dist.is_initialized())
    bad = [k for k in sums if checksum(fresh[k]) != sums[k]]
    if bad or reduce_int(len(bad)):  # every rank raises, or none
        raise IOError(f"checkpoint {url}: tensors read back differ from what was saved: {bad[:3] or 'on another rank'}")


@dataclass
class _Pending:
    step: int
    url: str
    meta: dict[str, Any]
    run: dict[str, Any] | None
    expected: dict[str, torch.Tensor]  # shapes only matter (meta tensors)
    sums: dict[str, str]
    future: Any = None
    started: float = field(default_factory=time.perf_counter)
    stall_s: float = 0.0


def _unfenced(what: str) -> Any:
    return contextlib.nullcontext()


def on_rank0_under_lease(fence: Callable[[str], Any], what: str, act: Callable[[], Any]) -> None:
    """Rank 0 runs `act` inside `fence(what)` (StepContext.fenced: only while the attempt holds
    the step's lease); every rank raises LeaseLost if rank 0 could not, so none waits in a
    collective for a rank that stopped (one 4-byte all-reduce)."""
    lost: LeaseLost | None = None
    if is_main():
        try:
            with fence(what):
                act()
        except LeaseLost as e:
            lost = e
    if dist.is_initialized() and reduce_int(lost is not None, dist.ReduceOp.MAX) and lost is None:
        raise LeaseLost(f"rank 0 found the step's lease taken over before {what}")
    if lost is not None:
        raise lost


class Saver:
    """Saves, verifies and marks the checkpoints of one training attempt; then applies retention.

    A resumed attempt shares its folder with the attempt it resumed, which may still be running
    (its executor paused past the lease's ttl while its workers trained on). So every write a
    superseded attempt could make into its successor's output goes through `fence`
    (StepContext.fenced): clearing a step's folder before a save, the marker that makes a
    checkpoint count, and retention's deletions. A save starts only while the lease is ours."""

    def __init__(self, output: str, policy: CheckpointConfig, *, async_save: bool, device: torch.device,
                 fence: Callable[[str], Any] = _unfenced) -> None:
        self.output, self.policy, self.async_save, self.fence = output, policy, async_save, fence
        self.device = device
        self.pending: _Pending | None = None
        self.stalls: list[float] = []  # seconds training waited per save
        self.main = is_main()
        # The upload thread's collectives (DCP's plan exchange) must never interleave with the
        # training thread's on one group: async saves get a gloo group of their own (a collective
        # to create, so every rank builds its Saver at the same point), as torchtitan does.
        self.group = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="marin-checkpoint-digest") if async_save else None

    def due(self, step: int) -> bool:
        """Whether checkpoint step-`step` is saved (the policy's cadence)."""
        return self.policy.due(step)

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: dict[str, Any],
             meta: dict[str, Any], run: dict[str, Any] | None) -> None:
        """Start (async) or make (sync) the checkpoint of `step`; a collective."""
        t0 = time.perf_counter()
        self.finish()  # one upload at a time: the previous one counts before the next starts
        url = checkpoint.folder(self.output, step)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        flat = _tensors(state)
        bad = non_finite(flat)
        if bad:
            raise NonFinite(f"step {step}: the state to checkpoint holds non-finite values in {len(bad)} tensors "
                            f"({', '.join(bad[:3])}); no checkpoint written")
        # what an earlier, killed save of this step may have left goes; a superseded attempt stops here
        on_rank0_under_lease(self.fence, f"saving checkpoint step-{step}", lambda: checkpoint._rm(url))
        barrier()
        rngs = [None] * dist.get_world_size() if dist.is_initialized() else [None]
        if dist.is_initialized():
            dist.all_gather_object(rngs, rng_state())
        else:
            rngs = [rng_state()]
        keys = sample_keys(sorted(flat), step)
        sums = {k: checksum(flat[k]) for k in keys}
        expected = {k: torch.empty(t.shape, dtype=t.dtype, device="meta") for k, t in flat.items()}
        expected.update({k: torch.empty_like(flat[k]) for k in keys})  # these are loaded into
        blob = pickle.dumps({**train, "rng": rngs})
        full = {**state, "train": {"state": blob}}
        pending = _Pending(step, url, meta, run, expected, sums)
        writer = Writer(url, sync_files=False)
        if self.async_save and not dist.is_initialized():  # the upload thread warns after the context is gone
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with checkpoint._single_process_ok():
            if self.async_save:  # this rank's files are hashed in the background once uploaded: no stall
                upload = dcp.async_save(full, storage_writer=writer, async_stager=_stager(self.device),
                                        process_group=self.group, no_dist=not dist.is_initialized())
                pending.future = self._hasher.submit(_digests_after, upload, url, self.rank)
            else:
                dcp.save(full, storage_writer=writer, no_dist=not dist.is_initialized())
        pending.stall_s = time.perf_counter() - t0
        self.pending = pending
        if not self.async_save:  # verified and marked before training goes on
            self.finish()
        self.stalls.append(time.perf_counter() - t0)

    def poll(self) -> None:
        """Finish an async save whose upload is done on every rank; called by every rank after
        every step (several ranks agree with one 4-byte all-reduce a step while an upload runs)."""
        p = self.pending
        if p is None or p.future is None:
            return
        done = p.future.done()
        if dist.is_initialized():
            done = bool(reduce_int(done, dist.ReduceOp.MIN))
        if done:
            t0 = time.perf_counter()
            self.finish()
            if self.stalls:  # verifying and marking is the training thread's time too
                self.stalls[-1] += time.perf_counter() - t0

    def finish(self) -> int | None:
        """Wait for the pending upload, verify it and write its marker; returns its step."""
        p, self.pending = self.pending, None
        if p is None:
            return None
        if p.future is not None:  # raises what the upload raised: the checkpoint never counts
            digests = p.future.result()
        else:
            digests = _digests_after(None, p.url, self.rank)
        barrier()
        with checkpoint._single_process_ok():
            verify(p.url, p.expected, p.sums)
        if dist.is_initialized():
            every: list[dict[str, Any]] = [{}] * dist.get_world_size()
            dist.all_gather_object(every, digests)
            digests = {k: v for d in every for k, v in d.items()}
        if self.main:  # written by rank 0 once every rank's upload was done
            digests[".metadata"] = checkpoint.file_digest(f"{p.url}/.metadata")
        p.meta[FILES] = dict(sorted(digests.items()))
        run = dict(p.run or {}, verified={"sampled": sorted(p.sums), "stall_s": p.stall_s,
                                          "upload_s": time.perf_counter() - p.started})

        def mark() -> None:
            write_atomic(f"{p.url}/{RUN}", json.dumps(run, indent=1, sort_keys=True).encode())
            write_atomic(f"{p.url}/{META}", json.dumps(p.meta, indent=1, sort_keys=True).encode(), fsync=True)
            checkpoint.prune(self.output, self.policy)

        on_rank0_under_lease(self.fence, f"marking checkpoint step-{p.step} complete", mark)
        barrier()
        return p.step


def _digests_after(upload: Any, url: str, rank: int) -> dict[str, Any]:
    """Once `upload` (an async save's future; None: done) is done, the size and sha256 of the
    data files this rank wrote: recorded in meta.json, checked on every load."""
    if upload is not None:
        upload.result()
    return {name: checkpoint.file_digest(f"{url}/{name}") for name in checkpoint.rank_files(url, rank)}


def _stager(device: torch.device) -> Any:
    """Staging into host memory before async_save returns: pinned (and a non-blocking copy) on
    CUDA; a plain copy on the CPU, which is what lets training change the weights meanwhile."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = device.type == "cuda"
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False,
                                        use_non_blocking_copy=cuda))
