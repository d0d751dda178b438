"""Output folders on any fsspec store: status, record, manifest, and their lifecycle.

An output folder `{prefix}/{name}-{digest[:10]}` holds the step's files plus three control files:
- `.status`: one small JSON object (`RUNNING`, `FAILED` or `SUCCESS`). `SUCCESS` is written last,
  after the function returned, the manifest was computed, the record was written and the lease
  was confirmed still ours. It also carries what the plan needs to decide CACHED/STALE for a
  whole DAG in one read per step: the full digest, the output digest and the output digests of
  the inputs that were read.
- `.step.json`: the record (`Record`, pydantic): config, digests, code fingerprint, inputs,
  manifest and the history of every attempt.
- `.lease`: see `executor.storage.lease`.
A folder without a readable `SUCCESS` status is never a cache hit, whatever files it holds; a
corrupt `.status` or `.step.json` is reported and treated as not done. A read that fails for
another reason than "not found" (DNS, 403, timeout, a folder where the file should be) is never
"not done": it raises `StoreError` naming the store and the error (`executor.storage.access`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import threading
import time
import uuid
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Iterable

from executor.state import StepState
# Uncommitted writes go to `.tmp-<hex>-<name>` beside their final name (executor.storage.files, which every
# module writes through); `temp_path` is re-exported for the modules that name such files.
from executor.storage.files import TEMP_PREFIX, is_gcs, is_local, local_root, temp_path, write_atomic  # noqa: F401
from executor.storage.access import StoreError, error, probe, store_timeout  # noqa: F401  (StoreError: re-exported)

if TYPE_CHECKING:
    import fsspec

    from executor.storage.records import Attempt, InputInfo, ManifestEntry, Record

log = logging.getLogger("marin.store")

# gcsfs's experimental support of zonal (HNS) buckets asks each bucket's type first: 60 s per bucket
# on gRPC against a local emulator, and a warning per request where credentials are missing. Our
# buckets are regular ones; set the variable to "true" to have gcsfs look.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

STATUS = ".status"
RECORD = ".step.json"
LEASE = ".lease"
_SWAP_LOCK = threading.Lock()
# what a status's `dir` may name: one attempt folder of its own output (executor.storage.attempts.new_dir)
_ATTEMPT_DIR = re.compile(r"\.attempts/(?!\.\.?$)[A-Za-z0-9._-]+")
CONTROL_FILES = frozenset({STATUS, RECORD, LEASE, ".resolved.json"})  # the last: executor.storage.attempts.RESOLVED
# The states a `.status` holds (executor.state: one vocabulary; on disk the same strings as ever).
RUNNING, SUCCESS, FAILED = StepState.RUNNING, StepState.SUCCESS, StepState.FAILED

# The record's models (pydantic) live in executor.storage.records and are imported on first use: a plan
# reads only `.status` files, and pydantic's import was a tenth of a whole dry-run.
_RECORD_MODELS = ("Attempt", "InputInfo", "ManifestEntry", "Record")


def __getattr__(name: str) -> Any:
    if name in _RECORD_MODELS:
        from executor.storage import records

        return getattr(records, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Status:
    """`{output}/.status`.

    A plain class read field by field (`model_validate_json`), not a pydantic model: a plan reads
    one per step before anything else, and the check is as strict as a JSON type check can be
    (each field of its JSON type, a number never a string or a bool, unknown keys ignored so newer
    files still read); `parse_status` adds what a status must hold to be believed. The method
    names are pydantic's, which the rest of the executor calls."""

    state: StepState
    digest: str = ""
    output_digest: str | None = None
    # input name -> the output digest read from it; files written before inputs were keyed by
    # name (two inputs may share a digest) say "digest": input digest -> output digest
    inputs: dict[str, str | None] = field(default_factory=dict)
    inputs_by: str = "digest"
    time: float = field(default_factory=time.time)
    attempt: int = 0
    token: int | None = None
    code: str = ""  # code fingerprint of the step function that made it
    env: str = ""  # digest of the package versions it was made with (executor.environment); "" before
    commit: str = ""  # the git commit it was made from ("abc123def456[-dirty]"; "" unknown or before)
    # Where this attempt writes, relative to the output folder (`.attempts/<id>`, executor.storage.attempts);
    # "" in folders written before attempts had folders of their own (the data is the folder itself).
    dir: str = ""
    # While an attempt runs or after it failed: the SUCCESS status it would replace, which stays
    # the served output until a new attempt commits (None: nothing committed yet).
    committed: Status | None = None

    def __post_init__(self) -> None:
        if type(self.state) is not StepState:
            self.state = StepState(self.state)  # a state's string names it; anything else is a ValueError

    def served(self) -> Status | None:
        """The committed SUCCESS this status serves: itself, the one a running or failed attempt
        would replace, or None."""
        return self if self.state == SUCCESS else self.committed

    def data_dir(self, dirname: str) -> str:
        """The folder (relative to the prefix) of this status's attempt."""
        return f"{dirname}/{self.dir}" if self.dir else dirname

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict (`committed` as a dict too), as written to `.status`; with
        `mode="json"` the state is a plain string."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["inputs"] = dict(self.inputs)
        out["committed"] = self.committed.model_dump(mode) if self.committed is not None else None
        if mode == "json":
            out["state"] = self.state.value
        return out

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(), separators=(",", ":"))

    def model_copy(self, update: dict[str, Any] | None = None) -> Status:
        """A copy with the fields in `update` replaced."""
        return replace(self, **(update or {}))

    @classmethod
    def model_validate_json(cls, data: bytes | str) -> Status:
        """The status in a `.status` file's bytes (UTF-8 JSON); ValueError naming what is wrong."""
        return cls.from_json(_DECODER.decode(data.decode() if isinstance(data, (bytes, bytearray)) else data))

    @classmethod
    def from_json(cls, obj: Any, where: str = "") -> Status:
        if type(obj) is not dict:
            raise ValueError(f"{where or 'the file'}: a JSON object is needed, not {type(obj).__name__}")
        state = obj.get("state")
        if type(state) is not str or state not in _STATE_OF:
            raise ValueError(f"{where}state: {state!r} is not a step state")
        kwargs: dict[str, Any] = {"state": _STATE_OF[state]}
        for name, value in obj.items():
            kinds = _FIELD_TYPES.get(name)
            if kinds is None:
                continue  # `state` (read above), or a key of a newer writer's
            if type(value) not in kinds:  # exact types: a bool is no int here, a string no number
                raise ValueError(f"{where}{name}: {value!r} is not {_KIND_WORDS[name]}")
            kwargs[name] = value
        inputs = kwargs.get("inputs")
        if inputs:
            for key, value in inputs.items():
                if value is not None and type(value) is not str:
                    raise ValueError(f"{where}inputs.{key}: {value!r} is not a string or null")
        if kwargs.get("committed") is not None:
            kwargs["committed"] = cls.from_json(kwargs["committed"], f"{where}committed.")
        return cls(**kwargs)


_DECODER = json.JSONDecoder()
_STATE_OF = {s.value: s for s in StepState}
_NULL = type(None)
_FIELD_TYPES: dict[str, frozenset[type]] = {
    "digest": frozenset({str}), "output_digest": frozenset({str, _NULL}), "inputs": frozenset({dict}),
    "inputs_by": frozenset({str}), "time": frozenset({float, int}), "attempt": frozenset({int}),
    "token": frozenset({int, _NULL}), "code": frozenset({str}), "env": frozenset({str}), "commit": frozenset({str}),
    "dir": frozenset({str}), "committed": frozenset({dict, _NULL})}
_WORDS = {str: "a string", float: "a number", int: "an integer", dict: "an object", _NULL: "null"}
_KIND_WORDS = {name: " or ".join(_WORDS[k] for k in (str, float, int, dict, _NULL)
                                 if k in kinds and not (k is int and float in kinds))
               for name, kinds in _FIELD_TYPES.items()}


def url_to_fs(url: str, **storage_options: Any) -> tuple[Any, str]:
    """fsspec's filesystem and path for a URL; local folders create parents on write."""
    import fsspec

    if "://" not in url or url.startswith("file://"):
        storage_options.setdefault("auto_mkdir", True)
    return fsspec.core.url_to_fs(url, **storage_options)


class Store:
    """The prefix under which every output lives, on one fsspec filesystem.

    On a local folder the filesystem (`fs`) is made on first use: a plan reads `.status` files
    with plain `open` (as it always did there) and so needs no fsspec, whose import scans the
    metadata of every installed package. Everything else goes through `fs` as before."""

    def __init__(self, prefix: str, **storage_options: Any) -> None:
        self.prefix = prefix.rstrip("/") or "/"
        self._options = storage_options
        root = local_root(self.prefix)
        if root is not None:
            self._fs: fsspec.AbstractFileSystem | None = None
            self.is_local, self._scheme, self._reached = True, "", True
        else:
            self._fs, root = url_to_fs(self.prefix, **storage_options)
            self.is_local = is_local(self._fs)
            protocol = self._fs.protocol if isinstance(self._fs.protocol, str) else self._fs.protocol[0]
            self._scheme = "" if self.is_local else f"{protocol}://"
            self._reached = self.is_local or not is_gcs(self._fs)  # other stores: their library's retries
        self.root = root.rstrip("/")

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem of the prefix."""
        if self._fs is None:  # a local folder's: by its absolute path, whatever the working folder is now
            self._fs = url_to_fs(self.root or "/", **self._options)[0]
        return self._fs

    # -- paths ---------------------------------------------------------------------------------
    def url(self, dirname: str) -> str:
        """The URL of an output folder, as steps see it."""
        return f"{self.prefix}/{dirname}"

    def path(self, dirname: str, *parts: str) -> str:
        """The filesystem path (no protocol) of a folder or a file inside it."""
        return posixpath.join(self.root, dirname, *parts)

    def served_dir(self, dirname: str) -> str:
        """The folder (relative to the prefix) of the attempt an output folder's `.status`
        commits; the folder itself if none does (executor.storage.attempts)."""
        status = self.read_status(dirname)
        served = status.served() if status is not None else None
        return served.data_dir(dirname) if served is not None else dirname

    def to_url(self, fs_path: str) -> str:
        return fs_path if self.is_local else self._scheme + fs_path

    # -- probing ---------------------------------------------------------------------------------
    def reach(self) -> None:
        """Raise StoreError, within MARIN_STORE_TIMEOUT seconds, if the store does not answer at
        all (asked once per Store, before its first read; GCS only)."""
        if self._reached:
            return
        timeout = store_timeout()
        try:
            probe(self.fs, self.root, timeout)
        except Exception as e:
            raise error("reach the store", self.prefix, e, timeout) from None
        self._reached = True

    def check_writable(self) -> None:
        """Raise StoreError if nothing can be written under the prefix; leaves nothing behind."""
        self.reach()
        path = posixpath.join(self.root, f".marin-probe-{uuid.uuid4().hex}")

        def write_and_remove(**bound: Any) -> None:
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(path, b"ok", **bound)
            try:
                self.fs.rm(path, **bound)
            except FileNotFoundError:  # a retried delete whose first try landed
                pass

        try:
            self._bounded(write_and_remove, "write under", self.prefix)
        except NotADirectoryError as e:
            raise error("write under", self.prefix, e) from None

    # -- status ----------------------------------------------------------------------------------
    def read_statuses(self, dirnames: list[str]) -> dict[str, Status | None]:
        """The status of many folders (None: no status file); one concurrent batch on remote
        stores. Raises StoreError if any cannot be read for another reason than "not found"."""
        paths = [self.path(d, STATUS) for d in dirnames]
        if self.is_local:
            raw = {p: _read_local(p) for p in paths}
        elif paths:
            self.reach()
            raw = self._bounded(lambda **bound: self.fs.cat(paths, on_error="return", **bound), "read", self.prefix,
                                per=len(paths))
        else:
            raw = {}
        out: dict[str, Status | None] = {}
        for d, p in zip(dirnames, paths):
            data = raw.get(p) if raw else None
            if isinstance(data, BaseException) and not isinstance(data, FileNotFoundError):
                raise error("read", self.to_url(p), data)
            status = out[d] = _parse_status(p, data)
            if self.is_local and status is not None and self.missing_dir(d, status):
                log.warning("status %s names attempt folder %s, which does not exist; treating the step as not "
                            "done", p, (status.served() or status).dir)
                out[d] = None
        return out

    def sync(self, dirname: str) -> None:
        """On a local disk, fsync every file and folder under `dirname` (an attempt's folder),
        so that a commit record written next never names files a power loss would empty. Object
        stores keep an upload once it is acknowledged: nothing to do there."""
        if not self.is_local:
            return
        root = self.path(dirname)
        for folder, _dirs, names in os.walk(root, followlinks=False):
            for name in names:
                path = os.path.join(folder, name)
                if os.path.islink(path):
                    continue
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:  # gone meanwhile, or not a regular file: not the step's output
                    continue
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def missing_dir(self, dirname: str, status: Status) -> bool:
        """Whether the attempt folder that `status` serves is missing (a local disk only: one
        stat; elsewhere it is found when read). Such a status is corrupt, never CACHED."""
        served = status.served()
        return served is not None and bool(served.dir) and not os.path.isdir(self.path(dirname, served.dir))

    def _bounded(self, call: Any, action: str, where: str, per: int = 1) -> Any:
        """`call()` cut off on async stores (fsspec's `sync` takes the timeout) after
        MARIN_STORE_TIMEOUT seconds per thousand files read (`per`), its failures as StoreError."""
        timeout = store_timeout() * (1 + per // 1000)
        try:
            return call(**({"timeout": timeout} if getattr(self.fs, "async_impl", False) else {}))
        except (FileNotFoundError, NotADirectoryError):  # absent (a file where a folder would be): the caller's case
            raise
        except Exception as e:
            raise error(action, where, e, timeout) from None

    def read_status(self, dirname: str) -> Status | None:
        return self.read_statuses([dirname])[dirname]

    def write_status(self, dirname: str, status: Status) -> None:
        self.write_json(self.path(dirname, STATUS), status.model_dump())

    # -- record ----------------------------------------------------------------------------------
    def read_record(self, dirname: str, status: Status | None = None, latest: bool = False) -> Record | None:
        """The record of the output the folder serves, else of its newest attempt (`latest`: of
        its newest attempt, committed or not), found through its `.status` (read unless given);
        None if there is none (or it is corrupt, with a warning); StoreError if it cannot be read."""
        if status is None:
            status = self.read_status(dirname)
        which = status if latest or status is None else (status.served() or status)
        if which is None:
            return None
        return self.read_record_in(which.data_dir(dirname))

    def read_record_in(self, folder: str) -> Record | None:
        """The record `.step.json` of one attempt's folder (relative to the prefix)."""
        from pydantic import ValidationError

        from executor.storage.records import Record

        path = self.path(folder, RECORD)
        try:
            data = self._bounded(lambda **bound: self.fs.cat_file(path, **bound), "read", self.to_url(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return Record.model_validate_json(data)
        except (ValidationError, ValueError) as e:
            log.warning("corrupt record %s (%s); treating the step as not done",
                        self.to_url(path), str(e).splitlines()[0])
            return None

    def record_paths(self, folders: dict[str, Status | None]) -> dict[str, str]:
        """The path of the record of each output folder with a status, for batch reads: of the
        attempt it serves, else of its newest attempt (a failed one's record keeps the error)."""
        return {d: self.path((s.served() or s).data_dir(d), RECORD) for d, s in folders.items() if s is not None}

    def write_record(self, folder: str, record: Record) -> None:
        """Write the record of the attempt whose folder (relative to the prefix) is `folder`."""
        record.updated = time.time()
        self.write_json(self.path(folder, RECORD), json.loads(record.model_dump_json()))

    def swap_status(self, dirname: str, expect: Status | None, new: Status) -> bool:
        """Replace `.status` with `new` only if it still names the attempt of `expect` (state,
        attempt, token and folder): the commit. Atomic on every store; on GCS one write with
        `ifGenerationMatch` of the status read, so nothing written in between is overwritten.
        The caller holds the lease's fence (executor.storage.lease.Leases.fence)."""
        path = self.path(dirname, STATUS)
        key = lambda s: None if s is None else (s.state, s.attempt, s.token, s.dir)  # noqa: E731
        if is_gcs(self.fs):
            from executor.storage import gcs

            found = gcs.read_object(self.fs, path)
            current = None if found is None else _parse_status(path, found.data)
            if key(current) != key(expect):
                return False
            data = json.dumps(new.model_dump(), indent=1, sort_keys=True).encode()
            return gcs.write_if_generation(self.fs, path, data, found.generation if found is not None else 0)
        with contextlib.nullcontext() if self.is_local else _SWAP_LOCK:
            # local: the caller's fence holds the lease's flock; elsewhere (memory://, tests) a lock
            # of the process makes read, compare and write one step, as a generation match does
            if key(self.read_status(dirname)) != key(expect):
                return False
            self.write_status(dirname, new)
        return True

    def newest_sibling_record(self, name: str, exclude: str | None = None) -> Record | None:
        """The newest record of another output folder of the same step name (for reasons)."""
        parent, _, base = f"{self.root}/{name}".rpartition("/")
        pattern = re.compile(re.escape(base) + r"-[0-9a-f]{10}$")
        self.reach()
        try:
            entries = self._bounded(lambda **bound: self.fs.ls(parent, detail=False, **bound), "list",
                                    self.to_url(parent))
        except (FileNotFoundError, NotADirectoryError):
            return None
        best: Record | None = None
        for entry in entries:
            leaf = entry.rstrip("/").rpartition("/")[2]
            if not pattern.match(leaf) or (exclude and leaf == exclude.rpartition("/")[2]):
                continue
            rec = self.read_record(posixpath.relpath(entry.rstrip("/"), self.root))
            if rec is not None and (best is None or rec.updated > best.updated):
                best = rec
        return best

    # -- output lifecycle --------------------------------------------------------------------------
    def clear_partial(self, dirname: str) -> None:
        """Remove everything a failed or interrupted attempt left, but the control files."""
        folder = self.path(dirname)
        try:
            # refresh: an object store's listing cache may predate another process's writes
            entries = self.fs.ls(folder, detail=False, refresh=True)
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.rstrip("/").rpartition("/")[2] in CONTROL_FILES:
                continue
            _remove(self.fs, entry, recursive=True)

    def clear_temporaries(self, dirname: str) -> list[str]:
        """Remove the uncommitted writes a killed attempt left (names starting with `.tmp-`, the
        convention of docs/writing-steps.md), anywhere under the output. Run before each attempt
        of a resumable step, whose folder otherwise survives: only the lease holder writes there,
        so every such file belongs to an attempt that is gone, and left alone it would enter the
        manifest and the output digest. Returns what it removed."""
        folder = self.path(dirname)
        # An object store's listing cache may predate another process's writes, and what this
        # listing caches must not outlive it: the step lists its own folder next.
        self.fs.invalidate_cache(folder)
        try:
            found = self.fs.find(folder, withdirs=False)
        except FileNotFoundError:
            found = []
        finally:
            self.fs.invalidate_cache(folder)
        stale = [p for p in found if posixpath.basename(p.rstrip("/")).startswith(TEMP_PREFIX)]
        for path in stale:
            _remove(self.fs, path, recursive=False)
        return stale

    def manifest(self, dirname: str, is_log: Any = None) -> list[ManifestEntry]:
        """Every file of the output (control files excluded): relative path, size, checksum.
        Files that `is_log(relpath)` says are logs are listed with `log` set and no checksum."""
        from executor.storage.records import ManifestEntry

        folder = self.path(dirname)
        entries: list[ManifestEntry] = []
        try:
            found = self.fs.find(folder, detail=True)
        except FileNotFoundError:
            found = {}
        for path, info in sorted(found.items()):
            rel = posixpath.relpath(path, folder)
            if rel in CONTROL_FILES or info.get("type") == "directory" or rel.startswith(".attempts/"):
                continue  # (an old-layout folder's root may hold attempt folders: never its data)
            if info.get("islink") and self.is_local and os.path.isdir(path):
                continue  # a link to a folder (W&B's `latest-run`): its files are listed on their own
            if is_log is not None and is_log(rel):
                entries.append(ManifestEntry(path=rel, size=int(info.get("size") or 0), checksum="", log=True))
                continue
            entries.append(ManifestEntry(path=rel, size=int(info.get("size") or 0),
                                         checksum=self._checksum(path, info)))
        return entries

    def _checksum(self, path: str, info: dict[str, Any]) -> str:
        # The store's own checksum where it keeps one (GCS md5), so nothing is read back.
        md5 = info.get("md5Hash")
        if md5:
            return "md5:" + base64.b64decode(md5).hex()
        if info.get("crc32c"):
            return "crc32c:" + base64.b64decode(info["crc32c"]).hex()
        digest = hashlib.md5(usedforsecurity=False)
        with self.fs.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
        return "md5:" + digest.hexdigest()

    # -- io -------------------------------------------------------------------------------------
    def write_json(self, path: str, obj: Any) -> None:
        """Write a small JSON file so that readers see the old or the new content, never half."""
        write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode(), fs=self.fs, fsync=True)


def output_digest(manifest: Iterable[ManifestEntry]) -> str:
    """One digest over the manifest's artifacts (not its logs): equal iff the same files with the
    same bytes."""
    body = json.dumps([[e.path, e.size, e.checksum] for e in manifest if not e.log], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _remove(fs: fsspec.AbstractFileSystem, path: str, recursive: bool = False) -> None:
    """Delete; already gone counts as done (a retried delete whose first try landed says 404)."""
    try:
        fs.rm(path, recursive=recursive)
    except FileNotFoundError:
        pass


def _read_local(path: str) -> bytes | OSError | None:
    """The bytes of a local file, None if there is none, or the OSError that reading it raised.
    Read with the OS's calls: a plan reads one per step, and a Python file object asks the OS
    more (fstat twice) than the read itself."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # a file where a folder of the path would be: no status
        return None
    except OSError as e:
        return e
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:  # a folder where the file should be (EISDIR comes from the read)
        return e
    finally:
        os.close(fd)


# What a `.status` must hold to be believed: a SUCCESS names the recipe digest it was made for and
# the output digest of what it commits; any state names the digest (a hand-edited or truncated
# file holding only `{"state": "SUCCESS"}` is corrupt, never a cache hit).
_REQUIRED = {SUCCESS: ("digest", "output_digest"), RUNNING: ("digest",), FAILED: ("digest",)}


def _parse_status(path: str, data: Any) -> Status | None:
    if data is None or isinstance(data, FileNotFoundError):
        return None
    status, problem = parse_status(data)
    if status is None:
        log.warning("corrupt status file %s (%s); treating the step as not done", path, problem)
    return status


def parse_status(data: bytes | str) -> tuple[Status | None, str]:
    """(the status, "") or (None, why the bytes are not a status a plan may believe)."""
    try:
        status = Status.model_validate_json(data)
        missing = [k for k in _REQUIRED.get(status.state, ()) if not getattr(status, k)]
        if missing:
            raise ValueError(f"{status.state} without {', '.join(missing)}")
        if status.committed is not None and status.committed.state != SUCCESS:
            raise ValueError("its committed output is not a SUCCESS")
        for where in (status, status.committed):
            if where is not None and where.dir and not _ATTEMPT_DIR.fullmatch(where.dir):
                raise ValueError(f"dir {where.dir!r} is not an attempt folder of its own (.attempts/ID)")
        return status, ""
    except (ValueError, RecursionError) as e:  # JSON, UTF-8 and field errors are ValueErrors
        return None, (str(e).splitlines() or [type(e).__name__])[0]
