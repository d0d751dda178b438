"""Leases: which executor may run a step's output folder right now.

A lease is the file `{output}/.lease` holding its owner (host, pid, run id), an expiry time and a
fencing token. It is taken by create-if-absent, renewed and taken over by compare-and-swap, and
never deleted: release marks it released, so the fencing token only ever grows. A worker changes
a folder's status only inside `fence`, which checks that the lease still carries its token; an
executor that lost its lease (paused, partitioned, killed and taken over) therefore never marks a
folder done. docs/leases.md has the whole protocol and its failure cases.

Compare-and-swap per store:
- local files: an exclusive `flock` on the lease file around read-compare-write (atomic between
  processes on one machine; the file is created empty, which reads as "no lease");
- GCS: create with `ifGenerationMatch=0` and replace with `ifGenerationMatch=<generation read>`;
- any other fsspec store (memory:// in tests): a lock inside this process only.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterator

from executor.store import LEASE, Store

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

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        left = self.expires - time.time()
        return f"{self.host} pid {self.pid} (run {self.run_id[:8]}) since {since}, expires in {left:.0f}s"


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
        self._gcs = "gs" in (store.fs.protocol if isinstance(store.fs.protocol, tuple) else (store.fs.protocol,))

    # -- public verbs -----------------------------------------------------------------------------
    def try_acquire(self, dirname: str) -> tuple[LeaseInfo | None, LeaseInfo | None]:
        """(our lease, None) if acquired; (None, the live holder) if someone else holds it."""
        def take(current: LeaseInfo | None) -> LeaseInfo | None:
            now = time.time()  # when the lock is ours, not before waiting for it
            if current is not None and current.live(now) and not self._mine(current):
                return None
            token = (current.token + 1) if current is not None else 1
            return LeaseInfo(self.owner.host, self.owner.pid, self.owner.run_id, token, now, now + self.ttl)

        written, current = self._update(dirname, take)
        return (current, None) if written else (None, current)

    def renew(self, dirname: str, lease: LeaseInfo) -> LeaseInfo | None:
        """Extend our lease; None if it is no longer ours (taken over after it expired)."""
        def extend(current: LeaseInfo | None) -> LeaseInfo | None:
            if current is None or current.token != lease.token or current.released:
                return None
            return replace(current, expires=time.time() + self.ttl)

        written, current = self._update(dirname, extend)
        return current if written else None

    def release(self, dirname: str, lease: LeaseInfo) -> None:
        """Mark our lease released (keeping its token so the next one is larger)."""
        def drop(current: LeaseInfo | None) -> LeaseInfo | None:
            if current is None or current.token != lease.token:
                return None
            return replace(current, released=True, expires=time.time())

        self._update(dirname, drop)

    def holder(self, dirname: str) -> LeaseInfo | None:
        """The current lease, live or not, or None."""
        return self._read(dirname)[0]

    def still_ours(self, dirname: str, token: int) -> bool:
        """Whether the lease is live and still carries `token`."""
        current = self._read(dirname)[0]
        return current is not None and current.token == token and current.live()

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
            yield (current is not None and current.token == token and not current.released
                   and current.expires - time.time() > self.ttl / 4)
            return
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = _load(_read_fd(fd))
            yield current is not None and current.token == token and current.live()
        finally:
            os.close(fd)  # closing releases the flock

    def _mine(self, info: LeaseInfo) -> bool:
        return info.run_id == self.owner.run_id

    # -- compare-and-swap per store ---------------------------------------------------------------
    def _update(self, dirname: str, fn: Update) -> tuple[bool, LeaseInfo | None]:
        path = self.store.path(dirname, LEASE)
        if self.store.is_local:
            return _update_local(path, fn)
        if self._gcs:
            return _update_gcs(self.store, path, fn)
        with self._mutex:
            current = self._read(dirname)[0]
            new = fn(current)
            if new is None:
                return False, current
            self.store.fs.makedirs(self.store.path(dirname), exist_ok=True)
            self.store.fs.pipe_file(path, _dump(new))
            return True, new

    def _read(self, dirname: str) -> tuple[LeaseInfo | None, object]:
        path = self.store.path(dirname, LEASE)
        try:
            if self.store.is_local:
                with open(path, "rb") as f:
                    return _load(f.read()), None
            return _load(self.store.fs.cat_file(path)), None
        except FileNotFoundError:
            return None, None


def _dump(info: LeaseInfo) -> bytes:
    return json.dumps(asdict(info), sort_keys=True).encode()


def _load(data: bytes) -> LeaseInfo | None:
    if not data.strip():
        return None
    try:
        return LeaseInfo(**json.loads(data))
    except (ValueError, TypeError):
        log.warning("corrupt lease file; treating it as expired")
        return LeaseInfo("?", 0, "?", 0, 0.0, 0.0, released=True)


def _update_local(path: str, fn: Update) -> tuple[bool, LeaseInfo | None]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        current = _load(_read_fd(fd))
        new = fn(current)
        if new is None:
            return False, current
        payload = _dump(new)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, payload)
        os.fsync(fd)
        return True, new
    finally:
        os.close(fd)  # closing releases the flock


def _read_fd(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    return data


def _update_gcs(store: Store, path: str, fn: Update) -> tuple[bool, LeaseInfo | None]:
    from executor import gcs  # only needed on gs:// prefixes

    for _ in range(20):
        generation, data = gcs.read_with_generation(store.fs, path)
        current = _load(data) if data is not None else None
        new = fn(current)
        if new is None:
            return False, current
        if gcs.write_if_generation(store.fs, path, _dump(new), generation or 0):
            return True, new
        time.sleep(0.05)  # lost a race: read again and decide again
    return False, _load(gcs.read_with_generation(store.fs, path)[1] or b"")


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
