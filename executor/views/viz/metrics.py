"""Training curves for the live page: a trainer's `metrics.jsonl`, read as it grows.

The format (docs/viz.md) is one JSON object per line, appended as training goes, e.g.

    {"step": 1200, "loss": 2.31, "lr": 0.0003, "tokens_per_s": 1.2e6, "expert_load_max": 1.8, "expert_load_min": 0.4}

Every numeric key is a series drawn against `step` (against the line number where a line has no
`step`); `time`/`timestamp` are not drawn; booleans, strings, NaN and lines that do not parse
are skipped. A trainer's rows carry more, read here too:

- `health` (steps/train/health.py): lists with one value per MoE layer. `load_max_mean` becomes
  the expert-load heatmap (layer x step); each list also becomes `{name}_min/_mean/_max` series.
- drops past a capacity (`moe_dropped_share` of the row, `dropped_share` per layer in `health`):
  `drops` keeps the run's largest share of a row, the worst layer's largest share with its layer
  and step, and the last row's share, for the page's line above the charts; only when a row's
  health lists drops (a capacity applies), not for a dropless run's zeros.
- `events`: spike skips and rewinds (steps/train/spikes.py), marked on the loss curve.
- `tokens` and `loss`: the loss by tokens, so that pretrain and midtrain join into one curve.
- a rewind (an event `{"kind": "rewind", "skipped": [a, b]}`): the weights went back to step a's
  checkpoint and the data of steps a..b was thrown away. `rewound` lists each such stretch, by
  step and by tokens (the tokens the trainer counted at a and at b before it went back), for the
  page to shade; after it the tokens count again from a's, so the loss by tokens runs back.
- rates (`tokens_per_s`, `mfu`, any `*_per_s`) are never drawn below zero: the row logged across
  a rewind counts the tokens it went back as negative progress; that point is left out.

A step may also leave `reference_curve.json` beside its metrics (`[[tokens, loss], ...]`, or
`{"tokens": [...], "loss": [...]}`): a reference run's loss, overlaid on the page. The file is read from where the last read stopped (one ranged read per poll, so a
three-month run costs no more per poll than a short one), and each series is thinned to at most
`MAX_POINTS` points by doubling its stride, always keeping the newest point.
"""

from __future__ import annotations

import json
import math
from typing import Any

from executor.storage.store import Store

METRICS_FILE = "metrics.jsonl"
MAX_POINTS = 500
X_KEY = "step"
NOT_DRAWN = frozenset({X_KEY, "time", "timestamp"})
RATES = frozenset({"tokens_per_s", "mfu"})


def _rate(key: str) -> bool:
    return key in RATES or key.endswith("_per_s")


class Series:
    """One curve, thinned as it grows."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []
        self.stride = 1
        self.seen = 0
        self.last: tuple[float, float] | None = None

    def add(self, x: float, y: float) -> None:
        self.last = (x, y)
        if self.seen % self.stride == 0:
            self.points.append((x, y))
            if len(self.points) > MAX_POINTS:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1

    def to_json(self) -> list[list[float]]:
        out = [list(p) for p in self.points]
        if self.last is not None and (not self.points or self.points[-1] != self.last):
            out.append(list(self.last))
        return out


REFERENCE_FILE = "reference_curve.json"
HEALTH_LISTS = ("load_max_mean", "router_entropy", "bias_spread", "dropped", "dropped_share")


class Curves:
    """The series of one metrics file and how far it has been read."""

    def __init__(self) -> None:
        self.offset = 0
        self.lines = 0
        self.series: dict[str, Series] = {}
        self.heat = Series()  # (step, [load max/mean per layer])
        self.by_tokens = Series()  # (tokens, loss)
        self.events: list[dict[str, Any]] = []
        self.reference: list[list[float]] | None = None
        self.rewound: list[list[float]] = []  # [from step, to step, from tokens, to tokens]
        self.drops: dict[str, float] = {}  # share_max, last; layer_max, layer, layer_step

    def feed(self, data: bytes) -> int:
        """Parse the complete lines of `data`; returns the bytes consumed (up to the last newline)."""
        end = data.rfind(b"\n") + 1
        for raw in data[:end].splitlines():
            self.lines += 1
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            x = row.get(X_KEY)
            x = float(x) if _number(x) else float(self.lines)
            for key, value in row.items():
                if key not in NOT_DRAWN and _number(value) and not (value < 0 and _rate(key)):
                    self.series.setdefault(str(key), Series()).add(x, float(value))

            self._feed_training(x, row)
        return end

    def _feed_training(self, x: float, row: dict[str, Any]) -> None:
        health = row.get("health")
        if isinstance(health, dict):
            for name in HEALTH_LISTS:
                values = health.get(name)
                if not isinstance(values, list) or not values or not all(_number(v) for v in values):
                    continue
                for stat, v in (("min", min(values)), ("mean", sum(values) / len(values)), ("max", max(values))):
                    self.series.setdefault(f"{name}_{stat}", Series()).add(x, float(v))
                if name == "load_max_mean":
                    self.heat.add(x, [round(float(v), 4) for v in values])
                if name == "dropped_share" and max(values) > self.drops.get("layer_max", -1.0):
                    worst = max(range(len(values)), key=values.__getitem__)
                    self.drops.update(layer_max=float(values[worst]), layer=worst, layer_step=x)
        share = row.get("moe_dropped_share")
        if _number(share):
            self.drops.update(share_max=max(float(share), self.drops.get("share_max", 0.0)), last=float(share))
        if _number(row.get("tokens")) and _number(row.get("loss")):
            self.by_tokens.add(float(row["tokens"]), float(row["loss"]))
        for event in row.get("events") or []:
            if isinstance(event, dict) and _number(event.get("step")) and \
                    all(e.get("step") != event["step"] for e in self.events[-50:]):
                self.events.append({"step": event["step"], "kind": str(event.get("kind", "")),
                                    **({"skipped": event["skipped"]} if "skipped" in event else {})})
                skipped = event.get("skipped")
                if event.get("kind") == "rewind" and isinstance(skipped, list) and len(skipped) == 2 and \
                        all(_number(v) for v in skipped):
                    self.rewound.append([float(skipped[0]), float(skipped[1]), self._tokens_before(skipped[0]),
                                         self._tokens_before(skipped[1])])

    def _tokens_before(self, step: float) -> float:
        """The most tokens counted by `step` (rows of the `tokens` series at or before it): the
        count a rewind went back from, never the one it went back to; 0 before the first row."""
        series = self.series.get("tokens")
        points = [*series.points, *([series.last] if series.last else [])] if series is not None else []
        return max((t for s, t in points if s <= step), default=0.0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"x": X_KEY, "series": {k: s.to_json() for k, s in sorted(self.series.items())
                                                      if s.points}}
        if self.heat.points:
            out["heat"] = self.heat.to_json()
        if self.by_tokens.points:
            out["by_tokens"] = self.by_tokens.to_json()
        if self.events:
            out["events"] = self.events[-200:]
        if self.rewound:
            out["rewound"] = self.rewound[-50:]
        if "layer_max" in self.drops:  # a capacity applied (health lists drops only then)
            out["drops"] = dict(self.drops)
        if self.reference:
            out["reference"] = self.reference
        return out


class MetricsReader:
    """Reads `metrics.jsonl` of output folders under one store, incrementally."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.curves: dict[str, Curves] = {}
        self.folders: dict[str, str] = {}  # output folder -> the folder of its newest attempt

    def poll_many(self, dirnames: list[str]) -> bool:
        """Poll several folders: those never read in one concurrent batch, the others from where
        they stopped. True if any curve changed. Each is read in the folder of its newest attempt
        (executor.storage.attempts; one batch of `.status` reads), where a running step writes."""
        try:
            for d, status in self.store.read_statuses(dirnames).items():
                folder = status.data_dir(d) if status is not None else d
                if self.folders.get(d, folder) != folder:
                    self.curves.pop(d, None)  # a new attempt: its curves start again
                self.folders[d] = folder
        except Exception:  # noqa: BLE001 - curves are a detail of the page
            pass
        fresh = [d for d in dirnames if d not in self.curves]
        changed = False
        if fresh:
            paths = {self.store.path(self.folders.get(d, d), METRICS_FILE): d for d in fresh}
            refs = {self.store.path(self.folders.get(d, d), REFERENCE_FILE): d for d in fresh}
            found = self.store.fs.cat([*paths, *refs], on_error="return")
            if not isinstance(found, dict):  # one path: fsspec returns its bytes
                found = {next(iter(paths)): found}
            for path, data in found.items():
                if isinstance(data, bytes) and path in paths:
                    curves = self.curves[paths[path]] = Curves()
                    curves.offset = curves.feed(data)
                    changed |= curves.offset > 0
            for path, data in found.items():
                if isinstance(data, bytes) and path in refs and refs[path] in self.curves:
                    self.curves[refs[path]].reference = parse_reference(data)
        for d in dirnames:
            if d not in fresh:
                changed |= self.poll(d)
        return changed

    def poll(self, dirname: str) -> bool:
        """Read what was appended since the last poll; True if any curve changed."""
        path = self.store.path(self.folders.get(dirname, dirname), METRICS_FILE)
        try:
            size = self.store.fs.size(path)
        except FileNotFoundError:
            return False
        if size is None:
            return False
        curves = self.curves.get(dirname)
        if curves is None or size < curves.offset:  # new, or rewritten by a fresh attempt
            curves = self.curves[dirname] = Curves()
        if size == curves.offset:
            return False
        data = self.store.fs.cat_file(path, start=curves.offset, end=size)
        used = curves.feed(data)
        curves.offset += used
        return used > 0

    def to_json(self, dirname: str) -> dict[str, Any] | None:
        curves = self.curves.get(dirname)
        if curves is None or not curves.series:
            return None
        return curves.to_json()


def parse_reference(data: bytes) -> list[list[float]] | None:
    """A reference curve's points `[[tokens, loss], ...]` (at most MAX_POINTS), from
    `[[t, l], ...]` or `{"tokens": [...], "loss": [...]}`; None if it does not parse."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = list(zip(value.get("tokens") or [], value.get("loss") or []))
    points = [[float(p[0]), float(p[1])] for p in value if isinstance(p, (list, tuple)) and len(p) >= 2
              and _number(p[0]) and _number(p[1])] if isinstance(value, list) else []
    stride = max(1, len(points) // MAX_POINTS)
    return points[::stride] or None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
