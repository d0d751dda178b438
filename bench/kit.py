"""What the bench scripts share: ROOT, `timed` (wall and CPU seconds over repeats) and `emit`
(one human line on stdout and one JSON line appended to the results file).

The results file is $BENCH_OUT when set, else bench/results/<script>.jsonl (git-ignored).
`python -m bench.report FILE...` turns those lines into a markdown table for docs/benchmarks.md."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of `repeats` timed calls (warm-up calls excluded); `value` is the last call's result."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...]
    value: Any = None

    @property
    def wall_min(self) -> float:
        return min(self.wall)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_min(self) -> float:
        return min(self.cpu)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    def figures(self, prefix: str = "") -> dict[str, float]:
        """min/median wall and CPU seconds as keyword figures for `emit`."""
        return {f"{prefix}wall_min_s": self.wall_min, f"{prefix}wall_median_s": self.wall_median,
                f"{prefix}cpu_min_s": self.cpu_min, f"{prefix}cpu_median_s": self.cpu_median}


def timed(fn: Callable[[], Any], repeats: int = 1, warmup: int = 0) -> Timing:
    """Call `fn` `warmup` times untimed, then `repeats` times, each timed in wall (perf_counter)
    and this process's CPU (process_time) seconds."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"timed: repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    wall, cpu, value = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        value = fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return Timing(tuple(wall), tuple(cpu), value)


def _script() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.startswith("bench."):
        return spec.name.split(".", 1)[1]
    return pathlib.Path(getattr(main, "__file__", None) or "bench").stem


def results_path(script: str | None = None) -> pathlib.Path:
    out = os.environ.get("BENCH_OUT")
    return pathlib.Path(out) if out else RESULTS / f"{script or _script()}.jsonl"


def _human(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def emit(name: str, *, script: str | None = None, quiet: bool = False, **figures: Any) -> dict:
    """Print `name  key=value ...` and append {"bench", "name", "at", "host", **figures} as one JSON
    line to the results file. Figures must be JSON values (numbers, strings, lists, None)."""
    clash = sorted(set(figures) & {"bench", "at", "host"})
    if clash:
        raise ValueError(f"emit: {', '.join(clash)} is kept for the row's own fields; name the figure otherwise")
    script = script or _script()
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    row = {"bench": script, "name": name, "at": at, "host": platform.node(), **figures}
    line = json.dumps(row, sort_keys=False)  # fails here, before anything is written, on a non-JSON figure
    if not quiet:
        print(f"{name}  " + "  ".join(f"{k}={_human(v)}" for k, v in figures.items()), flush=True)
    path = results_path(script)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")
    return row
