"""Files that readers see whole or not at all, on any fsspec store; and what kind of store it is.

Every module that commits a file (the store's control files, the live page, the data formats,
the trainer's metrics) writes it through `AtomicFile` or `write_atomic`, so there is one rule:
- on a filesystem (a local disk, memory://), the bytes go to a temporary name beside the final
  one, `.tmp-<hex>-<name>`, which is renamed into place on success and removed on failure. A
  killed writer leaves only such a name, which `Store.clear_temporaries` recognizes;
- on an object store (gs://, s3://, ...), an object becomes visible only once its upload is
  finalized, so the file is written in place with `autocommit=False`: committed on success, its
  upload discarded on failure. A rename there buys nothing and costs requests (gcsfs tries the
  `moveTo` API and, where it is missing, copies and deletes, which leaves the temporary object
  behind if the writer dies in between).

`is_object_store` is the one place that decides which of the two a filesystem is; `is_local`
and `is_gcs` are the other two questions the executor asks of a filesystem (memory-map a path?
use GCS generation preconditions?).
"""

from __future__ import annotations

import logging
import os
import posixpath
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # fsspec is imported where a filesystem is made (its import scans every installed package)
    import fsspec

log = logging.getLogger("marin.files")

# Uncommitted writes go to `.tmp-<hex>-<name>` beside their final name.
TEMP_PREFIX = ".tmp-"


def temp_path(path: str) -> str:
    """Where to write `path` before an atomic rename into place."""
    head, tail = posixpath.split(path)
    return posixpath.join(head, f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{tail}")


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """A local disk: paths are OS paths (open, flock, memory-map)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def is_gcs(fs: fsspec.AbstractFileSystem) -> bool:
    """Google Cloud Storage through gcsfs (generation preconditions, md5 per object)."""
    return bool({"gs", "gcs"} & set(_protocols(fs)))


def is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    """An object store: no atomic rename and no exclusive create of its own, but uploads that
    become visible only once finalized. Everything but a local disk and memory://."""
    from fsspec.implementations.memory import MemoryFileSystem

    return not (is_local(fs) or isinstance(fs, MemoryFileSystem))


def url_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """fsspec's filesystem and path for a URL."""
    import fsspec

    return fsspec.core.url_to_fs(url)


def local_root(url: str) -> str | None:
    """The path fsspec's local filesystem gives for `url` (a folder, or a `file://` URL), worked
    out without importing fsspec; None for anything else (another protocol, a chained URL, a
    path fsspec would read as a protocol, a non-POSIX OS). tests/executor/storage/test_store.py checks it
    against fsspec's own answer."""
    path = url[len("file://"):] if url.startswith("file://") else url
    if os.sep != "/" or "://" in path or "::" in path or path.startswith(("file:", "local:", "data:")):
        return None
    if path.startswith("~"):  # as fsspec's make_path_posix: expanded, and taken as it comes out
        path = os.path.expanduser(path)
    elif not path.startswith("/"):
        path = f"{os.getcwd()}/{path[2:] if path.startswith('./') else '' if path == '.' else path}"
    return path.rstrip("/") or "/"


class AtomicFile:
    """A file, given by URL (or by path on `fs`), that readers see whole or not at all.

        with AtomicFile("gs://bucket/out/shard.bin") as f:
            f.write(data)

    `fsync` (filesystems only) makes the bytes durable before the rename, for small files whose
    presence means something (a status, a ledger marker after its shard)."""

    def __init__(self, url: str, fs: fsspec.AbstractFileSystem | None = None, fsync: bool = False,
                 **object_options: Any) -> None:
        if fs is None:
            fs, url = url_fs(url)
        self.fs, self.path, self.fsync = fs, url, fsync
        self.in_place = is_object_store(fs)
        self.tmp = temp_path(self.path)
        self.object_options = object_options
        self.f: Any = None

    def __enter__(self) -> Any:
        head = posixpath.dirname(self.path)
        if self.in_place:
            self.f = self.fs.open(self.path, "wb", autocommit=False, **self.object_options)
        elif is_local(self.fs):
            os.makedirs(head, exist_ok=True)
            self.f = open(self.tmp, "wb")
        else:
            self.fs.makedirs(head, exist_ok=True)
            self.f = self.fs.open(self.tmp, "wb")
        return self.f

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if self.in_place:
            self.f.close()  # with autocommit=False: uploaded (or held) but not visible yet
            if exc_type is None:
                self.f.commit()
                self.fs.invalidate_cache(self.path)  # a listing made before the commit lacks it
            else:
                try:
                    self.f.discard()
                except Exception as e:  # never committed, so never visible; the upload merely lingers
                    log.warning("could not cancel the upload of %s: %s", self.path, e)
            return
        if is_local(self.fs):
            try:
                if exc_type is None and self.fsync:
                    self.f.flush()
                    os.fsync(self.f.fileno())
            finally:
                self.f.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
            else:
                _remove_quietly(self.tmp)
            return
        self.f.close()
        if exc_type is None:
            self.fs.mv(self.tmp, self.path)
        else:
            self.fs.rm(self.tmp)


def write_atomic(url: str, data: bytes, fs: fsspec.AbstractFileSystem | None = None, fsync: bool = False,
                 **object_options: Any) -> None:
    """Write `data` to `url` (or to path `url` on `fs`) so that readers see the old content or
    the new, never half. `object_options` go to the object store's upload (content type...)."""
    if fs is None:
        fs, url = url_fs(url)
    if is_object_store(fs):
        fs.pipe_file(url, data, **object_options)  # one upload: atomic by itself
        return
    with AtomicFile(url, fs=fs, fsync=fsync) as f:
        f.write(data)


def create_local(path: str, data: bytes) -> bool:
    """Create the local file `path` holding `data`, only if no such file exists, in one step:
    nobody ever sees it empty or half written. False if it already existed."""
    tmp = temp_path(path)
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # fails if `path` exists: exclusive create, with the content already in
        return True
    except FileExistsError:
        return False
    finally:
        _remove_quietly(tmp)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
