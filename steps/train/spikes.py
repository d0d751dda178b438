"""Loss and gradient-norm spikes: detect them with a rolling z-score, skip or rewind.

Per optimizer step the trainer hands `SpikeGuard.observe` the step's loss and gradient norm
(before the update, the same numbers on every rank). A value is an outlier when it lies more
than `z` standard deviations above the mean of the last `window` accepted steps (only upward:
a loss that falls fast is good news), once `min_samples` steps are in the window. Then:

- an isolated outlier: the update is skipped (gradients dropped, the optimizer does not step;
  the schedule and the data move on), as OLMo-core's skip-step optimizer does;
- `sustained` outliers in a row: a sustained spike. The trainer rewinds to the newest verified
  checkpoint at or before the first outlier of the run and skips the data window that led into
  it: optimizer steps [checkpoint, spike] are never trained on; training continues at the step
  after the spike, so optimizer step s still reads batch s (the data order and --which-saw stay
  a function of the step), with the learning rate of that step. PaLM restarted ~100 steps
  before a spike and skipped 200-500 batches by hand; this does it on its own.

Outliers never enter the window, so a spike does not teach the detector that spikes are normal.
The guard's state (window, events) is saved in each checkpoint and restored with it, and every
decision is a function of the values seen, so a resumed run makes the same decisions. On a
rewind the window comes back from the checkpoint but the events are kept (they happened).

Events are `SpikeEvent`s (frozen); in a checkpoint's meta.json and the step's results they are
dicts {"step", "kind": "skip" | "rewind", "loss", "grad_norm", "z_loss", "z_grad"} plus, for a
rewind, "to_step" (the checkpoint) and "skipped": [first, last] optimizer steps whose data is
never trained on. `skipped_ranges` is the one reader of what they skipped (pretrain's provenance,
--which-saw).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from executor import VoyageError

OK, SKIP, REWIND = "ok", "skip", "rewind"


@dataclass(frozen=True)
class SpikeConfig:
    """Spike detection (part of the step's identity: it decides which updates happen).

    `z`: standard deviations above the rolling mean that make an outlier (0 turns detection
    off); `window`: accepted steps the mean and deviation are taken over; `min_samples`: steps
    in the window before anything counts; `sustained`: outliers in a row that make a rewind
    (0: never rewind, only skip)."""

    z: float = 6.0
    window: int = 128
    min_samples: int = 64
    sustained: int = 3

    def __post_init__(self) -> None:
        if self.z < 0 or (self.z and self.z < 1):
            raise VoyageError(f"optimizer.spikes.z must be 0 (off) or >= 1, got {self.z}")
        if self.window < 2 or not 2 <= self.min_samples <= self.window:
            raise VoyageError(f"optimizer.spikes: need 2 <= min_samples ({self.min_samples}) <= window "
                              f"({self.window})")
        if self.sustained < 0:
            raise VoyageError(f"optimizer.spikes.sustained must be >= 0, got {self.sustained}")


@dataclass(frozen=True)
class SpikeEvent:
    """One decision of the guard: an outlier whose update was skipped, or the last outlier of a
    sustained spike, rewound (`to_step`: the checkpoint; `skipped`: [first, last] optimizer steps
    whose data is never trained on). `note`: why a sustained spike stayed a skip."""

    step: int
    kind: str  # SKIP or REWIND
    loss: float
    grad_norm: float
    z_loss: float
    z_grad: float
    to_step: int | None = None
    skipped: tuple[int, int] | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (meta.json, results, metrics rows): unset fields left out."""
        out: dict[str, Any] = {"step": self.step, "kind": self.kind, "loss": self.loss, "grad_norm": self.grad_norm,
                               "z_loss": self.z_loss, "z_grad": self.z_grad}
        if self.to_step is not None:
            out["to_step"] = self.to_step
        if self.skipped is not None:
            out["skipped"] = list(self.skipped)
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpikeEvent":
        skipped = d.get("skipped")
        return cls(step=int(d["step"]), kind=str(d["kind"]), loss=float(d.get("loss", math.nan)),
                   grad_norm=float(d.get("grad_norm", math.nan)), z_loss=float(d.get("z_loss", math.nan)),
                   z_grad=float(d.get("z_grad", math.nan)), to_step=d.get("to_step"),
                   skipped=None if skipped is None else (int(skipped[0]), int(skipped[1])), note=str(d.get("note", "")))


def skipped_ranges(events: Iterable[SpikeEvent | dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(first, last, kind) optimizer-step ranges whose data was not trained on, one per event in
    the events' order: a rewind's skipped window, a skipped update's own step."""
    out = []
    for e in events:
        e = e if isinstance(e, SpikeEvent) else SpikeEvent.from_dict(e)
        if e.kind == REWIND and e.skipped is not None:
            out.append((e.skipped[0], e.skipped[1], REWIND))
        elif e.kind == SKIP:
            out.append((e.step, e.step, SKIP))
    return out


def _z(value: float, window: deque) -> float:
    n = len(window)
    mean = sum(window) / n
    var = sum((v - mean) ** 2 for v in window) / (n - 1)
    # a floor on the deviation: a window of identical values would make any change infinite
    std = max(math.sqrt(var), 1e-3 * abs(mean), 1e-12)
    return (value - mean) / std


class SpikeGuard:
    """The rolling statistics and the event log of one run."""

    def __init__(self, cfg: SpikeConfig) -> None:
        self.cfg = cfg
        self.loss: deque = deque(maxlen=cfg.window)
        self.grad: deque = deque(maxlen=cfg.window)
        self.run: list[int] = []  # steps of the current run of outliers
        self.events: list[SpikeEvent] = []

    def observe(self, step: int, loss: float, grad_norm: float) -> str:
        """OK (update), SKIP (drop this update) or REWIND (a sustained spike; the trainer calls
        `rewound` once it has gone back)."""
        if not self.cfg.z or len(self.loss) < self.cfg.min_samples:
            self._accept(loss, grad_norm)
            return OK
        # the log of the loss: a spike is a ratio, whatever the loss's level
        z_loss = _z(math.log(max(loss, 1e-12)), self.loss)
        z_grad = _z(math.log(max(grad_norm, 1e-12)), self.grad)
        if max(z_loss, z_grad) <= self.cfg.z:
            self._accept(loss, grad_norm)
            self.run = []
            return OK
        self.run.append(step)
        rewind = bool(self.cfg.sustained and len(self.run) >= self.cfg.sustained)
        self.events.append(SpikeEvent(step, REWIND if rewind else SKIP, loss, grad_norm, round(z_loss, 3),
                                      round(z_grad, 3)))
        return REWIND if rewind else SKIP

    def _accept(self, loss: float, grad_norm: float) -> None:
        self.loss.append(math.log(max(loss, 1e-12)))
        self.grad.append(math.log(max(grad_norm, 1e-12)))

    @property
    def spike_start(self) -> int:
        """The first step of the current run of outliers."""
        return self.run[0]

    def rewound(self, to_step: int, spike_step: int, state: dict[str, Any] | None) -> None:
        """After the trainer went back to checkpoint `to_step`: the window as it was then (from
        that checkpoint's `state_dict()`), the events as they are now, the rewind noted."""
        events = self.events
        if state:
            self.load_state_dict(state)
        self.events = events
        self.events[-1] = dataclasses.replace(events[-1], to_step=to_step, skipped=(to_step, spike_step))
        self.run = []

    def not_rewound(self, note: str) -> None:
        """The trainer found nothing to rewind to: the sustained spike's last outlier stays a
        skipped update, with `note` saying why."""
        self.events[-1] = dataclasses.replace(self.events[-1], kind=SKIP, note=note)
        self.run = []

    def state_dict(self) -> dict[str, Any]:
        return {"loss": list(self.loss), "grad": list(self.grad), "run": list(self.run),
                "events": [e.as_dict() for e in self.events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss = deque(state.get("loss", ()), maxlen=self.cfg.window)
        self.grad = deque(state.get("grad", ()), maxlen=self.cfg.window)
        self.run = list(state.get("run", ()))
        self.events = [SpikeEvent.from_dict(e) for e in state.get("events", ())]


def trained_ranges(start: int, end: int, events: Iterable[SpikeEvent | dict[str, Any]]) -> list[tuple[int, int]]:
    """The [a, b) optimizer-step ranges of [start, end) whose data was trained on: all of it less
    the windows rewinds skipped (a skipped update still read its batch's data: it is not in a
    rewind window, so it counts as read, though it changed nothing)."""
    cut = sorted((a, b + 1) for a, b, kind in skipped_ranges(events) if kind == REWIND)
    out, at = [], start
    for a, b in cut:
        a, b = max(a, start), min(b, end)
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out
