"""Ray as the engine: the only module of the executor that imports ray.

Each step is one Ray task asking for its declared resources (CPUs, GPUs, memory, and an
accelerator type as a custom resource such as `GB200`). Ray retries a task whose worker or node
died (`max_retries`), never one that raised (`retry_exceptions=False`): user exceptions come back
as a failed `TaskResult` and the runner applies the step's retry policy. Steps with `workers > 1`
run their coordinating task on one CPU; the workers themselves are placed by Ray Train inside the
step, from `ctx.resources`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

import ray

from executor.context import local_map
from executor.step import Resources
from executor.worker import TaskResult, TaskSpec, execute

log = logging.getLogger("marin.ray")


def start(address: str | None = None, num_cpus: int | None = None, pickle_by_value: Sequence[Any] = ()) -> bool:
    """Join `address` (or RAY_ADDRESS), else start an embedded local Ray. True if we started it."""
    from ray import cloudpickle

    for module in pickle_by_value:  # voyage files are loaded from a path: ship their code by value
        cloudpickle.register_pickle_by_value(module)
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = dict(ignore_reinit_error=True, logging_level=logging.WARNING,
                                  log_to_driver=True, configure_logging=False)
    if address:
        ray.init(address=address, **kwargs)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
    return True


def stop() -> None:
    if ray.is_initialized():
        ray.shutdown()


def cluster_nodes() -> list[dict[str, float]]:
    """Total resources of every live node."""
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def ray_map(fn: Callable[[Any], Any], items: Sequence[Any], resources: Resources | None = None) -> list:
    """One Ray task per item, results in order; used by `StepContext.map` inside steps."""
    if not items:
        return []
    res = resources or Resources()
    remote = ray.remote(fn).options(**_task_options(res), max_retries=3)
    return ray.get([remote.remote(item) for item in items])


def _run_step(task: TaskSpec) -> TaskResult:
    node = ray.get_runtime_context().get_node_id()
    mapper = ray_map if ray.is_initialized() else local_map
    return execute(task, mapper=mapper, node=node)


def _task_options(res: Resources) -> dict[str, Any]:
    need = res.per_worker()
    opts: dict[str, Any] = {"num_cpus": need.pop("CPU", 0.0), "num_gpus": need.pop("GPU", 0.0)}
    if "memory" in need:
        opts["memory"] = int(need.pop("memory"))
    if need:
        opts["resources"] = need
    return opts


class RayBackend:
    """Submits step tasks to Ray and waits for them."""

    def __init__(self) -> None:
        self._remote = ray.remote(_run_step)

    def submit(self, task: TaskSpec, attempt: int) -> Any:
        res = task.resources
        # A multi-worker step's own task only coordinates, on no CPU of its own (so that N
        # workers of the cluster's size still fit); Ray Train places the workers.
        opts = _task_options(Resources(cpus=0) if res.workers > 1 else res)
        return self._remote.options(**opts, max_retries=task.max_node_failures, retry_exceptions=False,
                                    name=f"step:{task.name}").remote(task)

    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, TaskResult]]:
        ready, _ = ray.wait(handles, num_returns=1, timeout=timeout)
        if ready:  # take everything that is done, not just the first
            ready, _ = ray.wait(handles, num_returns=len(handles), timeout=0)
        out = []
        for ref in ready:
            try:
                out.append((ref, ray.get(ref)))
            except Exception as e:  # the worker or node died more often than the policy allows
                out.append((ref, TaskResult(name="?", ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0]}")))
        return out


