"""The voyage's logbook: one entry per invocation under `{prefix}/voyages/{voyage}/log/`.

Every `marin-run` that runs steps, every `--gc --yes` and every `--note` alone writes one entry,
a JSON object of its own (docs/logbook.md):

    {prefix}/voyages/{voyage}/log/{YYYYmmddTHHMMSS.ffffff}Z-{host}-{pid}-{hex8}.json

An entry is never read, changed and written back: each writer creates a new object whose name
sorts by time and cannot collide (the host, the pid and 32 random bits), so two executors writing
at the same moment, on a local disk or on GCS, both land. Reading lists the folder and reads
every entry (one batch); the newest first is the reverse order of the names.

An entry holds: when, who (user@host), the git commit of the code with its dirty flag and a digest
of the diff, the voyage's config and its difference from the previous entry's by field path, the
flags, per step what happened (ran, cached, failed, blocked) with the attempt folder and the
failure class and a stack excerpt of what failed, the loss curve of each training step that ran,
the `headline` and `links` a step that ran puts in its results (a sealed prediction, a verdict, a
W&B run),
the bytes `--gc --yes` deleted, and a note (`--note`): the human reason.

Writing the log never fails a run: a failed write is a warning. Reading is `entries()`; the
pages and lines are executor.views.logbook's (api.run_plan and the CLI rewrite the page after
each entry).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import getpass
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from executor.plan import Plan
    from executor.runner import RunSummary
    from executor.storage.store import Store

log = logging.getLogger("marin.logbook")

FORMAT = 1
LOG_DIR = "log"
STACK_LINES = 8  # lines of a failure's traceback kept in its entry (the record keeps it whole)
CURVE_POINTS = 200  # points of a training step's loss curve kept in its entry
_NAME_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-.+\.json$")


def safe_name(name: str) -> str:
    """A voyage's name as a folder name (as executor.live names run pages)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "voyage"


def voyage_folder(voyage: str) -> str:
    """`voyages/{voyage}`, relative to the prefix."""
    return f"voyages/{safe_name(voyage)}"


def log_folder(voyage: str) -> str:
    return f"{voyage_folder(voyage)}/{LOG_DIR}"


def entry_name(when: float, host: str | None = None, pid: int | None = None) -> str:
    """A name that sorts by time (UTC, microseconds) and that no other writer can take."""
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", host or socket.gethostname())[:40] or "host"
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when)) + f".{int(when * 1e6) % 1_000_000:06d}Z"
    return f"{stamp}-{host}-{pid if pid is not None else os.getpid()}-{uuid.uuid4().hex[:8]}.json"


# -- what an entry holds -----------------------------------------------------------------------------
def who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without /etc/passwd entry, no USER)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def git_info(root: str | None = None) -> dict[str, Any]:
    """{"commit", "dirty", "diff"}: the code's commit, whether the tree differs, and a digest of
    how (`git diff HEAD` and the names of untracked files; None when clean or unknown). Once per
    process, as executor.environment reads the commit."""
    return dict(_git_info(root))


@functools.lru_cache(maxsize=None)
def _git_info(root: str | None) -> dict[str, Any]:
    from executor import environment

    root = root or environment.code_root()
    state = environment.current(root)["git"]
    out = {"commit": state.get("commit"), "dirty": state.get("dirty"), "diff": None}
    git = shutil.which("git")
    if state.get("dirty") and git:
        try:
            diff = subprocess.run([git, "-C", root, "diff", "HEAD", "--binary"], capture_output=True,
                                  timeout=environment.GIT_TIMEOUT, check=False).stdout
            new = subprocess.run([git, "-C", root, "ls-files", "--others", "--exclude-standard", "-z"],
                                 capture_output=True, timeout=environment.GIT_TIMEOUT, check=False).stdout
            out["diff"] = hashlib.sha256(diff + b"\0untracked\0" + new).hexdigest()[:16]
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def plain(value: Any, depth: int = 0) -> Any:
    """A config as JSON: dataclasses as objects by field, tuples as lists, enums by value, anything
    else that JSON has no word for by its repr."""
    if depth > 50:
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return plain(value.value, depth + 1)
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    return repr(value)


def config_diff(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """What differs between two plain configs, by field path (`model.lr`, `mixture.weights[1]`):
    [{"path", "before", "after"}]; a field only one side has is `"absent"` on the other."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in list(before) + [k for k in after if k not in before]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in after:
                out.append({"path": sub, "before": before[key], "after": "absent"})
            elif key not in before:
                out.append({"path": sub, "before": "absent", "after": after[key]})
            else:
                out.extend(config_diff(before[key], after[key], sub))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for i, (b, a) in enumerate(zip(before, after)):
            out.extend(config_diff(b, a, f"{path}[{i}]"))
        return out
    if before == after and type(before) is type(after):
        return []
    return [{"path": path or "(config)", "before": before, "after": after}]


def step_outcomes(plan: Plan, summary: RunSummary | None) -> dict[str, dict[str, Any]]:
    """Per step of the plan: ran, cached, failed, blocked or skipped, with the attempt folder the
    status names, the attempt number, and for a failure its class, message and a stack excerpt."""
    from executor.state import StepState

    store = plan.store
    out: dict[str, dict[str, Any]] = {}
    looked_up: list[str] = []
    for d in plan.decisions:
        outcome = summary.outcomes.get(d.name) if summary is not None else None
        state = outcome.state if outcome is not None else d.state
        if state == StepState.SUCCESS and outcome is not None and outcome.started is not None:
            what = "ran"
        elif state in (StepState.SUCCESS, StepState.CACHED):
            what = "cached"
        elif state == StepState.FAILED:
            what = "failed"
        elif state == StepState.BLOCKED:
            what = "blocked"
        elif state == StepState.SKIPPED:
            what = "skipped"
        else:  # a plan never run (a note alone): as planned
            what = "cached" if d.status is not None and d.status.served() is not None and not d.will_run else \
                str(state.value).lower()
        row: dict[str, Any] = {"state": what, "dir": d.node.dirname}
        if outcome is not None:
            if outcome.attempts:
                row["attempt"] = outcome.attempts
            if outcome.seconds is not None:
                row["seconds"] = round(outcome.seconds, 3)
            if what in ("failed", "blocked"):
                row["error"] = scrub(_excerpt(outcome.error or outcome.reason or "", 500), store)
            if outcome.failure and what == "failed":
                row["failure"] = outcome.failure
        if what in ("ran", "failed", "cached"):
            looked_up.append(d.name)
        out[d.name] = row
    if looked_up:
        _attempt_folders(plan, out, looked_up)
    return out


def _attempt_folders(plan: Plan, out: dict[str, dict[str, Any]], names: list[str]) -> None:
    """Each step's attempt folder (one batch of status reads), the stack excerpt of each failure
    (its record), and the loss curve of each training step that ran."""
    store = plan.store
    dirnames = {plan.by_name[n].node.dirname: n for n in names}
    try:
        statuses = store.read_statuses(list(dirnames))
    except Exception as e:  # the entry is still worth writing without them
        log.warning("logbook: statuses not read (%s: %s)", type(e).__name__, e)
        return
    ran_records: dict[str, str] = {}
    for dirname, status in statuses.items():
        name = dirnames[dirname]
        row = out[name]
        if status is None:
            continue
        served = status.served()
        if row["state"] == "failed":
            row["attempt_dir"] = status.data_dir(dirname)
            try:
                record = store.read_record_in(status.data_dir(dirname))
            except Exception:
                record = None
            if record is not None and record.attempts:
                last = record.attempts[-1]
                row["stack"] = scrub(_tail(last.traceback or "", STACK_LINES), store)
                row.setdefault("failure", last.failure)
                row["record"] = f"{status.data_dir(dirname)}/.step.json"
        elif served is not None:
            row["attempt_dir"] = served.data_dir(dirname)
            row["record"] = f"{served.data_dir(dirname)}/.step.json"
            if row["state"] == "ran":
                ran_records[store.path(served.data_dir(dirname), ".step.json")] = name
            if row["state"] == "ran" and plan.by_name[name].node.step.type.resumable:
                curve = _loss_curve(store, served.data_dir(dirname))
                if curve:
                    row["loss"] = curve


    if ran_records:
        _from_results(store, out, ran_records)


HEADLINE_BYTES = 2000  # a step's `headline` larger than this (as JSON) is left out of its entry


def _from_results(store: Store, out: dict[str, dict[str, Any]], paths: dict[str, str]) -> None:
    """What a step that ran names in its results (one batch of record reads), by documented key:
    `model_card` (steps/provenance/card.py) as `card`, relative to the prefix; `headline` (a small
    JSON object, its `text` one line: a sealed prediction, a verdict) copied whole; `links` (label ->
    http(s) URL: a W&B run) kept for the page. The executor knows no step type: each type says what
    its entry shows (docs/logbook.md)."""
    try:
        found = store.fs.cat(list(paths), on_error="return")
    except Exception:
        return
    if not isinstance(found, dict):
        found = {next(iter(paths)): found}
    for path, data in found.items():
        name = paths.get(path)
        if name is None or not isinstance(data, bytes):
            continue
        try:
            results = json.loads(data).get("results") or {}
        except (ValueError, AttributeError):
            continue
        if not isinstance(results, dict):
            continue
        row = out[name]
        card = results.get("model_card")
        if isinstance(card, str) and card.strip("/"):
            row["card"] = f"{row['attempt_dir']}/{card.strip('/')}"
        headline = results.get("headline")
        if isinstance(headline, dict) and headline:
            text = json.dumps(headline, separators=(",", ":"), default=repr)
            if len(text) <= HEADLINE_BYTES:
                row["headline"] = json.loads(text)
                if not isinstance(row["headline"].get("text", ""), str):
                    row["headline"]["text"] = repr(row["headline"]["text"])
            else:
                log.warning("logbook: %s: its headline is %d bytes (over %d): left out", name, len(text),
                            HEADLINE_BYTES)
        links = results.get("links")
        if isinstance(links, dict):
            kept = {str(k)[:60]: v for k, v in links.items()
                    if isinstance(v, str) and re.match(r"^https?://[^\s\"'<>]+$", v) and len(v) <= 500}
            if kept:
                row["links"] = kept


def _loss_curve(store: Store, folder: str) -> list[list[float]] | None:
    """[[tokens or step, loss], ...] of a trainer's metrics.jsonl, thinned to CURVE_POINTS."""
    try:
        data = store.fs.cat_file(store.path(folder, "metrics.jsonl"))
    except Exception:
        return None
    points = []
    for raw in data.splitlines():
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("loss"), (int, float)) or isinstance(row["loss"], bool):
            continue
        x = row.get("tokens", row.get("step"))
        if isinstance(x, (int, float)) and not isinstance(x, bool) and row["loss"] == row["loss"]:
            points.append([float(x), round(float(row["loss"]), 5)])
    if len(points) > CURVE_POINTS:
        stride = -(-len(points) // CURVE_POINTS)
        points = points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
    return points or None


_FILE_RE = re.compile(r'File "([^"]+)"')


def scrub(text: str, store: Store | None = None) -> str:
    """A traceback or message without this machine's folders (entries are published with the
    prefix): a source file by its path in the checkout (else its name), the prefix as `<prefix>`."""
    from executor import environment

    root = environment.code_root().rstrip("/") + "/"

    def short(m: re.Match) -> str:
        path = m.group(1)
        if path.startswith(root):
            return f'File "{path[len(root):]}"'
        return f'File "{os.path.basename(path)}"' if os.path.isabs(path) else m.group(0)

    text = _FILE_RE.sub(short, text)
    if store is not None and store.is_local and store.prefix.startswith("/") and store.prefix != "/":
        text = text.replace(store.prefix, "<prefix>")
    return text


def _tail(text: str, lines: int) -> str:
    kept = [line for line in text.rstrip().splitlines()][-lines:]
    return _excerpt("\n".join(kept), 2000)


def _excerpt(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- writing --------------------------------------------------------------------------------------------
def new_entry(kind: str, voyage: str, *, config: Any = None, note: str | None = None,
              flags: dict[str, Any] | None = None, voyage_file: str | None = None,
              when: float | None = None) -> dict[str, Any]:
    """The fields every entry has; the caller adds what its kind holds (steps, gc)."""
    when = time.time() if when is None else when
    entry: dict[str, Any] = {
        "format": FORMAT, "kind": kind, "voyage": voyage, "time": when,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)), "who": who(),
        "host": socket.gethostname(), "pid": os.getpid(), "git": git_info(),
    }
    if voyage_file:
        entry["voyage_file"] = voyage_file
    if config is not None:
        entry["config"] = plain(config)
    if flags:
        entry["flags"] = flags
    if note:
        entry["note"] = note
    return entry


def write_entry(store: Store, voyage: str, entry: dict[str, Any], *, previous: bool = True) -> str:
    """Write `entry` as a new object of the voyage's log (after adding its config difference from
    the newest earlier entry that has a config). Returns the entry's path relative to the prefix.
    Raises what the store raises. (The voyage's page is executor.views.logbook.write_index's.)"""
    from executor.storage.files import is_gcs, write_atomic

    if previous and "config" in entry:
        before = _previous_config(store, voyage)
        if before is not None:
            entry["config_diff"] = config_diff(before[1], entry["config"])
            entry["previous"] = before[0]
    name = entry_name(entry.get("time", time.time()), entry.get("host"), entry.get("pid"))
    rel = f"{log_folder(voyage)}/{name}"
    data = json.dumps(entry, separators=(",", ":"), allow_nan=False, default=repr).encode()  # fields in order
    fs = store.fs
    options = {"content_type": "application/json"} if is_gcs(fs) else {}
    if store.is_local:
        from executor.storage.files import create_local

        if not create_local(store.path(rel), data):  # cannot happen: the name holds 32 random bits
            raise FileExistsError(store.path(rel))
    else:
        write_atomic(store.path(rel), data, fs=fs, **options)
    return rel


def record_run(plan: Plan, summary: RunSummary | None, voyage: str, *, page_folder: str | None = None,
               extra: dict[str, Any] | None = None) -> str | None:
    """The entry of a run (`api.run_plan` calls it when it has a voyage name): never raises, a
    failed write is a warning. Returns the entry's path, or None."""
    try:
        extra = dict(extra or {})
        entry = new_entry("run", voyage, config=extra.pop("config", None), note=extra.pop("note", None),
                          flags=extra.pop("flags", None), voyage_file=extra.pop("voyage_file", None))
        entry.update(extra)
        leases = plan.given_leases
        if leases is not None:
            entry["run"] = leases.owner.run_id
        steps = step_outcomes(plan, summary)
        entry["steps"] = steps
        entry["counts"] = _counts(steps)
        if summary is not None:
            entry["seconds"] = round(summary.seconds, 3)
            entry["exit_code"] = summary.exit_code
        if page_folder:
            entry["page"] = page_folder.rpartition("/")[2] + "/index.html"  # relative to voyages/{voyage}/
        rel = write_entry(plan.store, voyage, entry)
    except Exception as e:
        log.warning("logbook: no entry written for this run (%s: %s); the voyage goes on", type(e).__name__, e)
        return None
    return rel


def _counts(steps: dict[str, dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in steps.values():
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


# -- reading ------------------------------------------------------------------------------------------
def entry_names(store: Store, voyage: str) -> list[str]:
    """The entries' object names, oldest first."""
    folder = store.path(log_folder(voyage))
    if store.is_local:
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
    else:
        try:
            names = [p.rstrip("/").rpartition("/")[2] for p in store.fs.ls(folder, detail=False)]
        except FileNotFoundError:
            return []
    return sorted(n for n in names if _NAME_RE.match(n))


def entries(store: Store, voyage: str, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every entry of the voyage's log, newest first (an unreadable one is skipped with a warning).
    Each carries `_name`, its object name."""
    names = list(entry_names(store, voyage) if names is None else names)
    folder = store.path(log_folder(voyage))
    found: dict[str, Any] = {}
    if store.is_local:
        for name in names:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    found[name] = f.read()
            except OSError as e:
                found[name] = e
    elif names:
        paths = [f"{folder}/{n}" for n in names]
        data = store.fs.cat(paths, on_error="return")
        if not isinstance(data, dict):
            data = {paths[0]: data}
        found = {p.rpartition("/")[2]: v for p, v in data.items()}
    out = []
    for name in reversed(names):
        data = found.get(name)
        try:
            if not isinstance(data, bytes):
                raise ValueError(f"not read: {data!r}")
            entry = json.loads(data)
            if not isinstance(entry, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            log.warning("logbook: entry %s skipped (%s)", name, e)
            continue
        entry["_name"] = name
        out.append(entry)
    return out


def _previous_config(store: Store, voyage: str) -> tuple[str, Any] | None:
    """(name, config) of the newest entry that has a config; entries are read newest first, a
    few at a time, so a long log costs a listing and one small read."""
    names = entry_names(store, voyage)
    while names:
        batch, names = names[-8:], names[:-8]
        for entry in entries(store, voyage, batch):
            if "config" in entry:
                return entry["_name"], entry["config"]
    return None
