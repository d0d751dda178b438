"""Where the training loop runs: in this process (one worker), or on N Ray Train workers.

One worker runs inside the step's own process (its Ray task under `marin-run`): no worker group
to start, no process group. N > 1 workers run as a Ray Train `TorchTrainer` (gloo on the CPU,
NCCL on GPUs) with `ScalingConfig(num_workers=N)`, each worker asking for the step's per-worker
resources; the step's own task only coordinates. Ray Train retries nothing
(`max_failures=0`): the executor's retry policy decides, and a retried step resumes from its
checkpoints.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from steps.train.loop import Job, run

# Ray Train settings (passed on to its controller) unless already set: poll the workers every
# 0.25 s rather than 2 s (a run's end is noticed that much sooner), and start no preemption
# watcher or metrics callbacks (the executor retries; we track ourselves). On 2 cores
# (docs/benchmarks.md) the first batch came 14 s after the step started instead of 23 s, and
# fit() returned 0.5 s after the training function instead of 4 s.
RAY_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                 "RAY_TRAIN_METRICS_ENABLED": "0"}


def in_process(job: Job) -> dict[str, Any]:
    return run(job)


def _worker(config: dict[str, Any]) -> None:
    # Results travel through the output folder (checkpoint meta.json, metrics.jsonl), not
    # ray.train.report: in Ray Train 2 report is a collective tied to its own checkpoints.
    run(config["job"])


def ray_train(job: Job) -> dict[str, Any]:
    """Run the loop on `job.workers` Ray Train workers; raises what a worker raised."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    res = job.ctx.resources
    use_gpu = res.gpus > 0
    per_worker: dict[str, float] = {"CPU": res.cpus}
    if use_gpu:
        per_worker["GPU"] = res.gpus
    if res.accelerator:
        per_worker[res.accelerator] = float(res.gpus or 1)
    storage = tempfile.mkdtemp(prefix="marin-raytrain-")  # Ray Train's own run state; we checkpoint ourselves
    saved = {k: os.environ.get(k) for k in RAY_TRAIN_ENV}
    os.environ.update({k: v for k, v in RAY_TRAIN_ENV.items() if saved[k] is None})
    try:
        trainer = TorchTrainer(
            _worker, train_loop_config={"job": job},
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            scaling_config=ScalingConfig(num_workers=job.workers, use_gpu=use_gpu, resources_per_worker=per_worker),
            run_config=RunConfig(name=f"{job.ctx.name.replace('/', '-')}-{job.ctx.digest[:10]}", storage_path=storage,
                                 failure_config=FailureConfig(max_failures=0)))
        trainer.fit()
        return {}
    except Exception as e:  # Ray wraps the worker's error; raise the worker's own
        raise _unwrap(e) from None
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def _unwrap(e: BaseException) -> BaseException:
    """The first worker exception inside Ray Train's TrainingFailedError, if there is one."""
    for attr in ("worker_failures", "training_failed_error"):
        inner = getattr(e, attr, None)
        if isinstance(inner, dict) and inner:
            return next(iter(inner.values()))
        if isinstance(inner, BaseException):
            return _unwrap(inner)
    cause = getattr(e, "cause", None) or e.__cause__
    return cause if isinstance(cause, BaseException) and cause is not e else e


def launch(job: Job) -> dict[str, Any]:
    """Ray Train when more than one worker is asked for and Ray is running; else in-process."""
    if job.workers > 1:
        import ray

        if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
            return ray_train(job)
        job.ctx.logger.warning("%s: %d workers asked for but Ray is not running: training in-process "
                               "on one worker", job.ctx.name, job.workers)
        job.workers = 1
    return in_process(job)
