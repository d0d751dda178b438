"""The metrics rows of one training attempt: when they are due, the sums they are made of, the
rate clock, and where they go (metrics.jsonl and the tracker on rank 0: steps/train/tracking.py).

A row is due after every `log_every`-th optimizer step and after the phase's last; it covers the
micro-batches since the previous row. A rewind starts the sums and the rate clock again (the
tokens count falls back to the checkpoint's: a rate across it would be negative)."""

from __future__ import annotations

import time
from typing import Any

import torch

from executor import StepContext
from steps.train.tracking import METRICS_FILE, MetricsLog, build_tracker


class Reporter:
    """Every rank builds one (rows are collectives); rank 0 writes them."""

    def __init__(self, ctx: StepContext, tcfg: Any, *, main: bool, step: int, final_step: int, tokens: int,
                 device: torch.device, run_config: dict[str, Any]) -> None:
        self.ctx, self.main, self.every, self.final_step = ctx, main, tcfg.log_every, final_step
        self.log = MetricsLog(ctx.path(METRICS_FILE), keep_through_step=step, fence=ctx.fenced) if main else None
        self.tracker = build_tracker(tcfg.tracker, main, ctx.name, ctx.digest, ctx.output, run_config,
                                     group=ctx.voyage, attempt=ctx.attempt)
        self.sums = torch.zeros(3, device=device)  # ce, router loss, micro-batches since the last row
        self.row: dict[str, Any] = {}  # the last row written
        self.restart(tokens)

    def due(self, step: int) -> bool:
        """Whether optimizer step `step` (0-based) ends with a row."""
        return (step + 1) % self.every == 0 or step + 1 == self.final_step

    def restart(self, tokens: int) -> None:
        """The sums and the rate clock start again (at a rewind, and at the start)."""
        self.sums.zero_()
        self.tick, self.tick_tokens = time.perf_counter(), tokens

    def rate(self, tokens: int) -> float:
        """Tokens per second since the previous row."""
        return (tokens - self.tick_tokens) / max(time.perf_counter() - self.tick, 1e-9)

    def write(self, row: dict[str, Any], progress_line: str) -> None:
        """A row made (on every rank): the sums start again; rank 0 writes and logs it."""
        self.row = row
        self.restart(row["tokens"])
        if self.main:
            self.log.append(row)
            self.tracker.log(row, row["step"])
            self.ctx.logger.info("%s  loss %.4f  lr %.2e  gnorm %.3f  %.0f tok/s  mfu %.2f%%", progress_line,
                                 row["loss"], row["lr"], row["grad_norm"], row["tokens_per_s"], 100 * row["mfu"])

    def flush(self) -> None:
        if self.main:
            self.log.flush(force=True)

    def close(self) -> None:
        self.flush()
        self.tracker.finish()
