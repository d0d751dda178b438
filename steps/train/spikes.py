"""Loss and gradient-norm spikes: detect them with a rolling z-score, skip or rewind.

Per optimizer step the trainer hands `SpikeGuard.observe` the step's loss and gradient norm
(before the update, the same numbers on every rank). A value is an outlier when it lies more
than `z` standard deviations above what the last `window` accepted steps predict (only upward: a
loss that falls fast is good news), once `min_samples` steps are in the window. The gradient
norm is scored against the window's mean and deviation; the loss on a detrended window: against
the mean of the window's last quarter, in units of the deviation of the residuals around the
window's least-squares line, so the early descent of a run neither hides a spike (a plain mean
and deviation sit far above the current loss and its noise) nor raises a false one.
Then:

- an isolated outlier: the update is skipped (gradients dropped, the optimizer does not step;
  the schedule and the data move on), as OLMo-core's skip-step optimizer does. A skipped update
  changes no weight and no optimizer state;
- `sustained` outliers in a row are still skipped one by one while nothing leaked into the
  weights: a poisoned stretch of data is dropped step by step, each step judged against the
  window from before it (outliers never enter the window);
- a sustained spike with a lead-in (the steps just before its first outlier scored above z/2:
  their updates were applied, and the detector says they led into it), or one that goes on for
  2 x `sustained` steps (the weights themselves may be damaged by the last update before it):
  a rewind. The trainer loads the newest verified checkpoint at or before the first step to
  drop, trains again, with the same data and the same decisions, up to that step (good steps
  are not thrown away), drops the data of the lead-in and the outliers (`skipped`: [first,
  last]), and goes on after the spike. The score window is the pre-spike window throughout (the
  lead-in's entries removed), never the restored checkpoint's older one. Optimizer step s
  always reads batch s (the data order and --which-saw stay a function of the step).

The guard's state (window, pending drop window, events) is saved in each checkpoint and
restored with it, and every decision is a function of the values seen, so a resumed run makes
the same decisions.

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
DROP = "drop"  # a step whose data a rewind dropped: not read, not trained on
LEAD = 0.5  # a step scoring above LEAD x z just before an outlier led into it


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


def _z_trend(value: float, window: deque) -> float:
    """`value` against the window's recent level (the mean of its last quarter), in units of the
    deviation of the window's residuals around its least-squares line (the same floor as `_z`):
    the descent of the loss inflates neither, and no extrapolation of a curve that flattens
    predicts a level it does not reach."""
    n = len(window)
    mx, my = (n - 1) / 2, sum(window) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(window)) / sxx
    var = sum((y - my - slope * (x - mx)) ** 2 for x, y in enumerate(window)) / max(n - 2, 1)
    std = max(math.sqrt(var), 1e-3 * abs(my), 1e-12)
    k = max(2, n // 4)
    level = sum(list(window)[-k:]) / k
    return (value - level) / std


class SpikeGuard:
    """The rolling statistics and the event log of one run."""

    def __init__(self, cfg: SpikeConfig) -> None:
        self.cfg = cfg
        self.loss: deque = deque(maxlen=cfg.window)
        self.grad: deque = deque(maxlen=cfg.window)
        self.scores: deque = deque(maxlen=cfg.window)  # (step, max z) of the accepted steps that were scored
        self.run: list[int] = []  # steps of the current run of outliers
        self.drop: tuple[int, int] | None = None  # a rewind's data window to drop, until passed
        self.events: list[SpikeEvent] = []

    def dropping(self, step: int) -> bool:
        """Whether a rewind dropped this step's data (the trainer reads nothing for it)."""
        return self.drop is not None and self.drop[0] <= step <= self.drop[1]

    def observe(self, step: int, loss: float, grad_norm: float) -> str:
        """OK (update), SKIP (drop this update) or REWIND (a sustained spike; the trainer calls
        `rewound` once it has gone back). Steps trained again after a rewind get the decisions
        they got the first time, and leave the window as it is."""
        if self.drop is not None and step < self.drop[0]:  # trained again after a rewind
            return SKIP if any(e.step == step and e.kind == SKIP for e in self.events) else OK
        if self.drop is not None and step > self.drop[1]:
            self.drop = None
        if not self.cfg.z or len(self.loss) < self.cfg.min_samples:
            self._accept(loss, grad_norm)
            return OK
        # the log of the loss: a spike is a ratio, whatever the loss's level
        z_loss = _z_trend(math.log(max(loss, 1e-12)), self.loss)
        z_grad = _z(math.log(max(grad_norm, 1e-12)), self.grad)
        if max(z_loss, z_grad) <= self.cfg.z:
            self._accept(loss, grad_norm)
            self.scores.append((step, max(z_loss, z_grad)))
            self.run = []
            return OK
        self.run.append(step)
        sustained = bool(self.cfg.sustained and len(self.run) >= self.cfg.sustained)
        rewind = sustained and (self.lead_in() < self.run[0] or len(self.run) >= 2 * self.cfg.sustained)
        self.events.append(SpikeEvent(step, REWIND if rewind else SKIP, loss, grad_norm, round(z_loss, 3),
                                      round(z_grad, 3)))
        return REWIND if rewind else SKIP

    def _accept(self, loss: float, grad_norm: float) -> None:
        self.loss.append(math.log(max(loss, 1e-12)))
        self.grad.append(math.log(max(grad_norm, 1e-12)))

    def lead_in(self) -> int:
        """The first step of the lead-in of the current run of outliers: the accepted steps right
        before its first outlier that scored above LEAD x z (the run's first step if none)."""
        first = expected = self.run[0]
        for step, score in reversed(self.scores):
            if step != expected - 1 or score <= LEAD * self.cfg.z:
                break
            first = expected = step
        return first

    def drop_from(self) -> int:
        """The first step whose data a rewind now drops: the lead-in's first, else (a spike that
        went on with no lead-in) the step before the first outlier, whose update was the last."""
        lead = self.lead_in()
        return lead if lead < self.run[0] else max(self.run[0] - 1, 0)

    def rewound(self, to_step: int, spike_step: int) -> None:
        """After the trainer went back to checkpoint `to_step`: the steps from there to
        `drop_from()` are trained again (same decisions), the data of `drop_from()`..`spike_step`
        dropped; the window stays the pre-spike one, less the dropped steps' entries."""
        start = self.drop_from()
        dropped = sum(1 for step, _ in self.scores if step >= start)  # accepted, now dropped
        for window in (self.loss, self.grad):
            for _ in range(min(dropped, len(window))):
                window.pop()
        self.scores = deque(((s, z) for s, z in self.scores if s < start), maxlen=self.cfg.window)
        self.drop = (start, spike_step)
        self.events[-1] = dataclasses.replace(self.events[-1], to_step=to_step, skipped=(start, spike_step))
        self.run = []

    def not_rewound(self, note: str) -> None:
        """The trainer found nothing to rewind to: the sustained spike's last outlier stays a
        skipped update, with `note` saying why."""
        self.events[-1] = dataclasses.replace(self.events[-1], kind=SKIP, note=note)
        self.run = []

    def state_dict(self) -> dict[str, Any]:
        return {"loss": list(self.loss), "grad": list(self.grad), "run": list(self.run),
                "scores": [list(x) for x in self.scores], "drop": None if self.drop is None else list(self.drop),
                "events": [e.as_dict() for e in self.events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss = deque(state.get("loss", ()), maxlen=self.cfg.window)
        self.grad = deque(state.get("grad", ()), maxlen=self.cfg.window)
        self.scores = deque((tuple(x) for x in state.get("scores", ())), maxlen=self.cfg.window)
        self.run = list(state.get("run", ()))
        self.drop = None if state.get("drop") is None else tuple(state["drop"])
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
