"""Leases: which executor may run a step's output folder right now.

A lease is the file `{output}/.lease` holding its owner (host, pid, run id), an expiry time and a
fencing token. It is taken by create-if-absent, renewed and taken over by compare-and-swap, and
never deleted: release marks it released, so the fencing token only ever grows. A worker changes
a folder's status only inside `fence`, which checks that the lease still carries its token; an
executor that lost its lease (paused, partitioned, killed and taken over) therefore never marks a
folder done. docs/leases.md has the whole protocol and its failure cases.

Compare-and-swap per store:
- local files: created whole by a hard link of a written temporary file (never seen empty), then
  read, compared and rewritten in place under an exclusive `flock` (atomic between processes on
  one machine), never truncated first;
- GCS: create with `ifGenerationMatch=0` and replace with `ifGenerationMatch=<generation read>`;
- any other fsspec store (memory:// in tests): a lock inside this process only.

Tokens only grow. A new token is one more than the largest of the lease's and the one the
folder's `.status` records (the status names the token of the attempt that wrote it, so a lease
file restored from an older copy cannot hand out a token twice). A lease file that cannot be
read (empty, torn, edited) is neither free nor a reason to count from 1: it is held until one
ttl after it was last written (the store's own time of the file: mtime, GCS `updated`), and the
token taken after it jumps to the clock in microseconds, which is larger than any token handed
out before (docs/leases.md has the argument).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator

from executor.storage.files import create_local, is_gcs
from executor.storage.access import error as store_error
from executor.storage.store import LEASE, Store

log = logging.getLogger("marin.lease")


@dataclass(frozen=True)
class LeaseInfo:
    """The content of a lease file."""

    host: str
    pid: int
    run_id: str
    token: int
    acquired: float
    expires: float
    released: bool = False

    def live(self, now: float | None = None) -> bool:
        return not self.released and (now or time.time()) < self.expires

    @property
    def unreadable(self) -> bool:
        """A stand-in for a lease file that could not be read: held until `expires`."""
        return self.run_id == UNREADABLE

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        left = self.expires - time.time()
        if self.unreadable:
            return f"an unreadable lease file (last written {since}), held until it expires in {left:.0f}s"
        return f"{self.host} pid {self.pid} (run {self.run_id[:8]}) since {since}, expires in {left:.0f}s"

    @classmethod
    def parse(cls, data: Any) -> "LeaseInfo":
        """A lease from a file's JSON text; ValueError unless every field has its type (a token
        of "7" or 7.5, an expiry of null, `"released": "no"` make the file unreadable, as an
        unparseable one is, never a traceback or a guess)."""
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        kinds = {"host": (str,), "pid": (int,), "run_id": (str,), "token": (int,), "acquired": (int, float),
                 "expires": (int, float), "released": (bool,)}
        for key, value in obj.items():
            want = kinds.get(key)
            if want is None:
                continue
            if (bool in want) != isinstance(value, bool) or not isinstance(value, want) or \
                    (isinstance(value, float) and not math.isfinite(value)):
                raise ValueError(f"{key}: {value!r}")
        return cls(**{k: v for k, v in obj.items() if k in kinds})

    @classmethod
    def unreadable_since(cls, written: float, ttl: float) -> "LeaseInfo":
        return cls("?", 0, UNREADABLE, 0, written, written + ttl)


UNREADABLE = "<unreadable>"


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    run_id: str

    @classmethod
    def me(cls) -> "Owner":
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex)


Update = Callable[["LeaseInfo | None"], "LeaseInfo | None"]


class Leases:
    """Acquire, renew, release and check leases on one store."""

    def __init__(self, store: Store, ttl: float = 60.0, owner: Owner | None = None) -> None:
        self.store = store
        self.ttl = ttl
        self.owner = owner or Owner.me()
        self._mutex = threading.Lock()  # for stores without a compare-and-swap of their own
        self._gcs = is_gcs(store.fs)
        self._first_seen: dict[tuple[str, bytes], float] = {}  # unreadable leases, where the store has no file time

    # -- public verbs -----------------------------------------------------------------------------
    def try_acquire(self, dirname: str) -> tuple[LeaseInfo | None, LeaseInfo | None]:
        """(our lease, None) if acquired; (None, the live holder) if someone else holds it (an
        unreadable lease file counts as held, until one ttl after it was last written)."""
        status = self.store.read_status(dirname)
        recorded = status.token if status is not None and status.token is not None else 0

        def take(current: LeaseInfo | None) -> LeaseInfo | None:
            now = time.time()  # when the lock is ours, not before waiting for it
            if current is not None and current.live(now) and not self._mine(current):
                return None
            token = max(current.token if current is not None else 0, recorded) + 1
            if current is not None and current.unreadable:
                # Every token handed out before was at most the clock (in microseconds) when it
                # was handed out, which was before the file was last written, a ttl ago.
                token = max(token, int(now * 1e6))
            return LeaseInfo(self.owner.host, self.owner.pid, self.owner.run_id, token, now, now + self.ttl)

        written, current = self._update(dirname, take)
        return (current, None) if written else (None, current)

    def renew(self, dirname: str, lease: LeaseInfo) -> LeaseInfo | None:
        """Extend our lease; None if it is no longer ours (taken over after it expired)."""
        def extend(current: LeaseInfo | None) -> LeaseInfo | None:
            if current is None or current.unreadable or current.token != lease.token or current.released:
                return None
            return replace(current, expires=time.time() + self.ttl)

        written, current = self._update(dirname, extend)
        return current if written else None

    def release(self, dirname: str, lease: LeaseInfo) -> None:
        """Mark our lease released (keeping its token so the next one is larger)."""
        def drop(current: LeaseInfo | None) -> LeaseInfo | None:
            if current is None or current.unreadable or current.token != lease.token:
                return None
            return replace(current, released=True, expires=time.time())

        self._update(dirname, drop)

    def holder(self, dirname: str) -> LeaseInfo | None:
        """The current lease, live or not, or None."""
        return self._read(dirname)[0]

    def still_ours(self, dirname: str, token: int) -> bool:
        """Whether the lease is live and still carries `token`."""
        current = self._read(dirname)[0]
        return _carries(current, token)

    @contextmanager
    def fence(self, dirname: str, token: int | None) -> Iterator[bool]:
        """Around a worker's status writes: yields whether the lease still carries `token`.

        On local files the lease's flock is held until the block ends, so no executor can take
        the lease over between the check and the writes inside the block. Elsewhere the lease
        must also have a quarter of its ttl left (a healthy heartbeat keeps three quarters), so
        the writes have that long to land before a takeover is even possible. No token (a step
        run without leases) is always ours.
        """
        if token is None:
            yield True
            return
        path = self.store.path(dirname, LEASE)
        if not self.store.is_local:
            current = self._read(dirname)[0]
            yield _carries(current, token) and current.expires - time.time() > self.ttl / 4
            return
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield _carries(_load_fd(fd, self.ttl), token)
        finally:
            os.close(fd)  # closing releases the flock

    def _mine(self, info: LeaseInfo) -> bool:
        return info.run_id == self.owner.run_id

    # -- compare-and-swap per store ---------------------------------------------------------------
    def _update(self, dirname: str, fn: Update) -> tuple[bool, LeaseInfo | None]:
        path = self.store.path(dirname, LEASE)
        try:
            if self.store.is_local:
                return _update_local(path, fn, self.ttl)
            if self._gcs:
                return _update_gcs(self.store, path, fn, self.ttl, lambda data: self._seen(dirname, data))
            with self._mutex:
                current = self._read(dirname)[0]
                new = fn(current)
                if new is None:
                    return False, current
                self.store.fs.makedirs(self.store.path(dirname), exist_ok=True)
                self.store.fs.pipe_file(path, _dump(new))
                return True, new
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise store_error("update the lease", self.store.to_url(path), e) from None

    def _read(self, dirname: str) -> tuple[LeaseInfo | None, object]:
        """The lease (None: no lease file; an unreadable stand-in for a file that cannot be parsed);
        a read that fails for another reason than "not found" raises StoreError."""
        path = self.store.path(dirname, LEASE)
        try:
            if self.store.is_local:
                fd = os.open(path, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)  # never between another's read and write
                    return _load_fd(fd, self.ttl), None
                finally:
                    os.close(fd)
            data = self.store.fs.cat_file(path)
        except FileNotFoundError:
            return None, None
        except Exception as e:
            raise store_error("read the lease", self.store.to_url(path), e) from None
        return _load(data, lambda: self._written(dirname, path, data), self.ttl), None

    def _written(self, dirname: str, path: str, data: bytes) -> float:
        """When a lease file was last written, by the store's clock; else when we first saw it so."""
        try:
            return self.store.fs.modified(path).timestamp()
        except Exception:  # the store keeps no such time
            return self._seen(dirname, data)

    def _seen(self, dirname: str, data: bytes) -> float:
        return self._first_seen.setdefault((dirname, data), time.time())


def _carries(current: LeaseInfo | None, token: int) -> bool:
    return current is not None and not current.unreadable and current.token == token and current.live()


def _dump(info: LeaseInfo) -> bytes:
    return json.dumps(asdict(info), sort_keys=True).encode()


def _load(data: bytes, written: Callable[[], float], ttl: float) -> LeaseInfo:
    """A lease file's content; unreadable (held until one ttl after `written()`) unless it parses
    as a whole lease."""
    try:
        return LeaseInfo.parse(data)
    except (ValueError, TypeError):
        when = written()
        log.warning("unreadable lease file (%d bytes, last written %s); held until one ttl after that",
                    len(data), time.strftime("%H:%M:%S", time.localtime(when)))
        return LeaseInfo.unreadable_since(when, ttl)


def _load_fd(fd: int, ttl: float) -> LeaseInfo:
    return _load(_read_fd(fd), lambda: os.fstat(fd).st_mtime, ttl)


def _update_local(path: str, fn: Update, ttl: float) -> tuple[bool, LeaseInfo | None]:
    while True:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            new = fn(None)
            if new is None:
                return False, None
            if create_local(path, _dump(new)):
                return True, new
            continue  # another executor created it first: decide again, under its lock
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = _load_fd(fd, ttl)
            new = fn(current)
            if new is None:
                return False, current
            _overwrite(fd, _dump(new))
            return True, new
        finally:
            os.close(fd)  # closing releases the flock


def _overwrite(fd: int, payload: bytes) -> None:
    """Replace the file's content with one write at offset 0, padded with spaces (which JSON
    ignores) to at least the old length: never truncated first, so a writer killed halfway
    leaves the old lease or the new one, not an empty file."""
    size = os.fstat(fd).st_size
    os.pwrite(fd, payload.ljust(size, b" "), 0)
    os.fsync(fd)


def _read_fd(fd: int) -> bytes:
    data = b""
    offset = 0
    while chunk := os.pread(fd, 1 << 16, offset):
        data += chunk
        offset += len(chunk)
    return data


def _update_gcs(store: Store, path: str, fn: Update, ttl: float,
                seen: Callable[[bytes], float]) -> tuple[bool, LeaseInfo | None]:
    from executor.storage import gcs  # only needed on gs:// prefixes

    current: LeaseInfo | None = None
    for _ in range(20):
        found = gcs.read_object(store.fs, path)
        current = None if found is None else _load(found.data, lambda: found.updated or seen(found.data), ttl)
        new = fn(current)
        if new is None:
            return False, current
        if gcs.write_if_generation(store.fs, path, _dump(new), found.generation if found else 0):
            return True, new
        time.sleep(0.05)  # lost a race: read again and decide again
    return False, current


class Heartbeat:
    """Renews a set of leases from one thread; stops (and joins) before any is released.

    Use as a context manager: leases are added while running steps and removed when done. On
    exit the thread is stopped first, and only then are the remaining leases released, so a
    heartbeat can never renew a lease after its release (Marin #5026).
    """

    def __init__(self, leases: Leases, interval: float | None = None) -> None:
        self.leases = leases
        self.interval = interval or max(0.05, leases.ttl / 4)
        self._held: dict[str, LeaseInfo] = {}
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="marin-lease-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            held, self._held = self._held, {}
        for dirname, lease in held.items():
            self.leases.release(dirname, lease)

    def hold(self, dirname: str, lease: LeaseInfo) -> None:
        with self._lock:
            self._held[dirname] = lease

    def drop(self, dirname: str) -> None:
        """Stop renewing one lease and release it."""
        with self._lock:
            lease = self._held.pop(dirname, None)
        if lease is not None:
            self.leases.release(dirname, lease)

    def lost(self, dirname: str) -> bool:
        return dirname in self._lost

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                items = list(self._held.items())
            for dirname, lease in items:
                if self._stop.is_set():
                    return
                try:
                    renewed = self.leases.renew(dirname, lease)
                except Exception as e:  # a flaky store must not kill the heartbeat
                    log.warning("renewing the lease of %s failed: %s", dirname, e)
                    continue
                with self._lock:
                    if dirname not in self._held:
                        continue
                    if renewed is None:
                        log.warning("lease of %s was lost to another executor", dirname)
                        self._lost.add(dirname)
                        self._held.pop(dirname, None)
                    else:
                        self._held[dirname] = renewed
