"""Model tensors of a DCP checkpoint read one at a time, and a DCP checkpoint written one tensor at
a time, by FQN. Layout-agnostic: a checkpoint saved from any world size, sharding or wrapping
holds each tensor as chunks that DCP assembles into the full logical tensor by name.

Reading: each tensor is one `dcp.load` of a one-entry state dict, so only that tensor's chunks
are read from storage (plus DCP's metadata file, which lists every chunk).

Writing: `dcp.save` plans from a state dict of meta tensors (shapes and dtypes only) and asks its
planner for each tensor's data only when the writer reaches it (`resolve_data`); ours produces
it then, from a function. With one writer thread and one file per tensor the tensors are
produced, written and dropped one by one, so the model is never whole in memory.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from typing import Callable, Iterator

import fsspec
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
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
        self.storage: dict[str, list] = {}
        for index, info in (getattr(meta, "storage_data", None) or {}).items():
            if index.fqn.startswith(prefix):
                self.storage.setdefault(index.fqn[len(prefix):], []).append(info)

    def shape(self, fqn: str) -> tuple[int, ...]:
        return tuple(self.entries[fqn].size)

    def dtype(self, fqn: str) -> torch.dtype:
        return self.entries[fqn].properties.dtype

    def load(self, fqn: str) -> torch.Tensor:
        """The full tensor `fqn`, in its saved dtype."""
        whole = self._load_whole_chunk(fqn)
        if whole is not None:
            return whole
        out = torch.empty(self.shape(fqn), dtype=self.dtype(fqn))
        with _no_process_group_warning():
            dcp.load({MODEL: {fqn: out}}, storage_reader=FsspecReader(self.url), no_dist=True)
        return out

    def _load_whole_chunk(self, fqn: str) -> torch.Tensor | None:
        """A tensor saved as one chunk, read as DCP's reader reads a chunk (torch.load of its byte
        range) but returned as it comes: DCP would copy it into a second, preallocated tensor,
        twice the memory. None when the layout is anything else (sharded, transformed, another
        serialization): then `load` goes through dcp.load."""
        md, infos = self.entries[fqn], self.storage.get(fqn, [])
        if len(md.chunks) != 1 or len(infos) != 1 or getattr(infos[0], "transform_descriptors", None):
            return None
        if any(md.chunks[0].offsets) or tuple(md.chunks[0].sizes) != tuple(md.size):
            return None
        info = infos[0]
        fs, root = fsspec.core.url_to_fs(self.url)
        try:
            with fs.open(f"{root}/{info.relative_path}", "rb") as f:
                t = torch.load(_ByteRange(f, info.offset, info.length), map_location="cpu", weights_only=True)
        except Exception:  # e.g. a checkpoint saved in DCP's safetensors format
            return None
        ok = isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape(fqn) and t.dtype == self.dtype(fqn)
        return t if ok else None


class _ByteRange(io.RawIOBase):
    """A read-only, seekable view of bytes [offset, offset + length) of an open file."""

    def __init__(self, f, offset: int, length: int):
        self.f, self.offset, self.length, self.pos = f, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, min(self.length, base + pos))
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.length - self.pos)
        if n <= 0:
            return 0
        self.f.seek(self.offset + self.pos)
        got = self.f.readinto(memoryview(buf)[:n])
        self.pos += got or 0
        return got or 0


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
        # One file per tensor: DCP's writer keeps every tensor of a file until that file is
        # closed (torch 2.13), so one file for all would hold the whole model.
        from steps.train.checkpoint import Writer  # no per-save uuid: the same weights, the same bytes

        dcp.save(state, storage_writer=Writer(url, single_file_per_rank=False, thread_count=1, sync_files=False),
                 planner=_LazySavePlanner(produce), no_dist=True)
