"""An attempt's heartbeat, seen from outside its process: the watchdog a frozen worker cannot stop.

A training attempt's in-process watchdog (steps/train/watchdog.py) ends an attempt whose
optimizer steps stop, but it lives in the process it watches: a worker stopped by the kernel
(SIGSTOP, a D-state read of a dead NFS server, a wedged driver) stops its watchdog with it, and
the executor's own lease thread, in the driver, renews the lease all the same.

So the watchdog also publishes what it knows: after each optimizer step, `publish(count, bound)`
(the number of steps this attempt has made and the bound the in-process watchdog applies to the
next one; `paused` while a checkpoint is saved; `stopped` when training ended). The worker sends
these beats (at most one a second; the first step, each change of pause and the end at once) to the executor through the
sink it set around the step function (`sending_to`); under Ray it is a small actor beside the
run (executor.ray_backend), stamping each beat with its own clock on arrival.

The runner looks at the beats of its running attempts about once a second. An attempt whose last
beat is older than `outside_bound(beat)` (the in-process bound plus its grace to unwind, plus
`SLACK_S`, so that the in-process watchdog, which can dump Python stacks, always fires first) is
hung as far as anyone can tell: the executor dumps what it can from outside (py-spy if installed,
else the worker's /proc state), kills the worker through Ray, and classes the attempt `hang`.
While a checkpoint is saved (the in-process clock is paused) the step bound counts
`PAUSED_FACTOR` times: a save has its own pace, and a worker frozen in one is still found. An attempt that never beats (a step that is not a trainer) is not watched.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

SEND_EVERY_S = 1.0  # at most one beat a second leaves the worker (a pause or a stop at once)
SLACK_S = 5.0  # beyond the in-process bound and its grace: the in-process watchdog fires first
PAUSED_FACTOR = 10.0  # a checkpoint save's own pace: ten step bounds

Sink = Callable[[dict[str, Any]], None]

_lock = threading.Lock()
_sink: Sink | None = None
_identity: dict[str, Any] = {}
_last_sent = 0.0
_last_paused: bool | None = None
_last_count = 0


@dataclass
class Beat:
    """The newest beat of one attempt, as the executor sees it."""

    count: int  # optimizer steps this attempt has made
    bound: float  # seconds the in-process watchdog allows the next one
    grace: float = 0.0  # seconds it allows the training thread to unwind after it fires
    paused: bool = False  # a checkpoint save (no step bound)
    stopped: bool = False  # training ended: no longer watched
    age: float = 0.0  # seconds since it arrived
    info: dict[str, Any] = field(default_factory=dict)  # pid, node, output, attempt, name

    @classmethod
    def from_dict(cls, data: dict[str, Any], age: float) -> "Beat":
        return cls(count=int(data.get("count", 0)), bound=float(data.get("bound", 0.0)),
                   grace=float(data.get("grace", 0.0)), paused=bool(data.get("paused")),
                   stopped=bool(data.get("stopped")), age=age,
                   info={k: data[k] for k in ("pid", "node", "output", "attempt", "name") if k in data})


def outside_bound(beat: Beat) -> float:
    """Seconds without a beat after which the attempt is hung, seen from outside."""
    return (PAUSED_FACTOR if beat.paused else 1.0) * beat.bound + beat.grace + SLACK_S


def overdue(beat: Beat) -> bool:
    return not beat.stopped and beat.bound > 0 and beat.age > outside_bound(beat)


def publish(count: int, bound: float, *, grace: float = 0.0, paused: bool = False, stopped: bool = False) -> None:
    """The trainer's watchdog says where it stands; sent on if the executor listens (never raises)."""
    global _last_sent, _last_paused, _last_count
    if _sink is None:
        return
    now = time.monotonic()
    with _lock:
        sink = _sink
        if sink is None:
            return
        # a pause, a stop, and the first step (the start-up's long bound ends) go at once
        urgent = stopped or paused != _last_paused or (count > 0 and _last_count == 0)
        if not urgent and now - _last_sent < SEND_EVERY_S:
            return
        _last_sent, _last_paused, _last_count = now, paused, count
        beat = {**_identity, "count": count, "bound": bound, "grace": grace, "paused": paused, "stopped": stopped}
    try:
        sink(beat)
    except Exception:  # noqa: BLE001 - a heartbeat must never fail the step
        pass


@contextlib.contextmanager
def sending_to(sink: Sink | None, **identity: Any) -> Iterator[None]:
    """Around a step function: its watchdog's beats go to `sink`, with `identity` (the attempt's
    output folder, number, node) and this process's pid added."""
    global _sink, _identity, _last_sent, _last_paused, _last_count
    with _lock:
        _sink, _identity = sink, {**identity, "pid": os.getpid()}
        _last_sent, _last_paused, _last_count = 0.0, None, 0
    try:
        yield
    finally:
        with _lock:
            _sink, _identity = None, {}


def outside_dump(pid: int, timeout: float = 20.0) -> str:
    """What can be learnt of a process from outside it, on its own machine: py-spy's dump of its
    Python stacks if py-spy is installed (`--nonblocking`: it reads a stopped process too), and its
    /proc state (status, wchan: where the kernel holds it, stack, syscall; what the permissions
    allow)."""
    import shutil
    import subprocess
    import sys

    parts: list[str] = []
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(spy):
        try:
            done = subprocess.run([spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                                  text=True, timeout=timeout)
            parts.append(f"$ py-spy dump --pid {pid} --nonblocking (exit {done.returncode})\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.SubprocessError) as e:
            parts.append(f"$ py-spy dump --pid {pid}: {type(e).__name__}: {e}")
    else:
        parts.append("py-spy is not installed: /proc only")
    for name in ("status", "wchan", "stack", "syscall"):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                parts.append(f"/proc/{pid}/{name}:\n{f.read().rstrip()}")
        except OSError as e:
            parts.append(f"/proc/{pid}/{name}: {e.strerror or e}")
    return "\n\n".join(parts) + "\n"
