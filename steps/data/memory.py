"""A data task's memory: what it declares to Ray, and what it measures against that.

Ray schedules a task that declares `memory=` only where that much is free; a task that then uses
more is what the kernel's OOM killer finds. So every task of the data steps declares a figure
derived from its own inputs (the data plan's per-task formulas, `steps.data.budget`), and checks it:
`bounded(step, part, declared_gb)` measures the task's peak resident memory and raises
`OverBudget`, one line naming the step, the part (a dedup pass, or "task") and both figures,
when it is over.

What is measured: the peak RSS of the process while the task ran (Linux's `VmHWM`, reset when
the task starts by writing 5 to `/proc/self/clear_refs`, so it is this task's peak, not the
process's lifetime one), less the RSS at the start, plus `WORKER_GB`, what the plan counts for a
fresh worker's Python, numpy and fsspec. So the figure is the task's own, the same in a Ray worker
that has run other tasks and in a test's process that holds a whole test suite. Two reads of
/proc a task: nothing to speak of. Where the kernel cannot reset the peak (not Linux), nothing is
measured and nothing is checked. The peak is the process's: the figure is a task's own where the
process runs one task at a time, as a Ray worker runs plain tasks and `local_map` runs them one
after another; a task's own threads (tokenize's reader) are part of it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

GiB = 2**30
WORKER_GB = 0.25  # a Ray worker's Python, numpy and fsspec before a task allocates anything


class OverBudget(MemoryError):
    """A task measured more memory than it declared to Ray."""


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Measure:
    """The task's figure so far (`gb`), from the start of the `bounded` block."""

    def __init__(self) -> None:
        self.ok = _reset_peak()
        self.start_kb = _status_kb("VmRSS") if self.ok else 0

    @property
    def gb(self) -> float:
        if not self.ok:
            return 0.0
        return WORKER_GB + max(0, _status_kb("VmHWM") - self.start_kb) * 1024 / GiB


@contextlib.contextmanager
def bounded(step: str, part: str, declared_gb: float | None) -> Iterator[Measure]:
    """Measure the block as one task (see the module's doc); OverBudget if it peaked above
    `declared_gb` (None or 0: nothing declared, nothing checked)."""
    m = Measure()
    yield m
    used = m.gb
    if declared_gb and used > declared_gb:
        raise OverBudget(f"{step} {part}: a task peaked at {used:.2f} GiB, over the {declared_gb:.2f} GiB it "
                         "declares to Ray")


def checked(fn: Callable[[Any], Any], step: str, part: str, declared_gb: float | None) -> Callable[[Any], Any]:
    """`fn` as a task that measures itself against `declared_gb` (a plain function, so that Ray
    takes it as a remote function)."""
    def task(item: Any) -> Any:
        with bounded(step, part, declared_gb):
            return fn(item)
    task.__name__ = getattr(fn, "__name__", "task")  # Ray names the task by it; no __wrapped__ (pickled by value)
    return task
