"""The drawing model every format shares: a plan as steps, boxes and links.

A *box* is what the layout engine places: one step, or a group of parallel steps (siblings under
one name prefix at the same depth, `tokenized/*`) drawn as one box holding a cell per step. So the
engine lays out tens of boxes where a voyage has thousands of steps: a 10,000-step plan is laid
out in well under a second, and the drawing stays readable. Every step is still drawn (as a box
or a cell) and clickable in the HTML; the text formats draw a group as one node with its counts.

Grouping is a pure function of names and depths, so the same plan always draws the same way:
- level 0: siblings (same name prefix, same depth) form a group when there are `GROUP_MIN` of them;
- while more than `LAYOUT_MAX` boxes remain (a 10,000-step chain), neighbouring depths of one
  prefix are merged (depth // 2, // 4, ...), then prefixes are ignored. Edges inside a group are
  not drawn as links (the HTML draws a selected step's own edges).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

from executor.identity import plain
from executor.plan import Plan
from executor.state import StepState


GROUP_MIN = 16  # parallel siblings drawn as one box
LAYOUT_MAX = 800  # boxes handed to a layout engine, at most (when the grouping can get there)
TRACEBACK_TAIL = 2000  # characters of a failed attempt's traceback kept in a drawing


@dataclass
class Box:
    """One node for the layout engine: a step, or a group of steps."""

    members: list[int]  # indices into Drawing.steps, in natural name order
    label: str  # the step's name, or `prefix*` for a group

    @property
    def is_group(self) -> bool:
        return len(self.members) > 1


@dataclass
class Drawing:
    """A plan ready to draw in any format."""

    title: str
    prefix: str
    planned_at: float
    steps: list[dict[str, Any]]
    boxes: list[Box]
    links: list[tuple[int, int, int, int]]  # (box from, box to, edges, edges from a changed input)
    box_of: list[int] = field(default_factory=list)

    def counts(self) -> Counter:
        return Counter(s["state"] for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "prefix": self.prefix, "planned_at": self.planned_at,
                "steps": self.steps, "boxes": [[b.label, b.members] for b in self.boxes],
                "links": [list(link) for link in self.links]}


def draw(plan: Plan, title: str = "", records: bool = True) -> Drawing:
    """The drawing model of `plan`; `records` reads each existing output's `.step.json`."""
    index = {d.name: i for i, d in enumerate(plan.decisions)}
    recs = read_records(plan) if records else {}
    lineage = plan.lineage
    steps: list[dict[str, Any]] = []
    for d in plan.decisions:
        node = d.node
        step: dict[str, Any] = {
            "name": d.name, "state": d.state, "reason": d.reason, "type": node.step.type.key,
            "digest": node.digest, "path": plan.store.url(node.dirname),
            "resources": node.step.resources.describe(),
            "deps": [index[dep.name] for dep in node.deps],
            "config": plain(node.step.config),  # JSON-ready: refs as {"$output_of": name}
        }
        if d.stale_inputs:
            step["stale"] = [{"input": s.name, "recorded": s.recorded, "current": s.current} for s in d.stale_inputs]
        if d.conditional_on:
            step["conditional_on"] = list(d.conditional_on)
        if d.holder is not None:
            step["holder"] = d.holder.describe()
        if d.code_drift:
            step["code_drift"] = True
        if d.env_drift:
            step["env_drift"] = d.env_drift
        if d.output_problem:
            step["output_problem"] = d.output_problem
        if lineage is not None:  # licences reaching the step (docs/provenance.md), from the DAG
            step["licenses"] = lineage.licenses_of(d.name)
            if d.name in lineage.declared:
                step["source"] = lineage.declared[d.name].to_json()
            policy = lineage.policy_of(node)
            if policy is not None:
                step["policy"] = policy.describe()
        if d.name in recs:
            step["record"] = recs[d.name]
        steps.append(step)
    names = [d.name for d in plan.decisions]
    deps = [s["deps"] for s in steps]
    boxes = group_boxes(names, deps)
    box_of = [0] * len(steps)
    for b, box in enumerate(boxes):
        for m in box.members:
            box_of[m] = b
    stale_pairs = {(index[s["input"]], i) for i, st in enumerate(steps) for s in st.get("stale", ())}
    counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for i, ds in enumerate(deps):
        for dep in ds:
            a, b = box_of[dep], box_of[i]
            if a != b:
                counts[(a, b)][0] += 1
                counts[(a, b)][1] += (dep, i) in stale_pairs
    links = [(a, b, n, s) for (a, b), (n, s) in counts.items()]
    return Drawing(title or "plan", plan.store.prefix, plan.planned_at, steps, boxes, links, box_of)


# -- grouping -----------------------------------------------------------------------------------

def depths(deps: Sequence[Sequence[int]]) -> list[int]:
    """Longest path from a source, for steps listed dependencies first."""
    out = [0] * len(deps)
    for i, ds in enumerate(deps):
        out[i] = max((out[d] + 1 for d in ds), default=0)
    return out


def group_boxes(names: Sequence[str], deps: Sequence[Sequence[int]]) -> list[Box]:
    """Boxes for steps `names` (dependencies first): see the module docstring."""
    depth = depths(deps)
    parents = [n.rpartition("/")[0] for n in names]
    boxes = _group(names, parents, depth, shift=0, min_size=GROUP_MIN)
    shift = 1
    while len(boxes) > LAYOUT_MAX and (max(depth, default=0) >> (shift - 1)) > 0:
        boxes = _group(names, parents, depth, shift=shift, min_size=2)
        shift += 1
    if len(boxes) > LAYOUT_MAX:  # many prefixes with a few steps each: group by depth alone
        no_parents = ["*"] * len(names)
        shift = 0
        while True:
            boxes = _group(names, no_parents, depth, shift=shift, min_size=2)
            if len(boxes) <= LAYOUT_MAX or (max(depth, default=0) >> shift) == 0:
                break
            shift += 1
    return boxes


def _group(names: Sequence[str], parents: Sequence[str], depth: Sequence[int], shift: int,
           min_size: int) -> list[Box]:
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, parent in enumerate(parents):
        groups[(parent, depth[i] >> shift)].append(i)
    boxes: list[Box] = []
    for (parent, _), members in groups.items():
        if len(members) >= min_size and parent:
            members.sort(key=lambda i: _natural(names[i]))
            boxes.append(Box(members, _common_prefix([names[i] for i in members]) + "*"))
        else:
            boxes.extend(Box([i], names[i]) for i in members)
    boxes.sort(key=lambda b: min(b.members))
    return boxes


def _natural(name: str) -> list[Any]:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _common_prefix(names: list[str]) -> str:
    lo, hi = min(names), max(names)
    n = 0
    while n < len(lo) and n < len(hi) and lo[n] == hi[n]:
        n += 1
    return lo[:n]


# -- records --------------------------------------------------------------------------------------

def read_records(plan: Plan) -> dict[str, dict[str, Any]]:
    """A summary of the record of every step whose output folder has a status (one batch read)."""
    with_status = [d for d in plan.decisions if d.status is not None]
    if not with_status:
        return {}
    store = plan.store
    where = store.record_paths({d.node.dirname: d.status for d in with_status})  # the committed attempt's
    paths = {where[d.node.dirname]: d.name for d in with_status if d.node.dirname in where}
    if not paths:
        return {}
    try:
        raw = store.fs.cat(list(paths), on_error="return")
    except Exception:  # a drawing without records is still a drawing
        return {}
    out: dict[str, dict[str, Any]] = {}
    for path, name in paths.items():
        data = raw.get(path) if isinstance(raw, dict) else None
        if not isinstance(data, bytes):
            continue
        try:
            out[name] = summarize_record(json.loads(data))
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def summarize_record(rec: dict[str, Any]) -> dict[str, Any]:
    """What a drawing shows of a record: states, digests, attempts; not the whole manifest."""
    manifest = rec.get("manifest") or []
    attempts = []
    for a in rec.get("attempts") or []:
        attempt = {k: a.get(k) for k in ("number", "state", "started", "ended", "host", "node", "error") if a.get(k)}
        if a.get("traceback") and a.get("state") != StepState.SUCCESS:
            attempt["traceback"] = a["traceback"][-TRACEBACK_TAIL:]
        attempts.append(attempt)
    summary = {
        "state": rec.get("state"), "output_digest": rec.get("output_digest"),
        "code_fingerprint": rec.get("code_fingerprint"), "created": rec.get("created"),
        "updated": rec.get("updated"),
        "inputs": [{"name": i.get("name"), "output_digest": i.get("output_digest")} for i in rec.get("inputs") or []],
        "files": len(manifest), "bytes": sum(int(e.get("size") or 0) for e in manifest),
        "results": rec.get("results") or {}, "attempts": attempts,
    }
    provenance = rec.get("provenance") or {}
    if provenance:  # the licences it consumed and, for the mixture and training, tokens per source and licence
        tokens = provenance.get("tokens") or {}
        summary["provenance"] = {"licenses": provenance.get("licenses") or [],
                                 **{k: tokens[k] for k in ("total", "steps", "by_source", "by_license") if k in tokens}}
    if rec.get("environment"):
        summary["environment"] = rec["environment"]
    return _json_safe(summary)


# -- helpers --------------------------------------------------------------------------------------

def _json_safe(value: Any) -> Any:
    """`value` with what JSON cannot carry (NaN, infinities, tuples, odd keys) made plain."""
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
