"""Store I/O of a per-shard data step at ~100k shards: one listing, retries, quarantine.

A resumable data step keeps one ledger marker per finished shard (`ledger/NNNNN.json`, written
last, after the shard's files). At 100k shards and ~40 ms a request, asking the store about each
marker one at a time is over an hour of a step doing nothing, so:

- **One listing.** `Ledger.done()` lists the ledger folder once (a paginated LIST on an object
  store: 1,000 names a page) and answers "which shards are finished" from the names.
- **Ledgers come back with the tasks.** A task returns the ledger it wrote (`ShardOutcome`), so
  after the map the step reads only the ledgers of shards finished by an earlier attempt, in one
  batched read (`Ledger.read`: `fs.cat` over a list, which gcsfs issues concurrently).
- **Transient errors are retried** (`retry`): connection resets, timeouts, HTTP 408/429/5xx, with
  exponential backoff capped per wait and in count (`Backoff`), so a blip costs seconds, and a
  store that is down fails the task within a known time instead of hanging.
- **Quarantine.** A shard whose work still fails (a transient error past its retries, or any other
  error) does not fail its task or its neighbours: `run_shards` records it, and `settle` lets the
  step finish without it while the failed shards are at most `max_quarantine_share` of the whole
  (rounded down, so the default fails on any shard below 1,000), naming each one and its error in
  the record. Past that share the step fails with `ShardsFailed`, naming the shards. A
  quarantined shard has no ledger, so the next attempt tries it again.

Ingest does the same with records (`max_reject_share`); this is the same idea one level up.

A per-shard step is two calls around its own per-shard function (docs/writing-steps.md has an
example): `map_shards` (resume from the ledger listing, one Ray task per `per_task` shards, each
measured against the memory it declares (`steps.data.memory`), the per-shard function's ledger
written after its files, retries, quarantine, and every finished shard's ledger back), then
`commit_manifest` (the manifest, written last, with the quarantined shards named, and the
record's results).
"""

from __future__ import annotations

import json
import logging
import posixpath
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

from executor import Resources, StepContext
from steps.data.formats import MANIFEST, join, url_fs, write_json
from steps.data.memory import bounded

T = TypeVar("T")

# HTTP statuses an object store answers when a retry can succeed (GCS and S3 document these).
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
# Errors that say something about the request, not the moment: never retried.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)
_log = logging.getLogger("marin.store")
SHOWN = 10  # failed shards named in a ShardsFailed message (all of them are in the record)


class TransientStoreError(OSError):
    """A store error that a retry may cure (raised by tests' fault-injecting stores, and usable by
    any filesystem wrapper that knows better than the status code)."""


class ShardsFailed(RuntimeError):
    """More of a step's shards kept failing than its `max_quarantine_share` allows."""


def is_transient(exc: BaseException) -> bool:
    """Whether a retry of the request that raised `exc` may succeed."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (TransientStoreError, ConnectionError, TimeoutError)):
        return True
    for attr in ("code", "status", "status_code"):  # gcsfs HttpError.code, aiohttp .status, requests
        code = getattr(exc, attr, None)
        if isinstance(code, int) and 100 <= code < 600:
            return code in TRANSIENT_HTTP
    # aiohttp's connection errors are not OSErrors; name them without importing aiohttp
    return type(exc).__module__.split(".")[0] == "aiohttp" and "Connect" in type(exc).__name__


@dataclass(frozen=True)
class Backoff:
    """At most `attempts` tries, waiting `first_s`, then twice as long each time up to `max_s`
    (times a random factor in [0.5, 1], so that a thousand tasks hit by one blip do not retry in
    step): with the defaults a request gives up after about 15 s of waiting."""

    attempts: int = 5
    first_s: float = 1.0
    max_s: float = 8.0

    def delays(self) -> list[float]:
        return [min(self.max_s, self.first_s * 2 ** k) for k in range(max(0, self.attempts - 1))]


DEFAULT_BACKOFF = Backoff()


def retry(fn: Callable[..., T], *args: Any, backoff: Backoff | None = None, what: str = "",
          sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, retried after transient store errors (`is_transient`) with
    `backoff` (default `DEFAULT_BACKOFF`); any other error, or the last transient one, is raised."""
    delays = (backoff or DEFAULT_BACKOFF).delays()
    for k in range(len(delays) + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if k == len(delays) or not is_transient(e):
                raise
            wait = delays[k] * random.uniform(0.5, 1.0)
            _log.warning("%s: %s: %s; retry %d/%d in %.1f s", what or getattr(fn, "__name__", "store"),
                         type(e).__name__, _first_line(e), k + 1, len(delays), wait)
            sleep(wait)
    raise AssertionError("unreachable")


class Ledger:
    """The ledger folder of a resumable per-shard step: `{output}/{folder}/NNNNN.json`, one per
    finished shard, written after that shard's files."""

    def __init__(self, output: str, folder: str = "ledger", backoff: Backoff | None = None) -> None:
        self.url = join(output, folder)
        self.backoff = backoff
        self.fs, self._root = url_fs(self.url)

    def path(self, index: int) -> str:
        return join(self.url, f"{index:05d}.json")

    def done(self) -> set[int]:
        """The indices of the finished shards, from one listing of the folder."""
        def listing() -> list[str]:
            self.fs.invalidate_cache(self._root)  # another attempt may have written since (gcsfs caches listings)
            try:
                return self.fs.ls(self._root, detail=False)
            except FileNotFoundError:
                return []

        done = set()
        for name in retry(listing, backoff=self.backoff, what=f"list {self.url}"):
            stem = posixpath.basename(name.rstrip("/"))
            if stem.endswith(".json") and stem[:-5].isdigit():
                done.add(int(stem[:-5]))
        return done

    def read(self, indices: Iterable[int]) -> dict[int, Any]:
        """The ledgers of `indices`, in one batched read (concurrent on an object store)."""
        indices = sorted(indices)
        if not indices:
            return {}
        paths = [posixpath.join(self._root, f"{i:05d}.json") for i in indices]
        blobs = retry(self.fs.cat, paths, backoff=self.backoff, what=f"read {len(paths)} ledgers in {self.url}")
        if not isinstance(blobs, dict):  # one path: fsspec returns the bytes themselves
            blobs = {paths[0]: blobs}
        return {i: json.loads(blobs[p]) for i, p in zip(indices, paths)}

    def write(self, index: int, ledger: Any) -> None:
        """Write shard `index`'s marker (atomically; retried like every store request here)."""
        retry(write_json, self.path(index), ledger, backoff=self.backoff, what=f"write {self.path(index)}")


@dataclass(frozen=True)
class ShardOutcome:
    """What a task did with one shard: its ledger, or the error that quarantined it."""

    index: int
    name: str  # the shard as the step's record names it (its input, as the config gives it)
    ledger: Any = None
    error: str | None = None


def run_shards(work: Callable[[T], Any], shards: Sequence[T], index_of: Callable[[T], int],
               name_of: Callable[[T], str], backoff: Backoff | None = None) -> list[ShardOutcome]:
    """`work(shard)` for each shard of one task, each retried after transient errors; a shard
    that still fails is returned as quarantined, and the task goes on with the next. `work`
    returns the shard's ledger (already written)."""
    out = []
    for shard in shards:
        try:
            ledger = retry(work, shard, backoff=backoff, what=f"shard {name_of(shard)}")
            out.append(ShardOutcome(index_of(shard), name_of(shard), ledger=ledger))
        except Exception as e:
            out.append(ShardOutcome(index_of(shard), name_of(shard), error=f"{type(e).__name__}: {_first_line(e)}"))
    return out


def settle(step: str, outcomes: Iterable[ShardOutcome], total: int, max_quarantine_share: float) -> list[dict]:
    """The quarantined shards as the record lists them (`{"shard", "index", "error"}`), or
    ShardsFailed naming them when they are more than `max_quarantine_share` of `total`."""
    failed = sorted((o for o in outcomes if o.error is not None), key=lambda o: o.index)
    allowed = int(max_quarantine_share * total)
    if len(failed) > allowed:
        named = "; ".join(f"{o.name} ({o.error})" for o in failed[:SHOWN])
        more = f"; and {len(failed) - SHOWN} more" if len(failed) > SHOWN else ""
        raise ShardsFailed(f"{step}: {len(failed)} of {total} shards failed, more than max_quarantine_share "
                           f"{max_quarantine_share:g} allows ({allowed}): {named}{more}")
    return [{"shard": o.name, "index": o.index, "error": o.error} for o in failed]


def ledgers(ledger: Ledger, outcomes: Iterable[ShardOutcome], done: Iterable[int]) -> dict[int, Any]:
    """Every finished shard's ledger: those the tasks returned, and those of shards finished
    before (`done`) in one batched read."""
    got = {o.index: o.ledger for o in outcomes if o.error is None}
    got.update(ledger.read(i for i in done if i not in got))
    return got


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


# -- a per-shard step -------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """One shard of a per-shard step: its index (its ledger's name), where it is read from, and
    how the step's record names it (quarantine, failures)."""

    index: int
    url: str
    name: str
    meta: Any = None  # anything else the per-shard function needs of this shard (picklable)


@dataclass(frozen=True)
class _ShardTask:
    step: str
    output: str
    shards: tuple[Shard, ...]
    make: Callable[[], Callable[[Shard], Any]]  # picklable: a module-level function or a partial of one
    memory_gb: float | None


def _shard_task(task: _ShardTask) -> list[ShardOutcome]:
    with bounded(task.step, "shard task", task.memory_gb):
        work = task.make()  # once a task: what its shards share (a tokenizer, an eval index)
        ledger = Ledger(task.output)

        def one(shard: Shard) -> Any:
            entry = work(shard)
            ledger.write(shard.index, entry)  # after the shard's files: the shard is done
            return entry

        return run_shards(one, task.shards, index_of=lambda s: s.index, name_of=lambda s: s.name)


def map_shards(ctx: StepContext, kind: str, make: Callable[[], Callable[[Shard], Any]], shards: Sequence[Shard],
               per_task: int, resources: Resources, max_quarantine_share: float) -> tuple[dict[int, Any], list[dict]]:
    """Run a per-shard function over the shards not finished yet: `make()`, once a task, returns
    the function, which writes one shard's files and returns its ledger (JSON). Returns every
    finished shard's ledger by index (earlier attempts' ones too) and the quarantined shards as
    the record lists them; ShardsFailed (naming `kind`) past `max_quarantine_share`."""
    ledger = Ledger(ctx.output)
    done = ledger.done() & {s.index for s in shards}
    todo = [s for s in shards if s.index not in done]
    ctx.logger.info("%s: %d shards, %d to do", kind, len(shards), len(todo))
    per = max(1, per_task)
    tasks = [_ShardTask(ctx.name, ctx.output, tuple(todo[k:k + per]), make, resources.memory_gb)
             for k in range(0, len(todo), per)]
    outcomes = [o for got in ctx.map(_shard_task, tasks, resources=resources) for o in got]
    quarantined = settle(kind, outcomes, len(shards), max_quarantine_share)
    return ledgers(ledger, outcomes, done), quarantined


def commit_manifest(ctx: StepContext, manifest: dict[str, Any], quarantined: list[dict], **results: Any) -> None:
    """Write the step's manifest, last (with `quarantined` only when shards were left out, so a
    clean run writes the bytes it always did), and its results into the record."""
    if quarantined:
        manifest["quarantined"] = quarantined
    retry(write_json, ctx.path(MANIFEST), manifest, what="write the manifest")
    ctx.results.update(results)
    if quarantined:
        ctx.results["quarantined"] = quarantined
