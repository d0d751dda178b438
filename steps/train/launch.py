"""Where the training loop runs: in this process (one worker), on N Ray Train workers, or on N
local processes.

One worker runs inside the step's own process (its Ray task under `marin-run`): no worker group
to start, no process group. N > 1 workers run as a Ray Train `TorchTrainer` (gloo on the CPU,
NCCL on GPUs) with `ScalingConfig(num_workers=N)`, each worker asking for the step's per-worker
resources; the step's own task only coordinates. When the cluster's nodes carry rack labels,
the workers are asked for rack by rack in whole expert-parallel groups (per-worker label
selectors, steps/train/topology.py). Ray Train retries nothing (`max_failures=0`): the
executor's retry policy decides, and a retried step resumes from its checkpoints.

Without Ray (a step function called directly, as tests and benchmarks do), N > 1 workers run as
N processes of this machine (`torch.multiprocessing`, spawned; gloo on the CPU, NCCL with one GPU
each), and a worker's exception is raised here.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import traceback
from typing import Any, Callable

from steps.train.loop import Job, run

# Ray Train settings (passed on to its controller) unless already set: poll the workers every
# 0.25 s rather than 2 s (a run's end is noticed that much sooner), and start no preemption
# watcher or metrics callbacks (the executor retries; we track ourselves). On 2 cores
# (docs/benchmarks.md) the first batch came 14 s after the step started instead of 23 s, and
# fit() returned 0.5 s after the training function instead of 4 s.
RAY_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                 "RAY_TRAIN_METRICS_ENABLED": "0"}


def _trainer_class() -> type:
    """TorchTrainer whose placement-group cleaner is told to stop within 1 s. Ray Train (2.60)
    starts a detached cleaner actor that removes the run's placement group if the controller
    dies; on a normal end the controller waits for it to stop with a 12 s timeout, which its
    monitor thread (blocked in a 10 s state-API call) always runs out: every fit() ended 12 s
    late with a GetTimeoutError logged. With 1 s the cleaner still watches, finds the group
    removed when the controller is gone, and exits (bench/ray_train_fit.py: 23.1 s -> 11.3 s)."""
    from ray.train.torch import TorchTrainer

    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:  # another Ray: its own defaults
        return TorchTrainer

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self):  # noqa: ANN202  (Ray Train's private hook)
            return [PlacementGroupCleanerCallback(stop_timeout=1.0) if isinstance(c, PlacementGroupCleanerCallback)
                    else c for c in super()._create_default_callbacks()]

    return Trainer if hasattr(TorchTrainer, "_create_default_callbacks") else TorchTrainer


def in_process(job: Job, entry: Callable[[Any], Any] = run) -> dict[str, Any]:
    return entry(job)


def _worker(config: dict[str, Any]) -> None:
    # Results travel through the output folder (checkpoint meta.json, metrics.jsonl,
    # results.json), not ray.train.report: in Ray Train 2 report is a collective tied to its own
    # checkpoints.
    config["entry"](config["job"])


def ray_train(job: Job, entry: Callable[[Any], Any] = run) -> dict[str, Any]:
    """Run `entry(job)` (the training loop) on `job.workers` Ray Train workers; raises what a
    worker raised. `job` is a training Job or any job with `ctx`, `workers` and `parallel`."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    import ray

    from steps.train.topology import rack_capacity, rack_selectors

    res = job.ctx.resources
    use_gpu = res.gpus > 0
    per_worker: dict[str, float] = {"CPU": res.cpus}
    if use_gpu:
        per_worker["GPU"] = res.gpus
    if res.accelerator:
        per_worker[res.accelerator] = float(res.gpus or 1)
    pc = job.parallel.resolve(job.workers)
    selectors = rack_selectors(job.workers, pc.ep, rack_capacity(ray.nodes(), per_worker))
    storage = tempfile.mkdtemp(prefix="marin-raytrain-")  # Ray Train's own run state; we checkpoint ourselves
    saved = {k: os.environ.get(k) for k in RAY_TRAIN_ENV}
    os.environ.update({k: v for k, v in RAY_TRAIN_ENV.items() if saved[k] is None})
    try:
        trainer = _trainer_class()(
            _worker, train_loop_config={"job": job, "entry": entry},
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            scaling_config=ScalingConfig(num_workers=job.workers, use_gpu=use_gpu, resources_per_worker=per_worker,
                                         label_selector=selectors),
            run_config=RunConfig(name=f"{job.ctx.name.replace('/', '-')}-{job.ctx.digest[:10]}", storage_path=storage,
                                 failure_config=FailureConfig(max_failures=0)))
        trainer.fit()
        return {}
    except Exception as e:  # Ray wraps the worker's error; raise the worker's own
        _raise_if_hung(job, e)
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


def _rendezvous(rank: int, workers: int, ports: Any) -> Any:
    """The group's TCPStore. Rank 0 listens on a port the OS gives it (port 0) and tells the others
    through `ports`: a port picked by the parent and bound later by rank 0 could be taken by another
    process in between (seen on CI as EADDRINUSE while the machine ran other suites)."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=int(os.environ.get("MARIN_RENDEZVOUS_TIMEOUT", "300")))
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, workers, True, timeout=timeout, wait_for_workers=False)
        for _ in range(workers - 1):
            ports.put(store.port)
        return store
    # rank 0 dead before it listened: the parent sees its exit code and stops this process
    return dist.TCPStore("127.0.0.1", ports.get(), workers, False, timeout=timeout)


def _spawned(rank: int, workers: int, ports: Any, cuda: bool, target: Callable[..., Any], args: tuple,
             errors: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(workers))
    if cuda:
        from steps.train.parallel import expandable_segments

        expandable_segments()  # before CUDA starts in this worker
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", store=_rendezvous(rank, workers, ports), rank=rank,
                            world_size=workers)
    try:
        target(*args)
    except BaseException as e:  # noqa: BLE001 (sent to the parent, which raises it)
        try:
            errors.put((rank, e, traceback.format_exc()))
        except Exception:  # noqa: BLE001 (an exception that does not pickle)
            errors.put((rank, RuntimeError(f"{type(e).__name__}: {e}"), traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(target: Callable[..., Any], args: tuple, workers: int, cuda: bool = False) -> None:
    """Run `target(*args)` in `workers` new processes of this machine, each in a process group
    of them all (gloo; NCCL with one GPU each when `cuda`); raises the first worker exception.
    When one worker fails the others are stopped (they would wait in a collective)."""
    from multiprocessing.connection import wait

    import torch.multiprocessing as mp

    # A fork server that has imported torch and the trainer once starts each worker in a fraction
    # of a fresh interpreter's import time; it forks from a clean single-threaded process, not
    # from this one (which may run Ray's threads).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed.fsdp",
                                "torch.distributed.checkpoint.state_dict", "steps.train.loop",
                                "steps.moe.expert_parallel"])
    errors, ports = ctx.SimpleQueue(), ctx.SimpleQueue()
    procs = [ctx.Process(target=_spawned, args=(rank, workers, ports, cuda, target, args, errors), daemon=True)
             for rank in range(workers)]
    for p in procs:
        p.start()
    try:
        running = list(procs)
        while running:
            wait([p.sentinel for p in running])
            running = [p for p in running if p.is_alive()]
            if any(p.exitcode for p in procs if not p.is_alive()):
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    if not errors.empty():
        rank, error, trace = errors.get()
        raise error from RuntimeError(f"worker {rank} of {workers}:\n{trace}")
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise RuntimeError(f"a spawned worker exited with code {bad[0]}")


def local_processes(job: Job, entry: Callable[[Any], Any] = run) -> dict[str, Any]:
    """Run `entry(job)` on `job.workers` spawned processes of this machine."""
    import torch

    try:
        spawn(entry, (job,), job.workers, cuda=job.ctx.resources.gpus > 0 and torch.cuda.is_available())
    except Exception as e:
        _raise_if_hung(job, e)
        raise
    return {}


def _raise_if_hung(job: Job, error: BaseException) -> None:
    """A worker the watchdog ended (steps/train/watchdog.py) may have died with it (exit 75, stuck
    in C): its stacks are in the step's logs. The step then fails as a hang, whatever Ray says."""
    import fsspec

    from executor import Hang

    pattern = job.ctx.path(f"logs/hang-attempt{job.ctx.attempt}-rank*.txt")
    fs, path = fsspec.core.url_to_fs(pattern)
    try:
        found = sorted(fs.glob(path))
    except Exception:  # noqa: BLE001 - the original error is the one to raise then
        return
    if found:
        raise Hang(f"the watchdog ended {len(found)} worker(s) of {job.ctx.name} (stacks in "
                   f"{', '.join(posixpath.basename(f) for f in found)}): {type(error).__name__}: {error}") from error


def launch(job: Job, entry: Callable[[Any], Any] = run) -> dict[str, Any]:
    """Run `entry(job)` (default: the training loop) on Ray Train when more than one worker is
    asked for and Ray is running; on local processes when Ray is not; else in-process."""
    if job.workers > 1:
        import ray

        if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
            return ray_train(job, entry)
        return local_processes(job, entry)
    return in_process(job, entry)
