"""Garbage collection by reachability: what under a prefix no named voyage's plan reaches.

`marin-run A.py [B.py ...] --gc` lists it and `--yes` deletes it (`executor.gc.sweep` does the
deleting; docs/gc.md). One listing of the prefix (one paginated
request stream on GCS, a walk that never follows a symlink on disk) gives every file with its
size; the output folders are the folders named `{name}-{digest[:10]}` that hold a `.status`, a
`.lease` or `.attempts/`. Then, per output folder:

- **reached** (its dirname is a node of a named voyage's DAG): kept, but for its attempts that
  `.status` does not name (neither the served attempt nor the newest one, which a resumable step
  resumes and whose record carries the history the next attempt copies), the files of a failed or
  interrupted newest attempt of a step that is not resumable (it never resumes them; its record
  stays), files outside any attempt once the served output lives in one, and `.tmp-*` writes of a
  killed attempt (those a resume would clear).
- **not reached**: the whole folder: "not reached by the named configs" when a named voyage has a
  step of that name (an old version, or the voyage under overrides not named), else a step that
  none of the named voyages has.
Never touched, whatever the above says: an output with a live lease (a run in progress) and every
output its records say it reads; a pinned output and, through the records, every output it was
made from, transitively; an output folder holding a symlink that leaves the prefix (refused and
listed), except W&B's own log link (`wandb/<run>/logs/debug-core.log` -> W&B's `core-debug-*.log`
in its cache: deleting the folder removes the link, never its target); an output whose `.status`
was written less than `grace` seconds ago (default `GRACE_S`: a reader that resolved the attempt
it replaced moments ago may still be reading it, and a run that just finished may be one that no
named voyage knows). Pins name output folders (`name-0123456789`) or step names (every version of it), in
`{prefix}/pins.txt` (one a line, `#` comments) or returned by the voyage's `pins(config)`.
Outside output folders only stray temporaries go (`.tmp-*`, `.marin-probe-*`) older than an hour;
everything else there (voyage pages, the pins file) is left alone.
"""

from __future__ import annotations

import datetime
import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from executor.storage.attempts import ATTEMPTS
from executor.errors import VoyageError
from executor.storage.files import TEMP_PREFIX
from executor.storage.lease import LeaseInfo
from executor.storage.access import error as store_error
from executor.storage.store import LEASE, RECORD, STATUS, SUCCESS, Status, Store

PINS_FILE = "pins.txt"
TEMP_GRACE = 3600.0  # a temporary outside any output younger than this may be a write in flight
GRACE_S = 300.0  # an output whose .status is younger than this is kept whole (--gc-grace)
# W&B's link from a run's logs to its core service's log in W&B's cache, outside the prefix
_WANDB_LINK = re.compile(r"(^|/)wandb/[^/]+/logs/debug-core\.log$")
_WANDB_TARGET = re.compile(r"(^|/)core-debug-[^/]*\.log$")
_OUTPUT = re.compile(r"^(?P<name>.+)-[0-9a-f]{10}$")  # `{name}-{digest[:10]}` (executor.dag.Node.dirname)
_STRAY = (TEMP_PREFIX, ".marin-probe-")  # executor.storage.files temporaries; Store.check_writable's probes

# What an item is, as the table says it.
# a folder of a step name the named voyages have, under another digest: an old version, or the
# same voyage under other overrides (a config the command line did not name): it cannot tell which
OLD = "not reached by the named configs"
UNKNOWN = "not in these voyages"
ABANDONED = "abandoned attempt"
FAILED_FILES = "failed attempt's files"
OUTSIDE = "files outside any attempt"
TEMPORARY = "temporaries"


class GcError(VoyageError):
    """A pin that names nothing, or whose record cannot say what it depends on: exit 2, nothing deleted."""


@dataclass(frozen=True)
class Entry:
    """One file under the prefix (a symlink is a file here: it is never followed)."""

    size: int
    mtime: float
    link: str | None = None  # a symlink's target
    escapes: bool = False  # the symlink resolves outside the prefix


@dataclass(frozen=True)
class Pin:
    """An output folder or a step name to keep, and where it was named (for errors)."""

    text: str
    where: str
    must_exist: bool = True  # a Step a voyage pins need not have run yet


@dataclass
class Item:
    """One thing `--yes` deletes: a whole output folder, an attempt folder, or some files."""

    step: str  # the step name ("" for temporaries outside any output)
    output: str  # the output folder, relative to the prefix ("" outside any output)
    kind: str
    paths: list[str]  # relative to the prefix; folders are deleted whole
    files: int
    bytes: int

    @property
    def whole(self) -> bool:
        return self.kind in (OLD, UNKNOWN)


@dataclass
class Output:
    """An output folder as listed: its files (relative to it) and what decides its fate."""

    dirname: str
    files: dict[str, Entry] = field(default_factory=dict)
    status: Status | None = None  # None: no `.status`, or one that cannot be believed
    lease: LeaseInfo | None = None

    @property
    def step(self) -> str:
        """The step name: the folder without its `-{digest[:10]}`."""
        return step_of(self.dirname)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def attempts(self) -> dict[str, list[str]]:
        """Attempt folder (`.attempts/<id>`) -> its files."""
        out: dict[str, list[str]] = defaultdict(list)
        for rel in self.files:
            parts = rel.split("/")
            if parts[0] == ATTEMPTS and len(parts) > 2:
                out[f"{ATTEMPTS}/{parts[1]}"].append(rel)
        return out

    def key(self) -> tuple | None:
        """What deleting in this folder was decided on: `.status`'s attempt and served attempt."""
        return status_key(self.status)


def step_of(dirname: str) -> str:
    """`tokenized/kjv-0123456789` -> `tokenized/kjv`."""
    return dirname[:-11] if _OUTPUT.match(dirname.rpartition("/")[2]) else dirname


def status_key(status: Status | None) -> tuple | None:
    """What an output's `.status` says is served and newest: what deleting in it was decided on."""
    if status is None:
        return None
    served = status.served()
    return (status.state, status.attempt, status.token, status.dir, served.dir if served else None,
            served.attempt if served else None)


@dataclass
class Report:
    """What `--gc` found: the items to delete, and what it keeps and why."""

    prefix: str
    items: list[Item]
    outputs: dict[str, Output]
    kept: dict[str, list[int]]  # why -> [outputs or files, bytes]
    refused: list[str]
    listed_files: int
    listed_bytes: int
    seconds: float

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def table(self) -> str:
        """Bytes per step and kind, largest first, then the totals."""
        rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for item in self.items:
            row = rows[(item.step or "(outside any output)", item.kind)]
            row[0] += 1
            row[1] += item.files
            row[2] += item.bytes
        order = sorted(rows.items(), key=lambda kv: (-kv[1][2], kv[0]))
        width = max([len(s) for s, _ in rows] + [4])
        lines = [f"{'step':<{width}}  {'what':<32} {'items':>6} {'files':>8} {'bytes':>11}"]
        for (step, kind), (n, files, size) in order:
            lines.append(f"{step:<{width}}  {kind:<32} {n:>6,} {files:>8,} {human(size):>11}")
        by_kind: dict[str, int] = defaultdict(int)
        for item in self.items:
            by_kind[item.kind] += 1
        kinds = ", ".join(f"{n:,} {k}{'s' if n > 1 and k == ABANDONED else ''}"
                          for k, n in sorted(by_kind.items()))
        lines.append(f"to collect: {len(self.items):,} items ({kinds or 'none'}), "
                     f"{sum(i.files for i in self.items):,} files, {human(self.bytes)} ({self.bytes:,} bytes)")
        kept = "; ".join(f"{why}: {n:,}, {human(size)}" for why, (n, size) in self.kept.items() if n)
        lines.append(f"kept: {kept or 'nothing'}")
        unknown = by_kind.get(UNKNOWN, 0)
        if unknown:
            lines.append(f"note: {unknown:,} output folder{'s' if unknown > 1 else ''} of steps no named voyage has: "
                         "name every voyage that uses this prefix, or pin what to keep")
        lines.extend(f"refused: {why}" for why in self.refused)
        lines.append(f"listed {self.listed_files:,} files ({human(self.listed_bytes)}) under {self.prefix} "
                     f"in {self.seconds:.2f} s")
        return "\n".join(lines)


def human(n: int) -> str:
    """Bytes in binary units, three significant digits."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    return f"{n} B"


# -- listing -------------------------------------------------------------------------------------------

def list_prefix(store: Store) -> tuple[dict[str, Entry], list[str]]:
    """Every file under the prefix (relative path -> Entry) and the names refused as unsafe; a
    symlink is listed, never followed, and marked when it resolves outside the prefix."""
    if store.is_local:
        return _walk_local(store.root)
    store.reach()
    try:
        store.fs.invalidate_cache(store.root)  # another process's writes since this process listed
        found = store.fs.find(store.root, detail=True, withdirs=False)
    except FileNotFoundError:
        return {}, []
    except Exception as e:
        raise store_error("list", store.prefix, e) from None
    out: dict[str, Entry] = {}
    refused: list[str] = []
    base = store.root.rstrip("/") + "/"
    for path, info in found.items():
        if info.get("type") == "directory" or path.endswith("/") or not path.startswith(base):
            continue
        rel = path[len(base):]
        if any(seg in ("", ".", "..") for seg in rel.split("/")):
            refused.append(f"{store.to_url(path)}: an object name with an empty, '.' or '..' segment")
            continue
        out[rel] = Entry(int(info.get("size") or 0), mtime_of(info))
    return out, refused


def mtime_of(info: dict) -> float:
    """A listed object's time (fsspec's `mtime`, GCS's `updated`), as seconds since the epoch."""
    value = info.get("mtime") or info.get("updated") or info.get("created")
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return time.time()  # unknown: as if just written, so never old enough to be stray


def _walk_local(root: str) -> tuple[dict[str, Entry], list[str]]:
    real_root = os.path.realpath(root)
    out: dict[str, Entry] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            it = os.scandir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for e in it:
                r = f"{rel}/{e.name}" if rel else e.name
                if e.is_symlink():  # listed as itself: never followed, never counted by its target
                    target = os.path.realpath(e.path)
                    escapes = not (target == real_root or target.startswith(real_root + os.sep))
                    out[r] = Entry(0, e.stat(follow_symlinks=False).st_mtime, os.readlink(e.path), escapes)
                elif e.is_dir(follow_symlinks=False):
                    stack.append(r)
                else:
                    st = e.stat(follow_symlinks=False)
                    out[r] = Entry(st.st_size, st.st_mtime)
    return out, []


def find_outputs(files: dict[str, Entry], known: Iterable[str] = ()) -> tuple[dict[str, Output], dict[str, Entry]]:
    """Group the listing into output folders (the outermost folder named `{name}-{digest10}` that
    holds a control file or `.attempts/`, plus the `known` dirnames) and the files outside any."""
    candidates = set(known)
    for rel in files:
        parts = rel.split("/")
        last = len(parts) - 1
        for i in range(1, last + 1):
            seg = parts[i]
            if (seg == ATTEMPTS or (i == last and seg in (STATUS, LEASE))) and _OUTPUT.match(parts[i - 1]):
                candidates.add("/".join(parts[:i]))
                break  # the outermost: what lies deeper belongs to it
    outputs: dict[str, Output] = {}
    outside: dict[str, Entry] = {}
    for rel, entry in files.items():
        cut = rel.find("/")
        while cut != -1 and rel[:cut] not in candidates:
            cut = rel.find("/", cut + 1)
        if cut == -1:
            outside[rel] = entry
        else:
            head = rel[:cut]
            found = outputs.get(head)
            if found is None:
                found = outputs[head] = Output(head)
            found.files[rel[cut + 1:]] = entry
    return outputs, outside


# -- pins ------------------------------------------------------------------------------------------------

def read_pins_file(store: Store) -> list[Pin]:
    """`{prefix}/pins.txt`: one output folder or step name a line; `#` starts a comment."""
    path = store.path(PINS_FILE)
    try:
        text = store.fs.cat_file(path).decode()
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise GcError(f"{store.url(PINS_FILE)}: not UTF-8 text") from None
    except Exception as e:
        raise store_error("read", store.url(PINS_FILE), e) from None
    pins = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip().strip("/")
        if line:
            pins.append(Pin(line, f"{store.url(PINS_FILE)}:{n}"))
    return pins


def _resolve_pins(pins: list[Pin], outputs: dict[str, Output]) -> dict[str, str]:
    """Pinned output folder -> where it was pinned; a pin naming nothing is an error (a typo would
    otherwise delete what it meant to keep)."""
    by_step: dict[str, list[str]] = defaultdict(list)
    for d, out in outputs.items():
        by_step[out.step].append(d)
    found: dict[str, str] = {}
    for pin in pins:
        if pin.text in outputs:
            hits = [pin.text]
        else:
            hits = by_step.get(pin.text, [])
        if not hits and pin.must_exist:
            raise GcError(f"{pin.where}: pin {pin.text!r} names no output folder and no step under the prefix; "
                          "nothing deleted")
        for d in hits:
            found.setdefault(d, pin.where)
    return found


# -- deciding ---------------------------------------------------------------------------------------------

def wandb_link(rel: str, entry: Entry) -> bool:
    """Whether a symlink of an output is W&B's own link to its core service's log (it points
    out of the prefix, into W&B's cache): removing it removes the link only."""
    return entry.link is not None and bool(_WANDB_LINK.search(rel)) and bool(_WANDB_TARGET.search(entry.link))


def collect(store: Store, reached: dict[str, bool], pins: list[Pin] = (), ttl: float = 60.0,
            now: float | None = None, grace: float = GRACE_S) -> Report:
    """What under the prefix `reached` (dirname -> whether its step type is resumable, every node
    of the named voyages' DAGs) does not reach, and what is kept and why. Reads only: one listing,
    the `.status` and `.lease` of each output folder (batched), the records of the pinned and busy
    outputs. `ttl`: an unreadable lease file counts as live until one ttl after it was written.
    `grace`: an output whose `.status` was written less than this many seconds ago is kept whole."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    files, refused = list_prefix(store)
    outputs, outside = find_outputs(files, reached)
    names = sorted(outputs)
    statuses = store.read_statuses(names)
    for d in names:
        outputs[d].status = statuses[d]
    _read_leases(store, outputs, ttl, now)

    reached_steps = {step_of(d) for d in reached}
    pinned = _closure(store, outputs, _resolve_pins(list(pins), outputs), "pinned", strict=True)
    busy = _closure(store, outputs, {d: "live lease" for d, o in outputs.items() if o.lease is not None and
                                     o.lease.live(now)}, "in use", strict=False)
    kept: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    items: list[Item] = []
    # Folders that hold a kept output deeper down (a step named `a-0123456789/b` lives inside `a`'s).
    holders = {k.rsplit("/", n)[0] for k in (*reached, *pinned, *busy) for n in range(1, k.count("/") + 1)}
    for d in names:
        out = outputs[d]
        escaping = [f"{store.url(d)}/{rel} -> {e.link}" for rel, e in out.files.items()
                    if e.escapes and not wandb_link(rel, e)]
        committed = out.files.get(STATUS)
        recent = committed is not None and now - committed.mtime < grace
        why = ("pinned" if d in pinned else "in use (a live lease, or read by one)" if d in busy else
               "refused (a symlink leaves the prefix)" if escaping else
               f"committed less than {grace:g}s ago (--gc-grace)" if recent else "")
        if not why and d not in reached and d in holders:
            why = "holds a kept output"
        if why:
            kept[why][0] += 1
            kept[why][1] += out.bytes
            refused.extend(f"{link}: a symlink that leaves the prefix; {d} left alone" for link in escaping)
            continue
        if d in reached:
            found = _within(out, reached[d])
            items.extend(found)
            kept["reached outputs"][0] += 1
            kept["reached outputs"][1] += out.bytes - sum(i.bytes for i in found)
        else:
            items.append(Item(out.step, d, OLD if out.step in reached_steps else UNKNOWN, [d], len(out.files),
                              out.bytes))
    for rel, entry in sorted(outside.items()):
        base = rel.rpartition("/")[2]
        if entry.escapes:
            refused.append(f"{store.url(rel)} -> {entry.link}: a symlink that leaves the prefix; left alone")
        elif base.startswith(_STRAY) and now - entry.mtime > TEMP_GRACE and rel != PINS_FILE:
            items.append(Item("", "", TEMPORARY, [rel], 1, entry.size))
            continue
        kept["not outputs (pages, pins)"][0] += 1
        kept["not outputs (pages, pins)"][1] += entry.size
    return Report(store.prefix, items, outputs, dict(kept), refused, len(files),
                  sum(e.size for e in files.values()), time.perf_counter() - started)


def busy_now(store: Store, report: Report, ttl: float = 60.0) -> dict[str, str]:
    """The output folders in use now (a live lease, or read by an output that has one), read
    again just before deleting: runs that started since the listing keep their inputs."""
    now = time.time()
    outputs = {d: Output(d, out.files, out.status) for d, out in report.outputs.items()}
    _read_leases(store, outputs, ttl, now)
    live = {d: "live lease" for d, o in outputs.items() if o.lease is not None and o.lease.live(now)}
    return _closure(store, outputs, live, "in use", strict=False)


def _within(out: Output, resumable: bool) -> list[Item]:
    """What goes inside a reached output folder (see the module docstring)."""
    status = out.status
    if status is None:
        return []  # never run, or a corrupt `.status`: which attempt is served is unknown, keep all
    served = status.served()
    keep = {s.dir for s in (status, served) if s is not None and s.dir}
    items: list[Item] = []
    attempts = out.attempts()
    for folder, rels in sorted(attempts.items()):
        if folder in keep:
            continue
        items.append(Item(out.step, out.dirname, ABANDONED, [f"{out.dirname}/{folder}"], len(rels),
                          sum(out.files[r].size for r in rels)))
    newest = status.dir if status.state != SUCCESS and status.dir and (served is None or served.dir != status.dir) \
        else ""
    if newest:
        rels = attempts.get(newest, [])
        if resumable:  # its lineage resumes here: only what a killed writer left uncommitted goes
            rels = [r for r in rels if r.rpartition("/")[2].startswith(TEMP_PREFIX)]
            kind = TEMPORARY
        else:  # a fresh attempt never reads it; its record (error, history) stays
            rels = [r for r in rels if r != f"{newest}/{RECORD}"]
            kind = FAILED_FILES
        if rels:
            items.append(_files_item(out, kind, rels))
    top = [r for r in out.files if "/" not in r and r not in (STATUS, LEASE)]
    temps = [r for r in top if r.startswith(TEMP_PREFIX)]
    if temps:
        items.append(_files_item(out, TEMPORARY, temps))
    legacy = [r for r in top if not r.startswith(TEMP_PREFIX)] + \
        [r for r in out.files if "/" in r and r.split("/")[0] != ATTEMPTS]
    if legacy and status.dir and (served is None or served.dir):
        # Made before attempts had folders, then run again in one: nothing resolves these.
        items.append(_files_item(out, OUTSIDE, legacy))
    return items


def _files_item(out: Output, kind: str, rels: list[str]) -> Item:
    return Item(out.step, out.dirname, kind, [f"{out.dirname}/{r}" for r in sorted(rels)], len(rels),
                sum(out.files[r].size for r in rels))


def _read_leases(store: Store, outputs: dict[str, Output], ttl: float, now: float) -> None:
    """Each output's lease, read in one batch (executor.storage.lease's format); an unreadable lease file
    is held until one ttl after it was last written, as executor.storage.lease reads it."""
    names = [d for d, o in outputs.items() if LEASE in o.files]
    paths = [store.path(d, LEASE) for d in names]
    if store.is_local:
        raw: dict = {}
        for p in paths:
            try:
                with open(p, "rb") as f:
                    raw[p] = f.read()
            except OSError as e:
                raw[p] = e
    elif paths:
        try:
            raw = store.fs.cat(paths, on_error="return")
        except Exception as e:
            raise store_error("read the leases under", store.prefix, e) from None
    else:
        raw = {}
    for d, p in zip(names, paths):
        data = raw.get(p)
        if isinstance(data, FileNotFoundError) or data is None:
            continue  # released and gone since the listing
        if isinstance(data, BaseException):
            raise store_error("read the lease", store.to_url(p), data)
        try:
            outputs[d].lease = LeaseInfo.parse(data)
        except (ValueError, TypeError):
            outputs[d].lease = LeaseInfo.unreadable_since(outputs[d].files[LEASE].mtime, ttl)


def _closure(store: Store, outputs: dict[str, Output], roots: dict[str, str], what: str,
             strict: bool) -> dict[str, str]:
    """The roots and every output their records say they read, transitively (the served record,
    and the newest attempt's, which a run in progress is making). `strict` (pins): a committed
    output whose record cannot be read is an error, since what it depends on is then unknown."""
    seen: dict[str, str] = {}
    todo = list(roots.items())
    while todo:
        d, why = todo.pop()
        if d in seen:
            continue
        seen[d] = why
        out = outputs.get(d)
        status = out.status if out is not None else store.read_status(d)
        if status is None:
            continue
        records = []
        served = status.served()
        for which in {s.dir or "": s for s in (status, served) if s is not None}.values():
            record = store.read_record_in(which.data_dir(d))
            if record is None and strict and which is served:
                raise GcError(f"{why}: {what} output {store.url(d)} has no readable record, so what it was made "
                              "from is unknown; nothing deleted")
            if record is not None:
                records.append(record)
        for record in records:
            for inp in record.inputs:
                todo.append((f"{inp.name}-{inp.digest[:10]}", f"{what}: read by {d}"))
    return seen


def reached_of(dags: Iterable) -> dict[str, bool]:
    """Every output folder the DAGs reach -> whether its step type is resumable."""
    out: dict[str, bool] = {}
    for dag in dags:
        for node in dag:
            out[node.dirname] = node.step.type.resumable
    return out


def voyage_pins(vf, config: object) -> list[Pin]:
    """A voyage may define `pins(config)` returning output folders or step names (strings) or
    Steps (their current output, which need not have run yet) that `--gc` keeps, with what they
    depend on."""
    from executor.voyage import call_hook

    found = call_hook(vf, "pins", config, missing=[])
    where = f"{vf.path}: pins()"
    if isinstance(found, (str, bytes)) or not isinstance(found, Iterable):
        raise VoyageError(f"{where} must return a list of step names, output folders or Steps, got {found!r}")
    from executor.dag import build_dag
    from executor.step import Step

    pins = []
    for p in found:
        if isinstance(p, Step):
            node = build_dag([p]).by_name[p.name]  # its digest, from it and what it references
            pins.append(Pin(node.dirname, where, must_exist=False))
        elif isinstance(p, str) and p.strip("/"):
            pins.append(Pin(p.strip("/"), where))
        else:
            raise VoyageError(f"{where}: {p!r} is not a step name, an output folder or a Step")
    return pins
