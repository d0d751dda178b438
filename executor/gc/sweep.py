"""Deleting what `executor.gc.collect` listed (`marin-run ... --gc --yes`), one output folder at a time,
each under its own lease.

The listing is a snapshot; runs may start meanwhile. So the sweeper first reads every lease again
(one batch) and leaves out what a run started since then holds or reads; and before deleting
anything in an output folder it takes that folder's lease like any executor (an output whose lease another
executor holds is skipped as busy: no run starts there while it deletes, and none is running),
reads `.status` again and goes on only if it names the same attempts as when listed. It renews
the lease between deletions and stops at once if the lease was lost. A whole folder goes in this
order: everything but `.status` and `.lease`, then `.status` (inside the lease's fence), then the
lease itself, last, so that no executor ever sees a status without a lease guarding it. A
reached folder keeps its lease file (released), so its fencing tokens keep growing.

On a local disk nothing is followed: a folder is removed with `shutil.rmtree` (which removes
symlinks, never their targets) and only when the path to it still resolves inside the prefix.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from executor.gc.collect import TEMP_GRACE, Item, Report, busy_now, human, mtime_of, status_key
from executor.storage.lease import LeaseInfo, Leases, Owner
from executor.storage.access import error as store_error
from executor.storage.store import LEASE, STATUS, Store

BATCH = 1000  # objects per delete call on an object store, between two lease renewals


@dataclass
class Outcome:
    """What `--yes` did."""

    deleted: list[Item] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # output folder: why it was left alone

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.deleted)

    def describe(self) -> str:
        lines = [f"deleted {len(self.deleted):,} items, {sum(i.files for i in self.deleted):,} files, "
                 f"{human(self.bytes)} ({self.bytes:,} bytes)"]
        lines.extend(f"skipped {why}" for why in self.skipped)
        return "\n".join(lines)


class _Lost(Exception):
    """The lease was taken over while deleting: stop in this folder."""


def sweep(store: Store, report: Report, ttl: float = 60.0, workers: int = 16) -> Outcome:
    """Delete every item of `report`; what changed since it was listed is skipped and said.
    Output folders are independent (each under its own lease): `workers` are swept at once, since
    on an object store each costs a few round trips (lease, status, list, delete, lease)."""
    leases = Leases(store, ttl=ttl, owner=Owner(*_me()))
    outcome = Outcome()
    by_output: dict[str, list[Item]] = {}
    for item in report.items:
        by_output.setdefault(item.output, []).append(item)
    _stray(store, by_output.pop("", []), outcome)
    for output in sorted(set(by_output) & set(busy_now(store, report, ttl))):
        del by_output[output]  # a run started since the listing holds it, or reads it
        outcome.skipped.append(f"{store.url(output)}: in use since it was listed")

    def one(output: str) -> None:
        try:
            _sweep_output(store, leases, report, output, by_output[output], outcome)
        except _Lost:
            outcome.skipped.append(f"{store.url(output)}: its lease was taken over while deleting; stopped there")

    with ThreadPoolExecutor(max(1, workers)) as pool:
        for _ in pool.map(one, sorted(by_output)):  # list.append is atomic: outcome needs no lock
            pass
    return outcome


def _me() -> tuple[str, int, str]:
    import socket

    return socket.gethostname(), os.getpid(), f"gc-{uuid.uuid4().hex}"


def _sweep_output(store: Store, leases: Leases, report: Report, output: str, items: list[Item],
                  outcome: Outcome) -> None:
    lease, holder = leases.try_acquire(output)
    if lease is None:
        outcome.skipped.append(f"{store.url(output)}: busy now ({holder.describe() if holder else 'leased'})")
        return
    keeper = _Keeper(leases, output, lease)
    try:
        if status_key(store.read_status(output)) != report.outputs[output].key():
            outcome.skipped.append(f"{store.url(output)}: its .status changed since it was listed")
            return
        for item in items:
            if item.whole:
                _remove_whole(store, keeper, output)
                keeper.gone = True
            else:
                for path in item.paths:
                    _remove(store, keeper, path)
            outcome.deleted.append(item)
    finally:
        if not keeper.gone:
            leases.release(output, keeper.lease)


class _Keeper:
    """Our lease on one folder, renewed between deletions (no thread: nothing renews it after
    the sweeper stopped, and a lost lease stops the sweeper before its next deletion)."""

    def __init__(self, leases: Leases, dirname: str, lease: LeaseInfo) -> None:
        self.leases, self.dirname, self.lease = leases, dirname, lease
        self.renewed = time.monotonic()
        self.gone = False

    def check(self) -> None:
        if time.monotonic() - self.renewed < self.leases.ttl / 4:
            return
        renewed = self.leases.renew(self.dirname, self.lease)
        if renewed is None:
            raise _Lost(self.dirname)
        self.lease, self.renewed = renewed, time.monotonic()


def _remove_whole(store: Store, keeper: _Keeper, output: str) -> None:
    """A whole output folder: its files, then `.status` under the fence, then the lease."""
    folder = store.path(output)
    if store.is_local:
        _check_inside(store, output)
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name not in (STATUS, LEASE):
                keeper.check()
                _remove_local(store, f"{output}/{entry.name}")
    else:
        store.fs.invalidate_cache(folder)
        found = [p for p in store.fs.find(folder) if p.rpartition("/")[2] not in (STATUS, LEASE)
                 or posixpath.dirname(p) != folder]
        _remove_objects(store, keeper, found)
    keeper.check()
    with keeper.leases.fence(output, keeper.lease.token) as ours:
        if not ours:
            raise _Lost(output)
        _quiet_rm(store, store.path(output, STATUS))
        _quiet_rm(store, store.path(output, LEASE))  # last: from here on any executor may take it
    if store.is_local:  # the emptied folder, and parents the step name made, if nothing else is there
        rel = output
        while rel:
            try:
                os.rmdir(os.path.join(store.root, rel))
            except OSError:
                break
            rel = rel.rpartition("/")[0]


def _remove(store: Store, keeper: _Keeper, path: str) -> None:
    """One file or folder (relative to the prefix)."""
    keeper.check()
    if store.is_local:
        _check_inside(store, path)
        _remove_local(store, path)
        return
    full = store.path(path)
    store.fs.invalidate_cache(full)
    try:
        found = store.fs.find(full) or [full]
    except FileNotFoundError:
        return
    _remove_objects(store, keeper, found)


def _remove_objects(store: Store, keeper: _Keeper, paths: list[str]) -> None:
    for i in range(0, len(paths), BATCH):
        keeper.check()
        chunk = paths[i:i + BATCH]
        try:
            store.fs.rm(chunk)
        except FileNotFoundError:
            pass  # already gone: a retried delete whose first try landed
        except Exception as e:
            raise store_error("delete under", store.url(posixpath.relpath(chunk[0], store.root)), e) from None


def _remove_local(store: Store, rel: str) -> None:
    full = os.path.join(store.root, rel)
    try:
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)  # removes symlinks inside, never what they point at
        else:
            os.unlink(full)
    except FileNotFoundError:
        pass


def _check_inside(store: Store, rel: str) -> None:
    """Refuse a path whose folder no longer resolves to where it was listed (a folder on the way
    swapped for a symlink since): nothing outside the prefix is ever deleted."""
    parent = os.path.dirname(os.path.join(store.root, rel))
    expected = os.path.join(os.path.realpath(store.root), os.path.dirname(rel)).rstrip(os.sep)
    if os.path.realpath(parent) != expected:
        raise store_error("delete", store.url(rel), OSError(f"{parent} now resolves to {os.path.realpath(parent)}, "
                                                             "outside where it was listed"))


def _quiet_rm(store: Store, path: str) -> None:
    try:
        store.fs.rm(path)
    except FileNotFoundError:
        pass


def _stray(store: Store, items: list[Item], outcome: Outcome) -> None:
    """Temporaries outside any output: deleted if still there and still old (no lease guards them)."""
    now = time.time()
    for item in items:
        for rel in item.paths:
            path = store.path(rel)
            try:
                info = store.fs.info(path) if not store.is_local else None
                mtime = os.lstat(path).st_mtime if store.is_local else mtime_of(info)
            except FileNotFoundError:
                continue
            if now - mtime <= TEMP_GRACE:
                continue
            if store.is_local:
                _check_inside(store, rel)
            _quiet_rm(store, path)
        outcome.deleted.append(item)
