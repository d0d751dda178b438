"""When a training step saves a checkpoint, which it keeps, and where they lie. Torch-free: the
trainer (steps/train/loop.py, steps/train/saving.py), retention (steps/train/checkpoint.py) and
`--which-saw` (steps/provenance/which_saw.py) all read the cadence and the layout from here, so
a change to either is a change to all three.

Layout, under a training step's output:

    checkpoints/step-N/     N optimizer steps done (the files: steps/train/checkpoint.py)
        meta.json           written last: the folder counts as a checkpoint once it exists
        run.json            a log of how the save came about (out of the output digest)

Cadence: step-N is saved when N is a multiple of `every`, a multiple of `permanent_every`
(when set), or the phase's last step (`final_step`). Retention keeps the newest `keep_last`,
every multiple of `permanent_every`, and the final step.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Iterable

import fsspec

CHECKPOINTS = "checkpoints"
META = "meta.json"
RUN = "run.json"  # a log of the training steps (steps.train.pretrain.LOGS)
FILES = "files"  # meta.json: {file name: {"size": bytes, "sha256": hex}} of every file DCP wrote
_STEP_RE = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class CheckpointConfig:
    """The checkpoint cadence and retention of one training phase, ending at `final_step`."""

    every: int
    final_step: int
    keep_last: int = 2
    permanent_every: int = 0

    @classmethod
    def of(cls, trainer: Any, final_step: int) -> "CheckpointConfig":
        """From a TrainerConfig (`checkpoint_every`, `keep_last`, `permanent_every`)."""
        return cls(every=int(trainer.checkpoint_every), final_step=int(final_step), keep_last=int(trainer.keep_last),
                   permanent_every=int(trainer.permanent_every))

    def due(self, step: int) -> bool:
        """Whether checkpoint step-`step` is saved (after `step` optimizer steps are done)."""
        return (step % self.every == 0 or step == self.final_step
                or bool(self.permanent_every and step % self.permanent_every == 0))

    def first_after(self, step: int) -> int:
        """The first checkpoint saved after optimizer step `step` (0-based) is done: step-N for the
        least N > `step` that is due."""
        n = step + 1
        options = [self.final_step] + [math.ceil(n / k) * k for k in (self.every, self.permanent_every) if k]
        return min(o for o in options if o >= n)

    def kept(self, steps: Iterable[int]) -> set[int]:
        """Of the checkpoints `steps` present, those retention keeps."""
        have = sorted(set(steps))
        keep = set(have[-self.keep_last:]) if self.keep_last else set()
        keep |= {s for s in have if s == self.final_step or (self.permanent_every and s % self.permanent_every == 0)}
        return keep


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint folder: its step and URL."""

    step: int
    url: str


def root_of(output: str) -> str:
    return f"{output.rstrip('/')}/{CHECKPOINTS}"


def folder(output: str, step: int) -> str:
    return f"{root_of(output)}/step-{step}"


def step_of(url: str) -> int | None:
    """N of a `.../step-N` folder, else None."""
    m = _STEP_RE.match(posixpath.basename(url.rstrip("/")))
    return int(m.group(1)) if m else None


def list_checkpoints(output: str, *, complete: bool = True) -> list[SavedCheckpoint]:
    """The checkpoint folders under a training output, oldest first (only complete ones, those
    with a meta.json, unless `complete=False`)."""
    fs, root = fsspec.core.url_to_fs(root_of(output))
    try:
        entries = fs.ls(root, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        n = step_of(entry)
        if n is not None and (not complete or fs.exists(posixpath.join(entry, META))):
            found.append(SavedCheckpoint(n, folder(output, n)))
    return sorted(found, key=lambda f: f.step)


def size_problem(url: str, meta: dict[str, Any] | None = None) -> tuple[str, str] | None:
    """The cheap check of a checkpoint folder (one listing, no data read; torch-free, for a
    dry-run): (file, what is wrong) for the first file of meta.json's `files` that is missing or
    of another size than recorded; None when all match (or none are recorded)."""
    fs, path = fsspec.core.url_to_fs(url)
    if meta is None:
        with fs.open(posixpath.join(path, META), "r") as f:
            meta = json.load(f)
    recorded = meta.get(FILES) or {}
    sizes = {posixpath.basename(e["name"]): e["size"] for e in fs.ls(path, detail=True, refresh=True)}
    for name, rec in sorted(recorded.items()):
        if name not in sizes:
            return name, "missing"
        if sizes[name] != rec["size"]:
            return name, f"size check: {sizes[name]} bytes, {rec['size']} when saved"
    return None


def newest_problem(output: str) -> str | None:
    """The dry-run's look at a training output (the step types' `check_output`): its newest
    complete checkpoint (the one a resume, `init_from`, eval or export would load) against the
    sizes its meta.json recorded; one line naming the checkpoint, the file and the check, or None.
    One listing of `checkpoints/`, a read of one meta.json and a listing of one folder; no data read."""
    local = "://" not in output or output.startswith("file://")
    if local:
        import os

        root = root_of(output.removeprefix("file://"))
        try:
            names = os.listdir(root)
        except (FileNotFoundError, NotADirectoryError):
            return None
        exists = os.path.exists
    else:
        fs, root = fsspec.core.url_to_fs(root_of(output))
        try:
            names = [posixpath.basename(e.rstrip("/")) for e in fs.ls(root, detail=False, refresh=True)]
        except FileNotFoundError:
            return None
        exists = fs.exists
    steps = sorted((n for n in map(step_of, names) if n is not None), reverse=True)
    for n in steps:
        if exists(posixpath.join(root, f"step-{n}", META)):
            problem = size_problem(folder(output, n))
            return None if problem is None else f"newest checkpoint step-{n}: {problem[0]}: {problem[1]}"
    return None
