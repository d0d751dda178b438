"""What a running step sees: `StepContext`.

Step functions receive `(config, ctx)`. The config has every `output_of(...)`/`this_output(...)`
already replaced by a URL. `ctx` gives the output folder on its fsspec store (`ctx.open` writes
and reads there), its inputs (`ctx.open_input` reads a config's input URL, or a file inside it),
a logger, a progress reporter, a way to fan work out over the cluster (`ctx.map`) without
importing Ray, and two small dicts that end up in the step's record: `results`, and `provenance`,
which arrives holding what the DAG says of the step's data (`sources`: source step -> licence as
JSON, `licenses`: their ids) and to which a step adds what it knows from the data it read
(`tokens` consumed per source and licence; sources found in its inputs' manifests).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence


from executor.errors import VoyageError
from executor.failures import LeaseLost
from executor.step import Resources
from executor.storage.store import url_to_fs

# Names of the executor's own files: a step that wrote them would corrupt its status, record or
# lease (an earlier `ctx.open(".status", "w")` livelocked a run on "corrupt status" forever).
RESERVED = frozenset({".status", ".step.json", ".lease", ".attempts", ".resolved.json"})


def own_path(step: str, parts: Sequence[str]) -> list[str]:
    """The segments of a path inside a step's output folder; a VoyageError naming the step and
    the path if it is absolute, has a `..` segment, or names one of the executor's files."""
    out: list[str] = []
    for part in parts:
        if not part:
            continue
        if not isinstance(part, str):
            raise VoyageError(f"step {step}: a path inside its output must be a string, got {part!r}")
        why = ("is absolute" if part.startswith("/") or "://" in part else
               "has a '..' segment, which leaves the step's output folder" if ".." in part.split("/") else "")
        segments = [s for s in part.split("/") if s and s != "."]
        if not why and any(s in RESERVED for s in segments):
            why = f"names one of the executor's files ({', '.join(sorted(RESERVED))})"
        if why:
            raise VoyageError(f"step {step}: ctx path {part!r} {why}; a step writes only inside its own output")
        out.extend(segments)
    return out


Mapper = Callable[[Callable[[Any], Any], Sequence[Any], "Resources | None"], list]


def local_map(fn: Callable[[Any], Any], items: Sequence[Any], resources: Resources | None = None) -> list:
    """Run `fn` over `items` one after another in this process (no cluster at hand)."""
    return [fn(item) for item in items]


_FENCED = threading.local()  # per thread: the leases whose fenced blocks it is inside


@dataclass(frozen=True)
class LeaseRef:
    """The lease an attempt runs under: enough for any process of the step (a training rank on
    another node) to check that it still holds it."""

    prefix: str
    dirname: str
    token: int
    ttl: float
    storage_options: dict[str, Any] = field(default_factory=dict)
    # the attempt that runs under it: a Ray retry of the task (after a node presumed lost) carries
    # the same token, so only the attempt the folder's `.status` names tells the retry from the
    # first try, still alive, that it supersedes (None: not checked)
    attempt: int | None = None


@dataclass
class StepContext:
    """The running step's view of the world."""

    name: str
    output: str
    digest: str
    attempt: int = 1
    resources: Resources = field(default_factory=Resources)
    resumable: bool = False
    results: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    mapper: Mapper = local_map
    lease: LeaseRef | None = None  # None: run without leases (a test, a notebook): always ours
    voyage: str = ""  # the voyage's name when the run has one (`marin-run`): a tracker groups its runs by it

    def __post_init__(self) -> None:
        self.fs, self._root = url_to_fs(self.output)
        self.logger = logging.getLogger(f"marin.step.{self.name}")

    def path(self, *parts: str) -> str:
        """The URL of a path inside this step's output folder (VoyageError for one that would
        leave it or name the executor's files: `..`, an absolute path, `.status`, ...)."""
        return "/".join([self.output.rstrip("/"), *own_path(self.name, parts)])

    def fs_path(self, *parts: str) -> str:
        """The same, as a path on `ctx.fs` (no protocol)."""
        return posixpath.join(self._root, *own_path(self.name, parts))

    def open(self, relpath: str, mode: str = "rb", **kwargs: Any) -> Any:
        """Open a file inside the output folder (parents are created for writes). A resumable
        step's writes first check the lease (`fenced`): its folder is shared with the attempts of
        its lineage, so a superseded attempt must stop before it writes there."""
        if any(m in mode for m in "wax+"):
            if self.resumable:
                with self.fenced(f"writing {relpath}"):
                    pass
            self.fs.makedirs(posixpath.dirname(self.fs_path(relpath)), exist_ok=True)
        return self.fs.open(self.fs_path(relpath), mode, **kwargs)

    def exists(self, relpath: str) -> bool:
        """Whether a file or folder exists inside the output folder."""
        return self.fs.exists(self.fs_path(relpath))

    def open_input(self, url: str, relpath: str = "", mode: str = "rb", **kwargs: Any) -> Any:
        """Open an input for reading: `url` is a config field that held `output_of(...)` (a file,
        or a folder with `relpath` inside it), on whatever store it lives. Inputs are read-only.

        The executor checks each input's status before the step starts and again before it is
        marked done, so a step whose input is rerun meanwhile never succeeds from a half-read one."""
        if any(m in mode for m in "wax+"):
            raise VoyageError(f"ctx.open_input({url!r}, mode={mode!r}): inputs are read-only; write under the "
                              "step's own output with ctx.open")
        target = "/".join([url.rstrip("/"), relpath.strip("/")]) if relpath else url
        fs, path = url_to_fs(target)
        return fs.open(path, mode, **kwargs)

    @contextlib.contextmanager
    def fenced(self, what: str, patience: float | None = None) -> Iterator[None]:
        """Around writes that only the attempt holding the step's lease may make; raises
        LeaseLost, before the block runs, once another executor holds the lease (it took the step
        over: an attempt of a resumable step shares its folder with the attempts it resumed, so a
        superseded one would write into its successor's, possibly committed, output).

        On a local prefix the lease's lock is held while the block runs, so no takeover can slip
        in between the check and the writes: keep the block short (a marker, a deletion), never
        a whole checkpoint's upload. Elsewhere the lease must still have a quarter of its ttl left
        (docs/leases.md). A lease that still carries our token but is due for renewal (our
        executor is slow, or paused) is waited for up to `patience` seconds (ten ttls by default),
        never written past: an expired lease can be taken over at any moment. A `fenced` (or a
        resumable step's `ctx.open`) inside another's block on the same thread is already inside
        the check and runs at once: a second lock on the lease file from this process would wait
        for the first forever."""
        ref = self.lease
        held = _FENCED.__dict__.setdefault("held", set())
        key = (ref.prefix, ref.dirname, ref.token) if ref is not None else None
        if ref is None or key in held:
            yield
            return
        from executor.storage.lease import Leases
        from executor.storage.store import Store

        store = Store(ref.prefix, **ref.storage_options)
        leases = Leases(store, ttl=ref.ttl)
        deadline = time.monotonic() + (10 * ref.ttl if patience is None else patience)
        while True:
            with leases.fence(ref.dirname, ref.token) as ours:
                if ours and ref.attempt is not None:
                    self._check_attempt(store, ref, what)
                if ours:
                    held.add(key)
                    try:
                        yield
                    finally:
                        held.discard(key)
                    return
            holder = leases.holder(ref.dirname)
            ours_still = holder is not None and not holder.unreadable and holder.token == ref.token \
                and not holder.released
            if not ours_still or time.monotonic() > deadline:
                now = "its lease is now " + (holder.describe() if holder is not None else "gone") + \
                    (f" (token {holder.token})" if holder is not None and not holder.unreadable else "")
                why = "was not renewed for too long" if ours_still else "was taken over by another executor"
                raise LeaseLost(f"step {self.name}, attempt {self.attempt} (token {ref.token}): the lease {why}, "
                                f"so it stopped before {what}; {now}")
            time.sleep(min(1.0, ref.ttl / 20))

    def _check_attempt(self, store: Any, ref: LeaseRef, what: str) -> None:
        """LeaseLost unless the folder's `.status` still names this attempt under this token (as
        the commit's fence checks): a Ray retry of the task holds the same token, and its status
        names the later attempt."""
        status = store.read_status(ref.dirname)
        if status is None or (status.attempt, status.token) != (ref.attempt, ref.token):
            now = "no status" if status is None else f"attempt {status.attempt} (token {status.token}, {status.state})"
            raise LeaseLost(f"step {self.name}, attempt {ref.attempt} (token {ref.token}): superseded, the folder's "
                            f"status now names {now} (a retry of this task), so it stopped before {what}")

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], resources: Resources | None = None) -> list:
        """`[fn(x) for x in items]`, spread over the cluster as one task per item when running
        under Ray (each with `resources`, default 1 CPU), in order of `items`."""
        return self.mapper(fn, list(items), resources)

    def progress(self, total: int | None = None, unit: str = "it", desc: str = "") -> "Progress":
        """A progress reporter that logs rate and ETA at most every few seconds."""
        return Progress(self.logger, total, unit, desc or self.name)


class Progress:
    """Logs `done/total unit (rate/s, ETA)` at most every `every` seconds; a null object otherwise."""

    def __init__(self, logger: logging.Logger, total: int | None, unit: str, desc: str, every: float = 5.0) -> None:
        self.logger, self.total, self.unit, self.desc, self.every = logger, total, unit, desc, every
        self.done = 0
        self.start = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.every or (self.total is not None and self.done >= self.total):
            self._last = now
            self.logger.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.desc}: {self.done}"
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            text += f"/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%, {rate:.1f} {self.unit}/s, ETA {eta:.0f}s)"
        else:
            text += f" {self.unit} ({rate:.1f} {self.unit}/s)"
        return text

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.done:
            print(self.line(), file=sys.stderr)
