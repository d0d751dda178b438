"""Faults a test injects into a training attempt on purpose (run-only `trainer` knobs; all off by
default): a poisoned stretch of data, a hung step, a kill after some steps, steps dropped as the
guard drops them. The loop calls the hooks at fixed points and knows nothing else of them."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np


class Killed(RuntimeError):
    """Raised by the `trainer.fail_after_steps` test knob."""


@dataclass(frozen=True)
class Faults:
    """`poison_steps` [a, b): random tokens (seeded by the step) in those optimizer steps' batches;
    `hang_at_step`: block forever in that step, on attempt 1 only (a hung collective);
    `fail_after_steps`: raise `Killed` once this attempt has trained that many steps (0: never);
    `drop_steps`: optimizer steps that read no data and make no update, the schedule moving on (what
    the spike guard does to the steps a rewind drops)."""

    poison_steps: tuple[int, int] = (0, 0)
    hang_at_step: int = -1
    fail_after_steps: int = 0
    attempt: int = 1
    vocab_size: int = 0
    drop_steps: frozenset[int] = frozenset()

    @classmethod
    def of(cls, trainer: Any, attempt: int, vocab_size: int) -> "Faults":
        """From a TrainerConfig's knobs."""
        return cls(tuple(trainer.poison_steps), trainer.hang_at_step, trainer.fail_after_steps, attempt, vocab_size,
                   frozenset(int(s) for s in trainer.drop_steps))

    def dropped(self, step: int) -> bool:
        return step in self.drop_steps

    def before_step(self, step: int) -> None:
        if self.hang_at_step == step and self.attempt == 1:
            threading.Event().wait()

    def batch(self, step: int, micro: list[np.ndarray]) -> list[np.ndarray]:
        """The micro-batches of `step`, poisoned when the step is in `poison_steps`."""
        a, b = self.poison_steps
        if not a <= step < b:
            return micro
        import torch

        g = torch.Generator().manual_seed(step)
        return [torch.randint(0, self.vocab_size, r.shape, generator=g).numpy() for r in micro]

    def after_step(self, trained: int, step: int, end: int) -> None:
        """`trained` steps of this attempt are done, the next is `step`."""
        if self.fail_after_steps and trained == self.fail_after_steps and step < end:
            raise Killed(f"trainer.fail_after_steps: stopped on purpose after {trained} steps (at step {step})")
