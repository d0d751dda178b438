"""Where training metrics go: `metrics.jsonl` in the step's output (always), W&B (or nothing), and
the estimate of model FLOPs behind MFU.

metrics.jsonl: one JSON object per logged step, with at least the keys of `METRIC_KEYS`. On
resume it is cut back to the rows of steps the checkpoint covers, so a resumed run's file reads
like an uninterrupted one's. It is rewritten whole (small; atomic by rename) at most every
`flush_every` seconds, at checkpoints and at the end.

W&B: the run id is derived from the step's digest, so every attempt of one step (a resume
included) continues the same W&B run (`resume="allow"`). Offline unless WANDB_API_KEY is set or
the config says otherwise; its files go under the step's output when that is a local folder,
else under a temporary folder that is copied into the output at the end. The run is grouped by the
voyage (StepContext.voyage), named by the step, and its config carries the step's name, the
record's digest (its identity) and the attempt under `marin`. Rank 0 writes `wandb_run.json` (id,
name, group, project, mode, and the run's URL when online) into the output; the step puts the URL
in its results' `links`, where the voyage's logbook page finds it (docs/logbook.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import contextlib
import time
from typing import Any, Callable, Protocol

import fsspec

from executor import LeaseLost, is_local
from steps.data.formats import write_bytes
from steps.moe.config import flops_per_token  # noqa: F401  (one formula for MFU and the voyage's budget)
from steps.train.config import TrackerConfig

METRICS_FILE = "metrics.jsonl"
WANDB_RUN_FILE = "wandb_run.json"
METRIC_KEYS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "expert_load_max", "expert_load_min",
               "bias_norm", "tokens")


class MetricsLog:
    """The rows of metrics.jsonl, kept in memory and rewritten whole. Each rewrite goes through
    `fence` (StepContext.fenced): an attempt superseded by a takeover stops rewriting the file its
    successor now writes (and stops at its next checkpoint, where every rank agrees on it)."""

    def __init__(self, url: str, keep_through_step: int, flush_every: float = 5.0,
                 fence: Callable[[str], Any] = lambda what: contextlib.nullcontext()) -> None:
        self.url, self.flush_every, self.fence = url, flush_every, fence
        self.lost: LeaseLost | None = None
        self.rows: list[str] = []
        try:
            with fsspec.open(url, "r") as f:
                for line in f:
                    try:
                        if json.loads(line).get("step", 0) <= keep_through_step:
                            self.rows.append(line.rstrip("\n"))
                    except ValueError:
                        continue
        except FileNotFoundError:
            pass
        self._last = 0.0
        self.flush(force=True)

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(json.dumps(row, sort_keys=False))
        self.flush()

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.lost is None and (force or now - self._last >= self.flush_every):
            try:
                with self.fence("rewriting metrics.jsonl"):
                    write_bytes(self.url, "".join(r + "\n" for r in self.rows).encode())
            except LeaseLost as e:  # rank 0 alone: raising here would leave the others in a collective
                self.lost = e
            self._last = now


class Tracker(Protocol):
    def log(self, row: dict[str, Any], step: int) -> None: ...

    def finish(self) -> None: ...


class NullTracker:
    """Tracks nothing (W&B off, and every rank but 0)."""

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


def run_id(digest: str) -> str:
    """The W&B run id of a step: the same for every attempt of it."""
    return f"marin-{digest[:24]}"


class WandbTracker:
    """One W&B run per step, resumed by id."""

    def __init__(self, cfg: TrackerConfig, name: str, digest: str, output: str, config: dict[str, Any],
                 group: str = "", attempt: int = 1) -> None:
        import wandb

        mode = cfg.mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if os.environ.get("WANDB_MODE") and cfg.mode is None:
            mode = os.environ["WANDB_MODE"]
        fs, path = fsspec.core.url_to_fs(output)
        self._local = is_local(fs)
        self.dir = path if self._local else tempfile.mkdtemp(prefix="marin-wandb-")
        self.output = output
        os.makedirs(self.dir, exist_ok=True)
        config = {**config, "marin": {"step": name, "digest": digest, "voyage": group or None, "attempt": attempt}}
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, name=name, group=group or None, id=run_id(digest),
            resume="allow", mode=mode, dir=self.dir, config=config, tags=list(cfg.tags),
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True))
        self.mode = mode
        url = getattr(self.run, "url", None) if mode == "online" else None
        about = {"id": run_id(digest), "name": name, "group": group or None, "project": cfg.project,
                 "entity": cfg.entity, "mode": mode, "digest": digest, "url": url or None}
        write_bytes(f"{output.rstrip('/')}/{WANDB_RUN_FILE}", json.dumps(about, indent=1).encode())

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def finish(self) -> None:
        self.run.finish()
        if not self._local:  # keep the offline files with the output, then drop the temp folder
            fs, path = fsspec.core.url_to_fs(self.output)
            fs.put(os.path.join(self.dir, "wandb"), f"{path}/wandb", recursive=True)
            shutil.rmtree(self.dir, ignore_errors=True)


def build_tracker(cfg: TrackerConfig, is_main: bool, name: str, digest: str, output: str,
                  config: dict[str, Any], group: str = "", attempt: int = 1) -> Tracker:
    if not is_main or cfg.kind == "none" or cfg.mode == "disabled":
        return NullTracker()
    return WandbTracker(cfg, name, digest, output, config, group=group, attempt=attempt)


def run_links(output: str) -> dict[str, Any]:
    """What a step's results say of its W&B run (`wandb` and, when it is online, `links`), from the
    `wandb_run.json` rank 0 wrote; {} when W&B was off."""
    try:
        with fsspec.open(f"{output.rstrip('/')}/{WANDB_RUN_FILE}", "r") as f:
            about = json.load(f)
    except (FileNotFoundError, ValueError):
        return {}
    out: dict[str, Any] = {"wandb": {k: about.get(k) for k in ("id", "name", "group", "project", "mode")}}
    url = about.get("url")
    if isinstance(url, str) and url.startswith("https://"):
        out["links"] = {"W&B run": url}
    return out


# -- FLOPs and MFU -------------------------------------------------------------------------------

# Dense bf16 peak FLOP/s per GPU, by a substring of torch.cuda.get_device_name().
GPU_PEAK_BF16 = (("GB200", 2.5e15), ("B200", 2.25e15), ("H200", 989.4e12), ("H100", 989.4e12),
                 ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12))
CPU_FLOPS_PER_CORE = 32 * 3.0e9  # nominal: two AVX2 FMA units of 8 fp32 lanes at 3 GHz


def peak_flops(device: str, threads: int) -> float:
    """Nominal peak FLOP/s of one worker: the GPU's dense bf16 figure, or the CPU threads' fp32."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name()
        for key, flops in GPU_PEAK_BF16:
            if key in name:
                return flops
        return 989.4e12
    return CPU_FLOPS_PER_CORE * max(threads, 1)


# -- the reference curve -------------------------------------------------------------------------

REFERENCE_FILE = "reference_curve.json"  # read by the live page (executor/views/viz/metrics.py)


def read_reference(url: str) -> list[list[float]]:
    """`[[tokens, loss], ...]` from a CSV with `tokens` and `loss` columns, a JSON file
    (`[[tokens, loss], ...]` or `{"tokens": [...], "loss": [...]}`), or a training step's output
    folder (its metrics.jsonl). Raises VoyageError naming the URL when none of these is there."""
    import csv
    import io

    from executor import VoyageError

    base = url.rstrip("/")
    candidates = [base] if base.endswith((".csv", ".json", ".jsonl")) else [f"{base}/{METRICS_FILE}"]
    for candidate in candidates:
        try:
            with fsspec.open(candidate, "r") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        points: list[list[float]] = []
        if candidate.endswith(".csv"):  # lines starting with '#' are comments (where the curve came from)
            body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
            for row in csv.DictReader(io.StringIO(body)):
                if row.get("tokens") not in (None, "") and row.get("loss") not in (None, ""):
                    points.append([float(row["tokens"]), float(row["loss"])])
        elif candidate.endswith(".jsonl"):
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and "tokens" in row and "loss" in row:
                    points.append([float(row["tokens"]), float(row["loss"])])
        else:
            value = json.loads(text)
            if isinstance(value, dict):
                value = list(zip(value.get("tokens") or [], value.get("loss") or []))
            points = [[float(t), float(v)] for t, v in value]
        if points:
            return points
        raise VoyageError(f"trainer.reference_curve: {candidate} holds no (tokens, loss) points")
    raise VoyageError(f"trainer.reference_curve: nothing at {url} (a CSV or JSON of tokens and loss, or a "
                      f"training step's output)")


def write_reference(url: str, output: str) -> None:
    """Copy a reference curve next to this step's metrics, where the live page finds it. A
    relative `url` is taken from the prefix (the folder above this step's output)."""
    if not url:
        return
    if "://" not in url and not url.startswith("/"):
        url = f"{output.rstrip('/').rsplit('/', 1)[0]}/{url}"
    points = read_reference(url)
    write_bytes(f"{output.rstrip('/')}/{REFERENCE_FILE}", json.dumps(points, separators=(",", ":")).encode())
