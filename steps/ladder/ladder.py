"""A ladder's declaration and the plan-time checks on its rungs (docs/ladder.md).

    LADDER = Ladder(rungs=("1.2e10flops", "3.7e10flops", "1.1e11flops", "3.2e11flops", "9.5e11flops"),
                    seeds=(2, 2, 2, 2, 1), target="top")

Each rung is the recipe at one size (steps/ladder/recipe.py): its training config must equal the
recipe's at that size in every identity field but the seed and the mixture it reads (the rung's
own, rebuilt at its token budget, which must equal the recipe's mixture at that budget). A rung
that differs in anything else is a VoyageError naming the field (exit 2): a ladder of other
recipes predicts nothing about this one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from executor import InputRef, Step, VoyageError

TARGETS = ("top", "run")


@dataclass(frozen=True)
class Ladder:
    """Rungs (sizes of the recipe: `parse_size` text), seeds per rung, and the target: `top`
    (the top rung is held out: the fit on the others predicts it) or `run` (every rung is fitted;
    the voyage's own training run is the target)."""

    rungs: tuple[str, ...]
    seeds: tuple[int, ...]
    target: str = "top"
    metric: str = "loss"  # the eval results' field the law is fitted to
    floor: float | None = None  # pins the law's E; None: fitted

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise VoyageError(f"ladder.target must be one of {TARGETS}, got {self.target!r}")
        if len(self.seeds) != len(self.rungs):
            raise VoyageError(f"ladder.seeds: {len(self.seeds)} seed counts for {len(self.rungs)} rungs")
        if any(s < 1 for s in self.seeds):
            raise VoyageError(f"ladder.seeds: every rung needs at least one seed, got {self.seeds}")
        fitted = len(self.rungs) - (self.target == "top")
        if fitted < 3:
            raise VoyageError(f"ladder: {fitted} rung(s) to fit (target {self.target!r}); the law needs at least 3")


def check_growing(names: list[str], computes: list[float]) -> None:
    for i in range(1, len(computes)):
        if computes[i] <= computes[i - 1]:
            raise VoyageError(f"ladder: compute does not grow from rung {names[i - 1]} ({computes[i - 1]:.3g} FLOPs) "
                              f"to rung {names[i]} ({computes[i]:.3g} FLOPs)")


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted paths of the identity fields (run-only fields skipped) where two configs differ;
    references to other steps compare by step name and sub-path."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            return [path or "."]
        out: list[str] = []
        for f in dataclasses.fields(a):
            if f.metadata.get("run_only"):
                continue
            out += differences(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}" if path else f.name)
        return out
    if isinstance(a, Step) or isinstance(b, Step):
        return [] if isinstance(a, Step) and isinstance(b, Step) and a.name == b.name else [path]
    if isinstance(a, InputRef) or isinstance(b, InputRef):
        same = isinstance(a, InputRef) and isinstance(b, InputRef) and (a.step_name, a.subpath) == (b.step_name, b.subpath)
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}[{k!r}]")
            else:
                out += differences(a[k], b[k], f"{path}[{k!r}]")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [path]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def check_rung(rung: str, what: str, recipe: Any, got: Any, allowed: tuple[str, ...] = ()) -> None:
    """The rung's config `got` must equal the recipe's at that size, `recipe`, in every identity
    field but `allowed` (and what lies under them); else a VoyageError naming the first field."""
    diff = [p for p in differences(recipe, got)
            if not any(p == a or p.startswith(a + ".") or p.startswith(a + "[") for a in allowed)]
    if diff:
        field = diff[0]
        want, have = _at(recipe, field), _at(got, field)
        raise VoyageError(f"ladder: rung {rung}: its {what} differs from the recipe's in {field} ({have!r}, the recipe at "
                          f"this size has {want!r}); a rung may differ from the recipe only in its size")


def _at(obj: Any, path: str) -> Any:
    import re

    for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", path):
        try:
            if part.startswith("["):
                key = part[1:-1]
                obj = obj[int(key)] if key.isdigit() else obj[key.strip("'\"")]
            else:
                obj = getattr(obj, part)
        except (KeyError, IndexError, AttributeError, TypeError):
            return "(absent)"
    if isinstance(obj, InputRef):
        return f"output_of({obj.step_name})"
    return obj
