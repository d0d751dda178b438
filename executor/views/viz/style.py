"""Colours and words for step states (executor.state), shared by the terminal and every drawing.

Keyed by `StepState`; the keys are also the state strings that JSON, CSS classes (`.s-STALE`)
and the page's script see, so every vocabulary draws from this one table."""

from __future__ import annotations

from executor.state import URGENCY, StepState

S = StepState

# Most urgent first: a group box takes the colour of its most urgent member.
STATE_ORDER = URGENCY

# state -> (fill, line)
COLORS: dict[StepState, tuple[str, str]] = {
    S.FAILED: ("#fecaca", "#b91c1c"),
    S.BLOCKED: ("#e7e5e4", "#57534e"),
    S.RUNNING: ("#7dd3fc", "#0369a1"),
    S.WAITING: ("#e9d5ff", "#7e22ce"),
    S.PENDING: ("#dbeafe", "#3b82f6"),
    S.STALE: ("#fde68a", "#b45309"),
    S.RETRY: ("#fed7aa", "#c2410c"),
    S.RERUN: ("#c7d2fe", "#4338ca"),
    S.RUN: ("#bfdbfe", "#1d4ed8"),
    S.INTERRUPTED: ("#fde2e2", "#9f1239"),
    S.SUCCESS: ("#bbf7d0", "#15803d"),
    S.CACHED: ("#e2e8f0", "#64748b"),
    S.SKIPPED: ("#f8fafc", "#94a3b8"),
}

DESCRIPTIONS: dict[StepState, str] = {
    S.FAILED: "failed in this run",
    S.BLOCKED: "an input failed or has no output",
    S.RUNNING: "running now",
    S.WAITING: "leased by another executor",
    S.PENDING: "will run",
    S.STALE: "an input's output changed since it was made",
    S.RETRY: "failed or was interrupted before",
    S.RERUN: "forced by --rerun",
    S.RUN: "no output yet",
    S.INTERRUPTED: "an attempt that died before it finished",
    S.SUCCESS: "made in this run",
    S.CACHED: "output exists",
    S.SKIPPED: "not selected, or needed by nothing that runs",
}

# rich styles for the terminal
RICH: dict[StepState, str] = {
    S.FAILED: "bold red", S.BLOCKED: "red", S.RUNNING: "bold cyan", S.WAITING: "magenta",
    S.PENDING: "blue", S.STALE: "bold yellow", S.RETRY: "dark_orange", S.RERUN: "bold blue",
    S.RUN: "blue", S.INTERRUPTED: "red", S.SUCCESS: "green", S.CACHED: "dim", S.SKIPPED: "dim",
}
