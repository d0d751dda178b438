"""safetensors files on any fsspec URL, written and read one tensor at a time.

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
range; "__metadata__" -> {"format": "pt"}), then the tensors' bytes back to back. Because the
shard plan (which tensor goes in which file, in which order) is made from shapes alone, a shard's
header is written first and each tensor's bytes are streamed after it as it is produced: a shard
is never held in memory, and on gs:// nothing is staged on local disk. (The `safetensors`
package writes a file from a dict of tensors held in memory; the tests read our files with it.)
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Iterable, Iterator

import fsspec
import torch

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
DTYPES_BACK = {v: k for k, v in DTYPES.items()}
_ALIGN = 8  # the header is padded with spaces so the data starts 8-byte aligned
CONVERT_BLOCK = 1 << 24  # elements converted and written at a time (64 MB of fp32)


@dataclass(frozen=True)
class Entry:
    """A tensor to write: its name, shape and dtype (torch)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize


def plan_shards(entries: Iterable[Entry], max_bytes: int) -> list[list[Entry]]:
    """Entries in order, cut into shards of at most `max_bytes` (a tensor larger than that gets a
    shard of its own)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return [s for s in shards if s]


def header_bytes(entries: list[Entry]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    return struct.pack("<Q", len(raw)) + raw


def write_file(url: str, entries: list[Entry], tensors: Iterable[torch.Tensor]) -> int:
    """Write one safetensors file: the header for `entries`, then each tensor of `tensors` (one
    per entry, in order, each checked against its entry's shape and converted to its dtype on the
    way out). Returns the bytes written."""
    written = 0
    with fsspec.open(url, "wb") as f:
        head = header_bytes(entries)
        f.write(head)
        written += len(head)
        stream = iter(tensors)
        for e in entries:
            t = next(stream, None)
            if t is None:
                raise ValueError(f"{url}: no tensor for {e.name}")
            if tuple(t.shape) != e.shape or not (t.dtype == e.dtype or t.is_floating_point() == e.dtype.is_floating_point):
                raise ValueError(f"{url}: {e.name} is {tuple(t.shape)} {t.dtype}, planned {e.shape} {e.dtype}")
            flat = t.detach().reshape(-1)
            # Converted (when the dtypes differ) and written a block at a time: no second copy of a
            # large tensor in the target dtype.
            for lo in range(0, flat.numel(), CONVERT_BLOCK):
                block = flat[lo:lo + CONVERT_BLOCK].to(e.dtype).contiguous()
                f.write(memoryview(block.view(torch.uint8).numpy()))
            written += e.nbytes
            del t  # hold nothing while the next tensor is made
        if next(stream, None) is not None:
            raise ValueError(f"{url}: more tensors than entries")
    return written


class SafetensorsFile:
    """One safetensors file's header, and its tensors read one at a time by byte range."""

    def __init__(self, url: str):
        self.url = url
        self.fs, self.path = fsspec.core.url_to_fs(url)
        with self.fs.open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError(f"{url}: not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
        self.metadata = header.pop("__metadata__", {}) or {}
        self.start = 8 + n
        self.entries = header
        end = max((v["data_offsets"][1] for v in header.values()), default=0)
        size = self.fs.size(self.path)
        if size != self.start + end:  # cut short (or padded): refuse before anything is read from it
            raise ValueError(f"{url} is {size} bytes, its header says {self.start + end}")

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        code = self.entries[name]["dtype"]
        if code not in DTYPES_BACK:
            raise ValueError(f"{self.url}: {name} has dtype {code}, which we do not read")
        return DTYPES_BACK[code]

    def read(self, name: str) -> torch.Tensor:
        lo, hi = self.entries[name]["data_offsets"]
        flat = torch.empty(hi - lo, dtype=torch.uint8)  # read straight into the tensor: no second copy
        got = 0
        with self.fs.open(self.path, "rb") as f:
            f.seek(self.start + lo)
            view = memoryview(flat.numpy())
            while got < hi - lo:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
        if got != hi - lo:
            raise ValueError(f"{self.url}: {name} is cut short ({got} of {hi - lo} bytes)")
        return flat.view(self.dtype(name)).reshape(self.shape(name))


def iter_folder(files: dict[str, SafetensorsFile]) -> Iterator[tuple[str, SafetensorsFile]]:
    """(tensor name, its file) over a folder's files, file by file in name order."""
    for _, f in sorted(files.items()):
        for name in f.names():
            yield name, f
