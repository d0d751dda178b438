"""Model tensors of a DCP checkpoint read one at a time, and a DCP checkpoint written one tensor at
a time, by FQN. Layout-agnostic: a checkpoint saved from any world size, sharding or wrapping
holds each tensor as chunks that DCP assembles into the full logical tensor by name.

Reading: each tensor is one `dcp.load` of a one-entry state dict, so only that tensor's chunks
are read from storage (plus DCP's metadata file, which lists every chunk).

Writing: `dcp.save` plans from a state dict of meta tensors (shapes and dtypes only) and asks its
planner for each tensor's data only when the writer reaches it (`resolve_data`); ours produces
it then, from a function. With one writer thread the tensors are produced, written and dropped
one by one, so the model is never whole in memory.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

MODEL = "model"  # the trainer saves {"model": ..., "optim": ..., "train": ...}


@contextlib.contextmanager
def _no_process_group_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class CheckpointTensors:
    """The model tensors of one DCP checkpoint folder: shapes and dtypes from the metadata, data
    loaded one FQN at a time."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        meta = FsspecReader(self.url).read_metadata()
        prefix = MODEL + "."
        self.entries: dict[str, TensorStorageMetadata] = {
            k[len(prefix):]: v for k, v in meta.state_dict_metadata.items()
            if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}

    def shape(self, fqn: str) -> tuple[int, ...]:
        return tuple(self.entries[fqn].size)

    def dtype(self, fqn: str) -> torch.dtype:
        return self.entries[fqn].properties.dtype

    def load(self, fqn: str) -> torch.Tensor:
        """The full tensor `fqn`, in its saved dtype."""
        out = torch.empty(self.shape(fqn), dtype=self.dtype(fqn))
        with _no_process_group_warning():
            dcp.load({MODEL: {fqn: out}}, storage_reader=FsspecReader(self.url), no_dist=True)
        return out


class _LazySavePlanner(DefaultSavePlanner):
    """Plans from meta tensors; each tensor's data comes from `produce(fqn)` when it is written."""

    def __init__(self, produce: Callable[[str], torch.Tensor]):
        super().__init__()
        self.produce = produce

    def resolve_data(self, write_item):
        fqn = write_item.index.fqn
        if not fqn.startswith(MODEL + "."):
            return super().resolve_data(write_item)
        want = self.lookup_object(write_item.index)
        t = self.produce(fqn[len(MODEL) + 1:])
        if tuple(t.shape) != tuple(want.shape) or t.dtype != want.dtype:
            raise ValueError(f"{fqn}: produced {tuple(t.shape)} {t.dtype}, planned {tuple(want.shape)} {want.dtype}")
        return t


def write_checkpoint(url: str, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
                     produce: Callable[[str], torch.Tensor]) -> None:
    """A DCP checkpoint at `url` holding {"model": {fqn: tensor}} for every fqn of `shapes`, each
    tensor made by `produce(fqn)` when the writer gets to it."""
    state = {MODEL: {fqn: torch.empty(shape, dtype=dtype, device="meta") for fqn, (shape, dtype) in shapes.items()}}
    with _no_process_group_warning():
        dcp.save(state, storage_writer=FsspecWriter(url, thread_count=1, sync_files=False),
                 planner=_LazySavePlanner(produce), no_dist=True)
