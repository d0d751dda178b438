"""Checkpoints: torch.distributed.checkpoint (DCP) folders on any fsspec URL.

Layout, under a training step's output (the folder names, the cadence and retention:
steps/train/checkpoint_policy.py, torch-free):

    checkpoints/step-N/        N optimizer steps done
        .metadata, __R_0.distcp   DCP: "model" and "optim" (FQN-keyed, so any world size or
                                  wrapping loads them), "train" (one pickled dict: step, tokens,
                                  scheduler state, data position, every rank's RNG state)
        run.json                by rank 0: how this save came about (the last metrics row with
                                its timings, start-up time, wall clock, the mesh and the nodes
                                its ranks ran on): a log of the step, out of its output digest
        meta.json               written last, by rank 0: step, tokens, model config, mixture,
                                batch size, world size, schedule, and `files`: the size and
                                sha256 of every file DCP wrote (steps/train/saving.py)

Everything but run.json is a function of the step's identity and the mesh: DCP's own metadata
would carry a fresh uuid and the folder's path per save, so `Writer` leaves them out, and an
identical rerun writes identical bytes (its output digest is the same, so nothing downstream
goes stale).

A folder counts as a checkpoint only once its meta.json exists, so one cut off mid-save is never
resumed from (it is deleted when found). The trainer saves through steps/train/saving.py, which
writes meta.json only once the state was finite and the folder reads back (sync or async);
`save` here is the plain collective save without those checks. Retention (`prune`) deletes what
`CheckpointConfig.kept` does not keep, after each save.

Verified on load: `load` (resuming, a rewind, `init_from`, eval) first checks every file against
meta.json's `files` (present, the recorded size, the recorded sha256) and against `.metadata`
(every data file as long as the items it places there), then, once loaded, that every floating
tensor is finite. A checkpoint that fails is refused with one line naming the file (or tensor)
and the check (`CorruptCheckpoint`); the ranks share the digest work and agree on the verdict.
A checkpoint without `files` (written before digests, or by an import) gets the other checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import posixpath
import warnings
from typing import Any, Iterator

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from executor import VoyageError, write_atomic
from steps.train.checkpoint_policy import (CHECKPOINTS, FILES, META, RUN, CheckpointConfig, SavedCheckpoint,  # noqa: F401
                                           folder, list_checkpoints, root_of, size_problem, step_of)
from steps.train.ranks import barrier, is_main, local, rng_state


class CorruptCheckpoint(VoyageError):
    """A checkpoint that fails verification on load; the message is one line naming the
    checkpoint, the file (or tensor) and the check. `loaded`: the state was already copied into
    the model (the finiteness check), which another load must overwrite."""

    loaded = False


class Writer(FsspecWriter):
    """DCP's fsspec writer without the per-save uuid and path in `.metadata` (nothing reads
    them back): the same tensors give the same bytes."""

    def storage_meta(self) -> None:
        return None


def resolve(url: str, field: str) -> SavedCheckpoint:
    """A checkpoint named by a training step's output (its newest checkpoint) or by a
    `checkpoints/step-N` folder itself."""
    n = step_of(url)
    if n is not None:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.exists(posixpath.join(path, META)):
            raise VoyageError(f"{field}: {url} is not a complete checkpoint (no {META})")
        return SavedCheckpoint(n, url.rstrip("/"))
    found = list_checkpoints(url)
    if not found:
        raise VoyageError(f"{field}: no checkpoint under {url}")
    return found[-1]


def read_meta(url: str) -> dict[str, Any]:
    """A checkpoint's meta.json."""
    with fsspec.open(f"{url.rstrip('/')}/{META}", "r") as f:
        return json.load(f)


def read_run(url: str) -> dict[str, Any]:
    """A checkpoint's run.json ({} if it has none: a weights-only import). Checkpoints written
    before run.json kept these fields in meta.json: they are read from there."""
    try:
        with fsspec.open(f"{url.rstrip('/')}/{RUN}", "r") as f:
            return json.load(f)
    except FileNotFoundError:
        meta = read_meta(url)
        return {k: meta[k] for k in ("metrics", "startup_s", "time", "mesh") if k in meta}


def remove_incomplete(output: str) -> None:
    """Delete checkpoint folders a killed save left without meta.json (rank 0 only)."""
    done = {f.step for f in list_checkpoints(output)}
    for f in list_checkpoints(output, complete=False):
        if f.step not in done:
            _rm(f.url)


def prune(output: str, policy: CheckpointConfig) -> list[int]:
    """Delete the checkpoints `policy` does not keep; returns the steps deleted."""
    found = list_checkpoints(output)
    keep = policy.kept(f.step for f in found)
    gone = [f for f in found if f.step not in keep]
    for f in gone:
        _rm(f.url)
    return [f.step for f in gone]


def _rm(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    """DCP warns on every save and load without a process group, which is how one worker runs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save(url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: dict[str, Any],
         meta: dict[str, Any], run: dict[str, Any] | None = None) -> None:
    """Save a checkpoint from every rank (a collective); rank 0 writes run.json (a log: timings,
    nodes) and then meta.json, last."""
    if is_main():
        _rm(url)  # what an earlier, killed save of this step may have left
    barrier()
    rngs = [None] * dist.get_world_size() if dist.is_initialized() else [None]
    if dist.is_initialized():
        dist.all_gather_object(rngs, rng_state())
    else:
        rngs = [rng_state()]
    model_sd, optim_sd = get_state_dict(model, optimizer)
    blob = pickle.dumps({**train, "rng": rngs})
    with _single_process_ok():
        dcp.save({"model": model_sd, "optim": optim_sd, "train": {"state": blob}},
                 storage_writer=Writer(url, sync_files=False), no_dist=not dist.is_initialized())
    barrier()
    if is_main():
        if run is not None:
            write_atomic(f"{url}/{RUN}", json.dumps(run, indent=1, sort_keys=True).encode())
        write_atomic(f"{url}/{META}", json.dumps(meta, indent=1, sort_keys=True).encode(), fsync=True)
    barrier()


def load(url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *,
         verify: bool = True) -> dict[str, Any]:
    """Load model (and optimizer) state from a checkpoint, on every rank; returns the train
    dict (with `rng`, every saved rank's RNG state). With `verify` (the default) the files are
    checked first and the loaded state after (the module's text): CorruptCheckpoint on every
    rank, or on none. A state that fails the finiteness check was already copied into the model:
    the caller loads another checkpoint over it or fails."""
    if verify:
        _agree(lambda: verify_files(url, part=_part()))
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        model_sd = get_model_state_dict(model)
        with _single_process_ok():
            dcp.load({"model": model_sd}, storage_reader=FsspecReader(url), no_dist=not dist.is_initialized())
        if verify:
            _refuse_non_finite(url, {"model": model_sd})
        set_model_state_dict(model, model_sd)
        return {}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "train": {"state": b""}}
    with _single_process_ok():
        dcp.load(state, storage_reader=FsspecReader(url), no_dist=not dist.is_initialized())
    if verify:
        _refuse_non_finite(url, {"model": model_sd, "optim": optim_sd})
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return pickle.loads(state["train"]["state"])


def file_digest(url: str) -> dict[str, Any]:
    """{"size", "sha256"} of one file, read in 4 MiB pieces."""
    h, size = hashlib.sha256(), 0
    with fsspec.open(url, "rb") as f:
        for piece in iter(lambda: f.read(1 << 22), b""):
            h.update(piece)
            size += len(piece)
    return {"size": size, "sha256": h.hexdigest()}


def folder_digests(url: str) -> dict[str, dict[str, Any]]:
    """{file name: {"size", "sha256"}} of every file DCP wrote into a checkpoint folder (its data
    files and `.metadata`): meta.json's `files`, for a checkpoint written in one process."""
    fs, path = fsspec.core.url_to_fs(url)
    names = sorted(posixpath.basename(n) for n in fs.ls(path, detail=False, refresh=True))
    return {n: file_digest(f"{url.rstrip('/')}/{n}") for n in names if n.endswith(".distcp") or n == ".metadata"}


def rank_files(url: str, rank: int) -> list[str]:
    """The data files rank `rank` wrote into a checkpoint folder (DCP names them `__R_i.distcp`)."""
    fs, path = fsspec.core.url_to_fs(url)
    names = [posixpath.basename(n) for n in fs.ls(path, detail=False, refresh=True)]
    return sorted(n for n in names if n.startswith(f"__{rank}_") and n.endswith(".distcp"))


def _refuse(url: str, name: str, check: str, loaded: bool = False) -> None:
    error = CorruptCheckpoint(f"checkpoint {url} refused: {name}: {check}")
    error.loaded = loaded
    raise error


def verify_files(url: str, meta: dict[str, Any] | None = None, *, digests: bool = True,
                 part: tuple[int, int] = (0, 1)) -> None:
    """CorruptCheckpoint when a file of the checkpoint is missing, of another size than recorded,
    shorter than `.metadata` places items in it, or (with `digests`) holds other bytes than the
    recorded sha256. `part` (index, count): this caller hashes every count-th file only (the
    ranks share the work). `digests=False` is the cheap check (a listing and `.metadata`)."""
    meta = read_meta(url) if meta is None else meta
    recorded = meta.get(FILES) or {}
    problem = size_problem(url, meta)
    if problem:
        _refuse(url, *problem)
    fs, path = fsspec.core.url_to_fs(url)
    sizes = {posixpath.basename(e["name"]): e["size"] for e in fs.ls(path, detail=True, refresh=True)}
    try:
        storage = FsspecReader(url).read_metadata().storage_data
    except Exception as e:  # noqa: BLE001 - any unpickling error: the file is damaged
        _refuse(url, ".metadata", f"unreadable ({type(e).__name__}: {str(e)[:80]})")
    need: dict[str, int] = {}
    for item in storage.values():
        need[item.relative_path] = max(need.get(item.relative_path, 0), item.offset + item.length)
    for name, n in sorted(need.items()):
        if sizes.get(name, -1) < n:
            _refuse(url, name, f"size check: {sizes.get(name, 0)} bytes, but .metadata places {n} bytes of items there")
    if digests:
        index, count = part
        for name, rec in sorted(recorded.items())[index::count]:
            got = file_digest(f"{url.rstrip('/')}/{name}")
            if got["sha256"] != rec["sha256"]:
                _refuse(url, name, "digest check: its sha256 differs from the one recorded when it was saved")


def _refuse_non_finite(url: str, state: dict[str, Any]) -> None:
    """CorruptCheckpoint naming the first tensor (and its file) that holds a NaN or an infinity."""
    bad = non_finite(flat_tensors(state))
    if bad:
        try:
            storage = FsspecReader(url).read_metadata().storage_data
            where = next((i.relative_path for k, i in storage.items() if k.fqn == bad[0]), "?")
        except Exception:  # noqa: BLE001
            where = "?"
        _refuse(url, where, f"finiteness check: {bad[0]} holds NaN or infinite values"
                + (f" ({len(bad) - 1} more tensors too)" if len(bad) > 1 else ""), loaded=True)


def _part() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _agree(check: Any) -> None:
    """Run `check` on every rank; every rank raises the first rank's CorruptCheckpoint, or none."""
    error = None
    try:
        check()
    except CorruptCheckpoint as e:
        error = str(e)
    if dist.is_initialized():
        errors: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise CorruptCheckpoint(error)


def flat_tensors(state: dict[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """Flattened `a.b.c` -> tensor of a nested state dict (DCP's own key order)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_tensors(v, key + "."))
        elif isinstance(v, torch.Tensor):
            out[key] = v
    return out


def non_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating tensors holding a NaN or an infinity (on any rank)."""
    names = [k for k, t in tensors.items() if t.is_floating_point() and local(t).numel()]
    if not names:  # the same keys on every rank: all of them return here, or none
        return []
    flags = torch.stack([~torch.isfinite(local(tensors[k])).all() for k in names]).to(torch.int32)
    if dist.is_initialized():
        flags = flags.cpu() if dist.get_backend() == "gloo" else flags
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [k for k, bad in zip(names, flags.tolist()) if bad]


def restore_rng(train: dict[str, Any], rank: int) -> bool:
    """Put this rank's saved RNG state back; False when the checkpoint has none for this rank."""
    rngs = train.get("rng") or []
    if rank >= len(rngs) or rngs[rank] is None:
        return False
    torch.set_rng_state(torch.frombuffer(bytearray(rngs[rank]["cpu"]), dtype=torch.uint8))
    if "cuda" in rngs[rank] and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(rngs[rank]["cuda"]), dtype=torch.uint8))
    return True


def saved_shapes(url: str) -> dict[str, tuple[int, ...]]:
    """Shape of every model tensor in a checkpoint, read from DCP's metadata alone."""
    meta = FsspecReader(url).read_metadata()
    return {k[len("model."):]: tuple(v.size) for k, v in meta.state_dict_metadata.items()
            if k.startswith("model.") and hasattr(v, "size")}


def check_shapes(url: str, model_config: Any, field: str) -> None:
    """VoyageError naming `field` when the checkpoint holds a model of another shape."""
    from steps.moe.model import MoETransformer

    with torch.device("meta"):
        model = MoETransformer(model_config)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = saved_shapes(url)
    if want == have:
        return
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    differ = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    parts = []
    if differ:
        parts.append(", ".join(f"{k} {have[k]} vs {want[k]}" for k in differ[:3]) + (" ..." if len(differ) > 3 else ""))
    if missing:
        parts.append(f"missing {missing[:3]}")
    if extra:
        parts.append(f"unexpected {extra[:3]}")
    raise VoyageError(f"{field}: checkpoint {url} holds a model of another shape (checkpoint vs model: "
                      f"{'; '.join(parts)})")
