"""The live voyage page: `{prefix}/voyages/{voyage}/{run}/index.html`, kept up to date during a run.

A `LivePage` is the runner's state listener. A state change only updates a row in memory and
wakes a writer thread; the writer rewrites the page at most every `min_interval` seconds (GCS
allows about one write per second to one object, and a 1,000-step run changes state thousands
of times), and at least every `metrics_every` seconds while steps run, when it also reads the new
lines of each running step's `metrics.jsonl` (see `executor.views.viz.metrics`). The page is static:
the plan part is rendered once, so a write joins two pre-rendered byte strings around a small run
JSON. `voyage.json` next to it holds the same data for machines, and for the page itself, which
re-reads it when served over http(s), so publishing the prefix publishes the voyage live.

A failed write logs a warning and the voyage goes on; the listener itself never raises.
"""

from __future__ import annotations

import html as html_text
import json
import logging
import re
import threading
import time
import uuid
from typing import Any

from executor.plan import Plan
from executor.runner import Outcome, RunSummary
from executor.storage.files import is_gcs, write_atomic
from executor.state import StepState, initial
from executor.storage.store import SUCCESS
from executor.views.viz import graph, html
from executor.views.viz.metrics import MetricsReader

log = logging.getLogger("marin.live")

PAGE, DATA = "index.html", "voyage.json"
WARN_EVERY = 300.0  # seconds between repeated warnings about failing writes


class LivePage:
    """The voyage page of one run; call it with each Outcome, `start()` it, then `close()` it."""

    def __init__(self, plan: Plan, voyage: str, run_id: str, *, min_interval: float = 5.0,
                 metrics_every: float = 30.0, poll_every: float = 10.0) -> None:
        self.plan, self.store = plan, plan.store
        self.min_interval, self.metrics_every, self.poll_every = min_interval, metrics_every, poll_every
        self.started = time.time()
        run = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.started)) + "-" + (run_id or uuid.uuid4().hex)[:8]
        self.folder = f"voyages/{_safe(voyage)}/{run}"
        self.url = f"{self.store.url(self.folder)}/{PAGE}"
        self._title = f"{voyage}: voyage {run}"
        local = self.store.is_local and self.store.prefix.startswith("/") and self.store.prefix != "/"
        self._local_prefixes = sorted({json.dumps(self.store.prefix)[1:-1].encode(), self.store.prefix.encode()},
                                      key=len, reverse=True) if local else []
        # Records of existing outputs are read by the writer thread, not before the run starts.
        self._data = graph.draw(plan, title=voyage, records=False).to_json()
        self._records_to_read = any(d.status is not None for d in plan.decisions)
        self._render_plan()
        self._index = {d.name: i for i, d in enumerate(plan.decisions)}
        self._dirnames = [d.node.dirname for d in plan.decisions]
        self.rows: list[list[Any]] = [[initial(d.state, d.will_run), 0, None, None, d.reason]
                                      for d in plan.decisions]
        self._tries = [0] * len(self.rows)
        # every attempt of this run that failed, in order: [step index, attempt, class, error]
        self.failed_attempts: list[list[Any]] = []
        self._running: set[int] = set()
        self._changed: set[int] = {i for i, d in enumerate(plan.decisions)  # finished trainers' curves
                                   if d.node.step.type.resumable and d.status is not None and d.status.state == SUCCESS}
        self.metrics = MetricsReader(self.store)
        self._records: dict[int, dict[str, Any]] = {}  # of the steps that finished in this run
        # the folder of the attempt each output serves (executor.storage.attempts), as planned or as finished
        self._served: dict[int, str] = {i: d.status.served().data_dir(d.node.dirname)
                                        for i, d in enumerate(plan.decisions)
                                        if d.status is not None and d.status.served() is not None}
        self.finished: float | None = None
        self._lock = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._dirty = True
        self._last_write = self._last_metrics = 0.0
        self._thread: threading.Thread | None = None
        self.writes, self.write_seconds, self.failures = 0, 0.0, 0
        self._warned_at = -WARN_EVERY
        # A scaling ladder's fit, sealed prediction and verdict (steps/ladder/steps.py): read once
        # each, when its step has succeeded, for the ladder panel (docs/ladder.md)
        self._ladder_steps = {i: LADDER_FILES[d.node.step.type.name] for i, d in enumerate(plan.decisions)
                              if d.node.step.type.name in LADDER_FILES}
        self._ladder: dict[str, Any] = {}
        self._targets = _ladder_targets(plan, self._ladder_steps)

    def _render_plan(self) -> None:
        head, tail = html.page_parts(self._data, self._title, live=True)
        self._head, self._tail = self._relative(head.encode()), tail.encode()
        self._plan_json = self._relative(json.dumps(self._data, separators=(",", ":"), allow_nan=False).encode())

    def _relative(self, data: bytes) -> bytes:
        """`data` with the prefix's local path made relative to the page (`../../..`): a page
        published, copied or served names no folder of the machine it ran on, and its paths
        lead to the prefix it is in (the steps' paths, and what records name under the prefix)."""
        for old in self._local_prefixes:
            data = data.replace(old + b"/", b"../../../").replace(b'"' + old + b'"', b'"../../.."')
        return data

    # -- the listener ---------------------------------------------------------------------------
    def __call__(self, outcome: Outcome) -> None:
        i = self._index.get(outcome.name)
        if i is None:
            return
        with self._lock:
            if outcome.state == StepState.RUNNING:
                self._tries[i] += 1
                self._running.add(i)
            else:
                self._running.discard(i)
            text = outcome.error or outcome.reason or ""
            if outcome.failure and outcome.state == StepState.FAILED:  # the failure class (executor.failures)
                text = f"({outcome.failure}) {text}"
            self.rows[i] = [outcome.state, max(outcome.attempts, self._tries[i]), outcome.started, outcome.ended,
                            text]
            # A failed attempt: retried (PENDING, with its class) or the last (FAILED). Every one is
            # listed with its class, on the step's node and in the run's list.
            if outcome.failure and outcome.state in (StepState.PENDING, StepState.FAILED):
                attempt = max(self._tries[i], 1)
                if not any(f[0] == i and f[1] == attempt for f in self.failed_attempts[-200:]):
                    why = outcome.error or outcome.reason or ""
                    self.failed_attempts.append([i, attempt, outcome.failure, why[:500]])
            self._changed.add(i)
            self._dirty = True
        self._wake.set()

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> "LivePage":
        """Write the page once (every step PENDING or as planned), then keep it up to date; the
        curves of finished trainers are read by the writer thread, not before the run starts."""
        try:
            self._write()
        except Exception as e:
            self._warn(e)
        self._thread = threading.Thread(target=self._loop, name="marin-live-page", daemon=True)
        self._thread.start()
        if self._changed or self._records_to_read:
            self._wake.set()
        return self

    def close(self, summary: RunSummary | None = None) -> None:
        """Stop the writer and write the final page (with every curve read to its end)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if summary is not None:
            for outcome in summary.outcomes.values():
                i = self._index.get(outcome.name)
                if i is not None and self.rows[i][0] != outcome.state:
                    self(outcome)
        with self._lock:
            self._changed.update(self._running)
            self._running.clear()
        self.finished = time.time()
        self._dirty = True
        self._flush(metrics=True)

    def flush(self) -> None:
        """Read new curves and write the page now, whatever the interval (benchmarks, tests)."""
        self._dirty = True
        self._flush(metrics=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self.metrics_every)
            self._wake.clear()
            if self._stop.is_set():
                return
            delay = self._last_write + self.min_interval - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            self._flush(metrics=time.monotonic() - self._last_metrics >= self.metrics_every)

    # -- writing ------------------------------------------------------------------------------------
    def _flush(self, metrics: bool) -> None:
        try:
            with self._lock:
                polled = self._changed | (self._running if metrics else set())
                self._changed = set()
                dirty, self._dirty = self._dirty, False
            if metrics:
                self._last_metrics = time.monotonic()
            if self._records_to_read:  # start() writes without them; every later write has them
                self._records_to_read = False
                records = graph.read_records(self.plan)  # one batch; the plan part is rendered again
                for step in self._data["steps"]:
                    if step["name"] in records:
                        step["record"] = records[step["name"]]
                self._render_plan()
                dirty = True
            finished = [i for i in sorted(polled) if self.rows[i][0] in (StepState.SUCCESS, StepState.FAILED)]
            self._read_records(finished)
            if self._read_ladder():
                dirty = True
            curves_changed = self.metrics.poll_many([self._dirnames[i] for i in sorted(polled)])
            if dirty or curves_changed:
                self._write()
        except Exception as e:  # the page must never fail the voyage
            self._warn(e)

    def _warn(self, e: Exception) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY:
            self._warned_at = now
            log.warning("voyage page %s not written (%s: %s); the voyage goes on", self.url, type(e).__name__, e)

    def _read_records(self, indices: list[int]) -> None:
        """The records of steps that finished in this run (one concurrent batch)."""
        if not indices:
            return
        try:  # through each folder's `.status`: the record is in the folder of the attempt it commits
            statuses = self.store.read_statuses([self._dirnames[i] for i in indices])
            where = self.store.record_paths(statuses)
            paths = {where[self._dirnames[i]]: i for i in indices if self._dirnames[i] in where}
            for i in indices:
                served = statuses.get(self._dirnames[i])
                if served is not None and served.served() is not None:
                    self._served[i] = served.served().data_dir(self._dirnames[i])
            if not paths:
                return
            found = self.store.fs.cat(list(paths), on_error="return")
        except Exception:  # a record is a detail of the page; the state is already known
            return
        if not isinstance(found, dict):
            found = {next(iter(paths)): found}
        for path, data in found.items():
            if isinstance(data, bytes) and path in paths:
                try:
                    self._records[paths[path]] = graph.summarize_record(json.loads(data))
                except (ValueError, TypeError, AttributeError):
                    continue

    def _read_ladder(self) -> bool:
        """Read the ladder files of the ladder steps that succeeded (cached or in this run) and
        are not read yet; True if one was."""
        read = False
        for i, (key, name) in self._ladder_steps.items():
            if key in self._ladder:
                continue
            decision = self.plan.decisions[i]
            cached = decision.status is not None and decision.status.state == SUCCESS and not decision.will_run
            if not (cached or self.rows[i][0] == StepState.SUCCESS) or i not in self._served:
                continue
            try:
                with self.store.fs.open(self.store.path(self._served[i], name), "rb") as f:
                    self._ladder[key] = json.loads(f.read())
                read = True
            except (OSError, ValueError):
                continue
        return read

    def ladder_json(self) -> dict[str, Any] | None:
        """The ladder panel's data: the fit, the sealed prediction, the verdict (each once its
        step succeeded), the target's training steps (by index) and the badge."""
        if not self._ladder_steps:
            return None
        check = next((i for i, (k, _) in self._ladder_steps.items() if k == "verdict"), None)
        verdict = self._ladder.get("verdict")
        badge = verdict["verdict"] if verdict else (
            "FAILED" if check is not None and self.rows[check][0] == StepState.FAILED else
            "PENDING" if "prediction" in self._ladder else "UNSEALED")
        return {**self._ladder, "badge": badge, "targets": self._targets}

    def run_json(self) -> dict[str, Any]:
        """The run part of the page: a row per step and the curves read so far."""
        with self._lock:
            rows = [list(r) for r in self.rows]
            failed = [list(f) for f in self.failed_attempts]
        curves = {}
        for i, dirname in enumerate(self._dirnames):
            c = self.metrics.to_json(dirname) if dirname in self.metrics.curves else None
            if c is not None:
                curves[str(i)] = c
        return {"started": self.started, "updated": time.time(), "finished": self.finished, "poll": self.poll_every,
                "steps": rows,
                "metrics": curves, "records": {str(i): r for i, r in self._records.items()}, "cards": self.cards(),
                "ladder": self.ladder_json(), "failed_attempts": failed}

    def cards(self) -> dict[str, str]:
        """Step name -> link (relative to the page) of each model card a step of the plan has
        written: a finished step whose results name `model_card`, a file of its output
        (steps/provenance/card.py). Relative, so a published or copied prefix links its own copy."""
        found = {}
        drawn = {step.get("name"): step for step in self._data["steps"]}
        for i, d in enumerate(self.plan.decisions):
            record = self._records.get(i) or drawn.get(d.name, {}).get("record") or {}
            card = (record.get("results") or {}).get("model_card")
            if isinstance(card, str) and record.get("state") == SUCCESS:
                found[d.name] = f"../../../{self._served.get(i, self._dirnames[i])}/{card.lstrip('/')}"
        return found

    def _cards_nav(self) -> bytes:
        cards = self.cards()
        if not cards:
            return b""
        links = " ".join(f'<a href="{html_text.escape(href)}">{html_text.escape(name)}</a>'
                         for name, href in sorted(cards.items()))
        return f'<nav id="model-cards">model card: {links}</nav>\n'.encode()

    def _write(self) -> None:
        t0 = time.perf_counter()
        run = self.run_json()
        run_bytes = self._relative(html.script_json(run).encode())
        data = (b'{"plan":' + self._plan_json + b',"run":' + self._relative(json.dumps(run, separators=(",", ":")).encode())
                + b"}")
        self._put(DATA, data, "application/json")
        head = self._head.replace(b"</header>\n", b"</header>\n" + self._cards_nav(), 1)  # the model cards' links
        self._put(PAGE, head + run_bytes + self._tail, "text/html; charset=utf-8")
        self._last_write = time.monotonic()
        self.writes += 1
        self.write_seconds += time.perf_counter() - t0

    def _put(self, name: str, data: bytes, content_type: str) -> None:
        # Readers see the old page or the new one, never half; on GCS it is served to browsers:
        # the right type, and no hour-long caching.
        gcs = {"content_type": content_type, "fixed_key_metadata": {"cache_control": "no-cache, max-age=0"}}
        write_atomic(self.store.path(self.folder, name), data, fs=self.store.fs,
                     **(gcs if is_gcs(self.store.fs) else {}))


# step type -> (key in the ladder panel's data, the file of its output)
LADDER_FILES = {"ladder_fit": ("fit", "fit.json"), "ladder_predict": ("prediction", "prediction.json"),
                "ladder_check": ("verdict", "verdict.json")}


def _ladder_targets(plan: Plan, ladder_steps: dict[int, tuple[str, str]]) -> list[int]:
    """The training steps that take a ladder's sealed prediction (their curves are drawn
    against the predicted one)."""
    predict = {plan.decisions[i].name for i, (k, _) in ladder_steps.items() if k == "prediction"}
    if not predict:
        return []
    return [i for i, d in enumerate(plan.decisions)
            if d.node.step.type.resumable and any(dep.name in predict for dep in d.node.deps)]


def open_page(plan: Plan, voyage: str, run_id: str, **kwargs: Any) -> LivePage | None:
    """A LivePage for this run, or None (with a warning) if it cannot even be prepared."""
    try:
        return LivePage(plan, voyage, run_id, **kwargs)
    except Exception as e:
        log.warning("no voyage page for this run (%s: %s); the voyage goes on", type(e).__name__, e)
        return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "voyage"
