"""What holds what a checkpoint learnt: the checkpoints and folders that descend from one.

A checkpoint that trained on a document holds what it learnt from it, and so does everything
made from that checkpoint's weights:

- a training step started from it (`init_from`: midtrain from pretrain, or from an import):
  every checkpoint it writes, from its first, whatever its own batches read;
- an `export_hf` folder of it (`checkpoint`), and an `import_hf` checkpoint of such a folder (`hf`).

Which checkpoint a reference names is what the consuming step resolves: `checkpoints/step-N` when
the reference says so, else the producer's newest checkpoint (`steps.train.checkpoint.resolve`),
which is the one its output holds now, or the one it writes last (its phase's end) when it has none
yet. A training step's checkpoint step-N holds the document when the step was started from a
holder, or when one of its own optimizer steps s < N read it. Torch-free: step types are told
apart by name, checkpoints by their folders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from executor import InputRef, Plan

TRAINING_TYPES = ("pretrain", "midtrain")
# step type -> the config field that names the checkpoint or folder its weights come from
MADE_FROM = {"midtrain": "init_from", "pretrain": "init_from", "export_hf": "checkpoint", "import_hf": "hf"}
_STEP_DIR = re.compile(r"(?:^|/)checkpoints/step-(\d+)/?$")


@dataclass
class Parent:
    """The checkpoint (or folder) a step's weights were made from, when that one holds the document."""

    step: str
    checkpoint: int | None  # its checkpoint step-N; None for a folder without checkpoints (an export)

    def describe(self) -> str:
        return self.step + (f" step-{self.checkpoint}" if self.checkpoint is not None else "")


@dataclass
class Holding:
    """Whether one step's output holds the document, and why."""

    step: str
    kind: str  # the step type
    state: str  # its plan state
    parent: Parent | None = None  # made from a holder: everything it writes holds the document
    first_own: int | None = None  # training: the first of its own optimizer steps that read it
    checkpoints_now: list[int] = field(default_factory=list)  # its checkpoints in the output that hold it

    @property
    def holds(self) -> bool:
        return self.parent is not None or self.first_own is not None

    def holds_checkpoint(self, n: int | None) -> bool:
        """Whether its checkpoint step-n (None: the folder itself) holds the document."""
        if self.parent is not None:
            return True
        return self.first_own is not None and (n is None or n > self.first_own)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "state": self.state, "holds": self.holds,
                "made_from": None if self.parent is None else {"step": self.parent.step,
                                                              "checkpoint": self.parent.checkpoint},
                "checkpoints_now": self.checkpoints_now}


def holdings(plan: Plan, own_first: dict[str, int | None], checkpoints: Callable[[str], list[int]],
             phase_end: Callable[[Any], int | None]) -> dict[str, Holding]:
    """Step name -> Holding for every step that holds weights (training, export_hf, import_hf), in
    DAG order. `own_first[name]` is a training step's first own optimizer step that read the
    document (absent or None: none did); `checkpoints(url)` lists a training output's complete
    checkpoints; `phase_end(node)` is the step a training node writes its last checkpoint at."""
    out: dict[str, Holding] = {}
    for node in plan.dag:  # topological: a parent is decided before its children
        kind = node.step.type.name
        if kind not in MADE_FROM:
            continue
        decision = plan[node.name]
        h = Holding(step=node.name, kind=kind, state=str(decision.state), first_own=own_first.get(node.name))
        ref = getattr(node.step.config, MADE_FROM[kind], None)
        if isinstance(ref, InputRef) and ref.step_name in out:
            parent = out[ref.step_name]
            n = _checkpoint_named(plan, ref, parent, checkpoints, phase_end)
            if parent.holds_checkpoint(n):
                h.parent = Parent(parent.step, n)
        if h.holds and decision.has_output and kind in TRAINING_TYPES + ("import_hf",):
            h.checkpoints_now = [n for n in checkpoints(plan.path(node)) if h.holds_checkpoint(n)]
        out[node.name] = h
    return out


def _checkpoint_named(plan: Plan, ref: InputRef, parent: Holding, checkpoints: Callable[[str], list[int]],
                      phase_end: Callable[[Any], int | None]) -> int | None:
    """The checkpoint step a reference to `parent`'s output resolves to (None: a folder, an export)."""
    if parent.kind == "export_hf":
        return None
    m = _STEP_DIR.search(ref.subpath or "")
    if m:
        return int(m.group(1))
    node = plan.dag[ref.step_name]
    if plan[node.name].has_output:
        found = checkpoints(plan.path(node))
        if found:
            return found[-1]
    return 0 if parent.kind == "import_hf" else phase_end(node)
