"""Colours and words for plan and run states, shared by the terminal and every drawing."""

from __future__ import annotations

# Most urgent first: a group box takes the colour of its most urgent member.
STATE_ORDER = ("FAILED", "BLOCKED", "RUNNING", "WAITING", "PENDING", "STALE", "RETRY", "RERUN", "RUN",
               "SUCCESS", "CACHED", "SKIPPED")

# state -> (fill, line)
COLORS = {
    "FAILED": ("#fecaca", "#b91c1c"),
    "BLOCKED": ("#e7e5e4", "#57534e"),
    "RUNNING": ("#7dd3fc", "#0369a1"),
    "WAITING": ("#e9d5ff", "#7e22ce"),
    "PENDING": ("#dbeafe", "#3b82f6"),
    "STALE": ("#fde68a", "#b45309"),
    "RETRY": ("#fed7aa", "#c2410c"),
    "RERUN": ("#c7d2fe", "#4338ca"),
    "RUN": ("#bfdbfe", "#1d4ed8"),
    "SUCCESS": ("#bbf7d0", "#15803d"),
    "CACHED": ("#e2e8f0", "#64748b"),
    "SKIPPED": ("#f8fafc", "#94a3b8"),
}

DESCRIPTIONS = {
    "FAILED": "failed in this run",
    "BLOCKED": "a dependency failed",
    "RUNNING": "running now",
    "WAITING": "leased by another executor",
    "PENDING": "will run",
    "STALE": "an input's output changed since it was made",
    "RETRY": "failed or was interrupted before",
    "RERUN": "forced by --rerun",
    "RUN": "no output yet",
    "SUCCESS": "made in this run",
    "CACHED": "output exists",
    "SKIPPED": "not selected, or needed by nothing that runs",
}

# rich styles for the terminal
RICH = {
    "FAILED": "bold red", "BLOCKED": "red", "RUNNING": "bold cyan", "WAITING": "magenta",
    "PENDING": "blue", "STALE": "bold yellow", "RETRY": "dark_orange", "RERUN": "bold blue",
    "RUN": "blue", "SUCCESS": "green", "CACHED": "dim", "SKIPPED": "dim",
}
