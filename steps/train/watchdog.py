"""The hang watchdog: a training attempt that stops making progress ends itself.

A rank stuck in a collective holds every GPU of the run until someone notices. The trainer calls
`Watchdog.beat()` after each optimizer step. A daemon thread checks that the last beat is younger
than the bound; when it is not, it

1. writes every thread's Python stack (faulthandler) to `logs/hang-attempt{A}-rank{R}.txt` in the
   step's output (a declared log of the training steps), and says so in the step's log;
2. raises `Hang` in the training thread (a signal to the main thread, so that a Python wait, a
   sleep or a lock is interrupted); the attempt fails with class `hang` and the executor's retry
   policy resumes it from the last checkpoint;
3. if the training thread is stuck in C (a collective that never returns) and has not unwound
   `grace_s` later, ends the process with exit code 75: the executor sees the worker die and
   retries, as for a lost node; the stacks are already on disk.

The bound: `timeout_s` when set; else `factor` x the larger of `expected_step_s` (the plan's
step time at full scale, set by the voyage) and the median of this attempt's own step times,
and never under `min_s`. The first step of an attempt (lazy start-up, compilation) gets at least
`first_step_s`. Checkpoint saves pause the clock (`paused()`).

Each beat, pause and the end are also published (executor.heartbeat) to the executor, which
watches them from outside the process: a worker the kernel stopped, whose watchdog cannot fire,
is dumped and killed there once `bound() + grace_s` (plus a slack) passes without a beat.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterator

import fsspec

from executor import Hang, VoyageError
from executor import heartbeat

EXIT_HANG = 75
log = logging.getLogger("marin.watchdog")


@dataclass(frozen=True)
class WatchdogConfig:
    """The hang watchdog's bound (run-only). `timeout_s` 0: derived (see the module's text);
    `enabled` False: no watchdog."""

    enabled: bool = True
    timeout_s: float = 0.0
    expected_step_s: float = 0.0  # the plan's step time at full scale (voyages set it)
    factor: float = 10.0
    min_s: float = 300.0
    first_step_s: float = 1800.0
    grace_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "expected_step_s", "min_s", "first_step_s", "grace_s"):
            if getattr(self, name) < 0:
                raise VoyageError(f"trainer.watchdog.{name} must be >= 0, got {getattr(self, name)}")
        if self.factor < 1:
            raise VoyageError(f"trainer.watchdog.factor must be >= 1, got {self.factor}")


class Watchdog:
    """Watches the beats of one training attempt on one rank; a context manager."""

    def __init__(self, cfg: WatchdogConfig, log_url: str, describe: str = "") -> None:
        self.cfg, self.log_url, self.describe = cfg, log_url, describe
        self.times: deque = deque(maxlen=50)
        self.last = time.monotonic()
        self.beats = 0
        self.fired: float | None = None  # monotonic time it fired
        self._pause = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._target = threading.get_ident()  # the training thread (set again on entry)
        self._old_handler = None

    def bound(self) -> float:
        """Seconds the next step may take."""
        cfg = self.cfg
        if self.beats == 0:  # start-up work (lazy init, compilation) is not a hang
            return max(cfg.timeout_s, cfg.first_step_s)
        if cfg.timeout_s:
            return cfg.timeout_s
        typical = max(cfg.expected_step_s, statistics.median(self.times) if self.times else 0.0)
        return max(cfg.min_s, cfg.factor * typical)

    def beat(self) -> None:
        """An optimizer step finished."""
        now = time.monotonic()
        if self.beats:
            self.times.append(now - self.last)
        self.last, self.beats = now, self.beats + 1
        self._publish()

    def _publish(self, stopped: bool = False) -> None:
        if self.cfg.enabled:
            heartbeat.publish(self.beats, self.bound(), grace=self.cfg.grace_s, paused=self._pause > 0,
                              stopped=stopped)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No bound while inside (a checkpoint save has its own pace); the clock restarts after."""
        self._pause += 1
        self._publish()
        try:
            yield
        finally:
            self._pause -= 1
            self.last = time.monotonic()
            self._publish()

    def __enter__(self) -> "Watchdog":
        if not self.cfg.enabled:
            return self
        self._target = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGUSR2, self._raise_hang)
        self.last = time.monotonic()
        self._publish()
        self._thread = threading.Thread(target=self._watch, name="marin-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._publish(stopped=True)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR2, self._old_handler)

    def _raise_hang(self, signum: int, frame: object) -> None:
        raise Hang(f"no optimizer step finished within {self.bound():.0f}s (after {self.beats} steps of this "
                   f"attempt{self.describe}); stacks in {self.log_url}")

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, max(0.05, self.bound() / 20))):
            if self._pause or time.monotonic() - self.last <= self.bound():
                continue
            self.fired = time.monotonic()
            self._dump()
            if self._old_handler is not None:  # the main thread: a signal interrupts a wait or a sleep
                signal.pthread_kill(self._target, signal.SIGUSR2)
            else:  # another thread (a Ray Train worker's): raised when it next runs Python code
                import ctypes

                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._target), ctypes.py_object(Hang))
            if self._stop.wait(self.cfg.grace_s):
                return  # it unwound
            log.error("watchdog: the training thread did not unwind within %.0fs; ending the process (exit %d)",
                      self.cfg.grace_s, EXIT_HANG)
            logging.shutdown()
            os._exit(EXIT_HANG)

    def _dump(self) -> None:
        """Every thread's stack to the log file (through a local temporary file: faulthandler
        writes to a file descriptor, the log may be on any store)."""
        import tempfile

        with tempfile.TemporaryFile("w+") as tmp:
            tmp.write(f"hang: no optimizer step within {self.bound():.1f}s; {self.beats} steps done{self.describe}\n")
            tmp.flush()
            faulthandler.dump_traceback(file=tmp, all_threads=True)
            tmp.seek(0)
            text = tmp.read()
        try:
            with fsspec.open(self.log_url, "w") as f:
                f.write(text)
        except Exception as e:  # the stacks go to stderr at least
            log.error("watchdog: could not write %s (%s); stacks follow\n%s", self.log_url, e, text)
            return
        log.error("watchdog: no optimizer step within %.1fs; every thread's stack written to %s",
                  self.bound(), self.log_url)
