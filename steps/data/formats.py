"""On-disk formats of the data steps, and a Ray-free reader/writer for each.

Documents: JSONL shards, one object per line (`id`, `text`, optional `metadata`), plain or
compressed (`.gz`, `.zst`), listed by a `manifest.json` (format `marin-documents/1`).

Tokens: per shard a flat little-endian array `NAME.tokens` (uint16 when the vocabulary fits,
else uint32) and `NAME.offsets`, int64, the start of every document plus the end (so
`documents + 1` entries, first 0), listed by a `manifest.json` (format `marin-tokens/1`) with
token and document counts, the tokenizer and each shard's source (named relative to the folder
when in the same prefix, see `steps.data.paths`; `read_tokens_manifest` resolves them).

Every file is written through the executor's one atomic-write helper (`executor.AtomicFile`:
a temporary name renamed into place, or on an object store an upload committed at the end), and
a shard counts as done only once its ledger marker exists, so a half-written shard is never taken
for a finished one.
The trainer reads tokens with `TokenDataset`, which needs no Ray (only the executor's file
helpers).
"""

from __future__ import annotations

import gzip
import json
import posixpath
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import fsspec
import numpy as np
import zstandard

from executor import AtomicFile, is_local, write_atomic
from steps.data.paths import resolve

DOCS_FORMAT = "marin-documents/1"
TOKENS_FORMAT = "marin-tokens/1"
MANIFEST = "manifest.json"
DOC_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst", ".parquet")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


# -- URLs -------------------------------------------------------------------------------------

def url_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(url)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def expand(spec: str | Sequence[str], suffixes: Sequence[str] = DOC_SUFFIXES) -> list[str]:
    """URLs of the input files named by `spec`: URLs, globs or folders (searched recursively
    for files ending in `suffixes`, skipping hidden and `_`-prefixed names), sorted, deduplicated."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    found: list[str] = []
    for one in specs:
        fs, path = url_fs(one)
        if any(c in path for c in "*?["):
            hits = sorted(p for p in fs.glob(path) if not posixpath.basename(p).startswith((".", "_")))
        elif fs.isdir(path):
            hits = sorted(p for p in fs.find(path) if p.endswith(tuple(suffixes))
                          and not any(part.startswith((".", "_")) for part in p[len(path):].split("/") if part))
        elif fs.exists(path):
            hits = [path]
        else:
            raise FileNotFoundError(f"no such input: {one}")
        found += [fs.unstrip_protocol(h) if "://" in one else h for h in hits]
    return list(dict.fromkeys(found))


def document_shards(spec: str | Sequence[str]) -> list[str]:
    """The document shards of a data step's output folder (from its manifest), or of a glob."""
    if isinstance(spec, str):
        fs, path = url_fs(spec)
        if fs.isdir(path) and fs.exists(posixpath.join(path, MANIFEST)):
            manifest = read_json(join(spec, MANIFEST))
            return [join(spec, s["path"]) for s in manifest["shards"]]
    return expand(spec)


# -- small files, written atomically ----------------------------------------------------------

def read_json(url: str) -> Any:
    with fsspec.open(url, "r") as f:
        return json.load(f)


def write_json(url: str, obj: Any) -> None:
    write_bytes(url, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def write_bytes(url: str, data: bytes) -> None:
    """Write a file that readers see whole or not at all (`executor.write_atomic`)."""
    write_atomic(url, data)


# -- documents --------------------------------------------------------------------------------


def open_lines(url: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The raw lines (without newline) of a (possibly compressed) text file, streamed in chunks.

    A stream that breaks off (a truncated gzip or zstd file) raises EOFError only after every
    complete line before the break was produced."""
    fs, path = url_fs(url)
    with fs.open(path, "rb") as raw:
        if path.endswith(".zst"):
            chunks: Iterator[bytes] = _zstd_chunks(raw, chunk)
        elif path.endswith(".gz"):
            chunks = _gzip_chunks(raw, chunk)
        else:
            chunks = iter(lambda: raw.read(chunk), b"")
        tail = b""
        for data in chunks:
            lines = (tail + data).split(b"\n")
            tail = lines.pop()
            yield from lines
        if tail:
            yield tail


def _gzip_chunks(raw: Any, size: int) -> Iterator[bytes]:
    d, inside = zlib.decompressobj(16 + zlib.MAX_WBITS), False
    while True:
        data = raw.read(size)
        if not data:
            if inside:
                raise EOFError("gzip stream ended before its end marker")
            return
        while data:
            inside = True
            yield d.decompress(data)
            if d.eof:  # another gzip member may follow
                data = d.unused_data
                d, inside = zlib.decompressobj(16 + zlib.MAX_WBITS), False
            else:
                data = b""


def _zstd_chunks(raw: Any, size: int) -> Iterator[bytes]:
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    while True:
        try:
            data = reader.read(size)
        except zstandard.ZstdError as e:
            raise EOFError(f"zstd stream broken: {e}") from e
        if not data:
            return
        yield data


def iter_documents(url: str) -> Iterator[dict]:
    """The documents of one normalized shard, in order."""
    for line in open_lines(url):
        if line.strip():
            yield json.loads(line)


def iter_text_batches(url: str, batch_docs: int) -> Iterator[list[str]]:
    """The texts of one normalized shard in lists of at most `batch_docs`."""
    batch: list[str] = []
    loads = json.loads
    for line in open_lines(url):
        if line.strip():
            batch.append(loads(line)["text"])
            if len(batch) >= batch_docs:
                yield batch
                batch = []
    if batch:
        yield batch


class DocumentWriter:
    """Streams documents into one JSONL shard (zstd-compressed when the name ends in .zst),
    committed atomically on close."""

    def __init__(self, url: str) -> None:
        self.url, self.count = url, 0
        self._atomic = AtomicFile(url)
        self._raw = self._atomic.__enter__()
        if url.endswith(".zst"):
            self._out = zstandard.ZstdCompressor(level=3).stream_writer(self._raw, closefd=False)
        elif url.endswith(".gz"):
            self._out = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6, mtime=0)
        else:
            self._out = self._raw
        self._buf: list[bytes] = []
        self._size = 0

    def write(self, doc: dict) -> None:
        line = (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8")
        self._buf.append(line)
        self._size += len(line)
        self.count += 1
        if self._size >= 1 << 20:
            self._flush()

    def _flush(self) -> None:
        self._out.write(b"".join(self._buf))
        self._buf, self._size = [], 0

    def close(self, ok: bool = True) -> None:
        if ok:
            self._flush()
            if self._out is not self._raw:
                self._out.close()
            self._atomic.__exit__(None)
        else:
            self._atomic.__exit__(RuntimeError)

    def __enter__(self) -> "DocumentWriter":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.close(ok=exc_type is None)


def write_documents(url: str, docs: Iterable[dict]) -> int:
    """Write `docs` as one shard; returns how many."""
    with DocumentWriter(url) as w:
        for d in docs:
            w.write(d)
    return w.count


# -- tokens -----------------------------------------------------------------------------------

class TokenShardWriter:
    """Streams one token shard: `NAME.tokens` and `NAME.offsets` under folder `url`, both
    committed only by `close()`; memory holds one batch, not the shard."""

    def __init__(self, url: str, name: str, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.tokens = 0
        self.documents = 0
        self._tok = AtomicFile(join(url, f"{name}.tokens"))
        self._off = AtomicFile(join(url, f"{name}.offsets"))
        self._tf, self._of = self._tok.__enter__(), self._off.__enter__()
        self._of.write(np.zeros(1, np.int64).tobytes())

    def write(self, flat: np.ndarray, doc_lengths: np.ndarray) -> None:
        """Append documents given as one flat array of ids and their lengths."""
        self._tf.write(np.ascontiguousarray(flat, dtype=self.dtype).tobytes())
        ends = self.tokens + np.cumsum(doc_lengths, dtype=np.int64)
        self._of.write(ends.tobytes())
        self.tokens += int(flat.size)
        self.documents += int(len(doc_lengths))

    def close(self, ok: bool = True) -> None:
        err = None if ok else RuntimeError
        self._tok.__exit__(err)
        self._off.__exit__(err)

    def __enter__(self) -> "TokenShardWriter":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.close(ok=exc_type is None)


@dataclass
class _Shard:
    name: str
    tokens: int
    documents: int
    start: int  # first token's index in the whole dataset


def read_tokens_manifest(url: str) -> dict[str, Any]:
    """The manifest of a token dataset folder, its tokenizer and shard sources resolved to URLs."""
    folder = url.rstrip("/")
    manifest = read_json(join(folder, MANIFEST))
    if isinstance(manifest.get("tokenizer"), str):
        manifest["tokenizer"] = resolve(manifest["tokenizer"], folder)
    for shard in manifest.get("shards", []):
        if isinstance(shard.get("source"), str):
            shard["source"] = resolve(shard["source"], folder)
    return manifest


class TokenDataset:
    """A tokenized dataset (the output of `tokenize`) read from any fsspec URL.

    Local shards are memory-mapped; remote ones are read by byte range. `tokens(start, n)` reads
    across shard boundaries, `document(i)` returns one document's ids.
    """

    def __init__(self, url: str, verify: bool = False) -> None:
        self.url = url.rstrip("/")
        self.manifest = read_tokens_manifest(self.url)
        if self.manifest.get("format") != TOKENS_FORMAT:
            raise ValueError(f"{url}: not a token dataset (format {self.manifest.get('format')!r})")
        self.dtype = np.dtype(self.manifest["dtype"])
        self.fs, self._root = url_fs(self.url)
        self._local = is_local(self.fs)
        self.shards: list[_Shard] = []
        start = 0
        for s in self.manifest["shards"]:
            self.shards.append(_Shard(s["name"], s["tokens"], s["documents"], start))
            start += s["tokens"]
        self._starts = np.array([s.start for s in self.shards] + [start], dtype=np.int64)
        self._doc_starts = np.cumsum([0] + [s.documents for s in self.shards], dtype=np.int64)
        self._maps: dict[str, np.ndarray] = {}
        self._check_sizes()
        if verify:
            self.verify()

    def verify(self) -> None:
        """Read every shard file and compare its md5 with the checksum the executor's record of
        this output (`.step.json` beside the manifest: its `manifest`) holds; a ValueError naming
        the first that differs. Reads the whole dataset: for an audit, not for every open."""
        import hashlib

        try:
            record = read_json(join(self.url, ".step.json"))
        except FileNotFoundError:
            raise ValueError(f"{self.url}: no record (.step.json) beside the manifest to verify against") from None
        sums = {e.get("path"): e.get("checksum", "") for e in record.get("manifest") or []}
        for s in self.shards:
            for suffix in ("tokens", "offsets"):
                rel = f"shards/{s.name}.{suffix}"
                want = sums.get(rel, "")
                if not want.startswith("md5:"):
                    raise ValueError(f"{self.url}: the record has no md5 of {rel} to verify against")
                digest = hashlib.md5(usedforsecurity=False)
                with self.fs.open(posixpath.join(self._root, rel), "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 22), b""):
                        digest.update(chunk)
                if "md5:" + digest.hexdigest() != want:
                    raise ValueError(f"{self.url}: shard {s.name}: {rel} does not have the content its record says "
                                     f"(md5 {digest.hexdigest()[:12]}, recorded {want[4:16]}): not read")

    def _check_sizes(self) -> None:
        """Each shard's files hold exactly the bytes its manifest says (one listing): a shard cut
        short (a copy interrupted, a disk that lost a write) would read short without error, and
        whatever counts tokens would count the short data."""
        if not self.shards:
            return
        folder = posixpath.join(self._root, "shards")
        try:
            entries = self.fs.ls(folder, detail=True)
        except FileNotFoundError:
            entries = []
        found = {posixpath.relpath(e["name"].rstrip("/"), folder.rstrip("/")): int(e.get("size") or 0)
                 for e in entries}
        for s in self.shards:
            for suffix, want in (("tokens", s.tokens * self.dtype.itemsize), ("offsets", (s.documents + 1) * 8)):
                have = found.get(f"{s.name}.{suffix}")
                if have != want:
                    what = "is missing" if have is None else f"holds {have} bytes"
                    raise ValueError(f"{self.url}: shard {s.name}: {s.name}.{suffix} {what}, the manifest says {want} "
                                     "(cut short or replaced): not read")

    @property
    def num_tokens(self) -> int:
        return int(self._starts[-1])

    @property
    def num_documents(self) -> int:
        return int(self._doc_starts[-1])

    def __len__(self) -> int:
        return self.num_tokens

    def _array(self, name: str, suffix: str, dtype: np.dtype, start: int, stop: int) -> np.ndarray:
        path = posixpath.join(self._root, f"shards/{name}.{suffix}")
        if self._local:
            key = f"{name}.{suffix}"
            if key not in self._maps:
                self._maps[key] = np.memmap(path, dtype=dtype, mode="r")
            return np.asarray(self._maps[key][start:stop])
        data = self.fs.cat_file(path, start * dtype.itemsize, stop * dtype.itemsize)
        return np.frombuffer(data, dtype=dtype)

    def tokens(self, start: int, n: int) -> np.ndarray:
        """Tokens `start .. start+n` of the concatenation of all shards."""
        parts = [self._array(self.shards[k].name, "tokens", self.dtype, lo, hi) for k, lo, hi in self.spans(start, n)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def spans(self, start: int, n: int) -> list[tuple[int, int, int]]:
        """Where tokens `start .. start+n` lie: (shard index, first, end) within each shard."""
        if start < 0 or start + n > self.num_tokens:
            raise IndexError(f"tokens {start}..{start + n} out of range 0..{self.num_tokens}")
        out = []
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        while n > 0:
            shard = self.shards[k]
            lo = start - shard.start
            take = min(n, shard.tokens - lo)
            if take > 0:
                out.append((k, lo, lo + take))
            start, n, k = start + take, n - take, k + 1
        return out

    def read_spans(self, spans: Sequence[tuple[int, int, int]]) -> list[np.ndarray]:
        """The tokens of each (shard index, first, end): memory-mapped locally, else one batch
        of range reads (`fs.cat_ranges`, which an object store's filesystem issues concurrently)."""
        if self._local or not spans:
            return [self._array(self.shards[k].name, "tokens", self.dtype, lo, hi) for k, lo, hi in spans]
        size = self.dtype.itemsize
        paths = [posixpath.join(self._root, f"shards/{self.shards[k].name}.tokens") for k, _, _ in spans]
        blobs = self.fs.cat_ranges(paths, [lo * size for _, lo, _ in spans], [hi * size for _, _, hi in spans],
                                   on_error="raise")  # fsspec's default returns the exceptions in the list
        return [np.frombuffer(b, dtype=self.dtype) for b in blobs]

    def offsets(self, shard: int) -> np.ndarray:
        s = self.shards[shard]
        return self._array(s.name, "offsets", np.dtype(np.int64), 0, s.documents + 1)

    def document(self, i: int) -> np.ndarray:
        """The ids of document `i` (counting across shards)."""
        k = int(np.searchsorted(self._doc_starts, i, side="right")) - 1
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range 0..{self.num_documents}")
        s = self.shards[k]
        lo, hi = self._array(s.name, "offsets", np.dtype(np.int64), i - int(self._doc_starts[k]),
                             i - int(self._doc_starts[k]) + 2)
        return self._array(s.name, "tokens", self.dtype, int(lo), int(hi))
