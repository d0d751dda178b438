"""Ray as the engine: the only module of the executor that imports ray.

Each step is one Ray task asking for its declared resources (CPUs, GPUs, memory, and an
accelerator type as a custom resource such as `GB200`). Ray retries a task whose worker or node
died (`max_retries`), never one that raised (`retry_exceptions=False`): user exceptions come back
as a failed `TaskResult` and the runner applies the step's retry policy. Steps with `workers > 1`
run their coordinating task on one CPU; the workers themselves are placed by Ray Train inside the
step, from `ctx.resources`.

Joining: with no address (neither `--ray-address` nor RAY_ADDRESS) we start our own local Ray,
never the cluster a `ray start` on this machine left its address file for (it may be long dead,
and `ray.init()` would wait for it forever). With an address, the cluster's GCS is asked once,
with a timeout, before `ray.init`: a cluster that does not answer, or wants a token we do not
send, is one line (`ClusterError`, exit 2) within seconds instead of Ray's 20 s of retries and a
traceback.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Callable, Sequence

import ray

from executor.context import local_map
from executor.errors import VoyageError
from executor.heartbeat import Beat, outside_dump
from executor.step import Resources
from executor.worker import TaskResult, TaskSpec, execute

log = logging.getLogger("marin.ray")


class ClusterError(VoyageError):
    """The Ray cluster to join cannot be joined; one line saying why and what fixes it. Exit 2."""


JOIN_TIMEOUT = 10.0  # seconds a cluster's GCS may take to answer


def start(address: str | None = None, num_cpus: int | None = None, pickle_by_value: Sequence[Any] = ()) -> bool:
    """Join `address` (or RAY_ADDRESS), else start our own local Ray. True if we started it."""
    from ray import cloudpickle

    for module in pickle_by_value:  # voyage files are loaded from a path: ship their code by value
        cloudpickle.register_pickle_by_value(module)
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = dict(ignore_reinit_error=True, logging_level=logging.WARNING,
                                  log_to_driver=True, configure_logging=False)
    if address and address != "local":
        target = check_cluster(address)
        try:
            ray.init(address=target, **kwargs)
        except Exception as e:  # answered the probe, then failed to join (a version mismatch, ...)
            raise ClusterError(f"joining the Ray cluster at {target} failed: {_first_line(e)}") from None
        return False
    # "local": a new Ray of our own, whatever address file an earlier `ray start` left behind.
    for left in range(START_TRIES - 1, -1, -1):
        before = _children()
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
            return True
        except Exception as e:  # no room in /tmp, no free port, a broken install: a setting, not a step
            if left and "timed out during startup" in str(e):
                # Ray gives its raylet a fixed 30 s to register: a busy machine (two cores running
                # several Rays) can miss it. Stop what the failed start left, and start again.
                ray.shutdown()
                for child in _children() - before:
                    _kill(child)
                log.warning("the local Ray did not start within Ray's 30 s; starting it again (%d more)", left)
                continue
            raise ClusterError(f"starting a local Ray failed: {_first_line(e)}") from None
    return True


START_TRIES = 3  # starts of a local Ray whose raylet missed its registration time


def _children() -> set[Any]:
    import psutil

    return set(psutil.Process().children(recursive=True))


def _kill(process: Any) -> None:
    try:
        process.kill()
    except Exception:  # noqa: BLE001 - already gone
        pass


def check_cluster(address: str, timeout: float = JOIN_TIMEOUT) -> str:
    """The address to give `ray.init` once the cluster at `address` answered (`auto`: the one
    the last `ray start` on this machine recorded); ClusterError with one line otherwise."""
    from ray._private import services

    if address.startswith("ray://"):  # Ray Client: its own protocol; check that something listens
        host, _, port = address[len("ray://"):].rpartition(":")
        try:
            socket.create_connection((host, int(port or 10001)), timeout=timeout).close()
        except (OSError, ValueError) as e:
            raise ClusterError(f"nothing answers at {address}: {e}") from None
        return address
    try:
        target = services.canonicalize_bootstrap_address(address)
    except Exception as e:
        raise ClusterError(f"--ray-address {address}: {_first_line(e)}") from None
    if target is None:
        raise ClusterError(f"--ray-address {address}: no running Ray cluster found")
    if address == "auto":
        from ray._common.utils import get_ray_address_file

        where = f"{target} (from {get_ray_address_file(None)}, or a Ray running on this machine)"
    else:
        where = address if target == address else f"{address} ({target})"
    code, details = _ask_gcs(target, timeout)
    if code is None:
        return target
    if code == "UNAUTHENTICATED":
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
            raise ClusterError(f"the Ray cluster at {where} refused our token ({details}): use the cluster's "
                               f"token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
        raise ClusterError(f"the Ray cluster at {where} requires token authentication: set RAY_AUTH_MODE=token "
                           f"(the token is read from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
    if code == "DEADLINE_EXCEEDED":
        raise ClusterError(f"the Ray cluster at {where} did not answer within {timeout:g} s")
    if code == "UNAVAILABLE":
        raise ClusterError(f"no Ray cluster answers at {where}: {details}")
    raise ClusterError(f"joining the Ray cluster at {where} failed: {code}: {details}")


def _ask_gcs(target: str, timeout: float) -> tuple[str | None, str]:
    """(None, "") if the GCS at `target` answers a cluster-id request, else (gRPC code, reason).
    Sends the token exactly when `ray.init` would (RAY_AUTH_MODE=token)."""
    import grpc
    from ray._private.authentication.grpc_authentication_client_interceptor import \
        _get_authentication_metadata_tuple
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = grpc.insecure_channel(target)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=timeout, metadata=_get_authentication_metadata_tuple())
        return None, ""
    except grpc.RpcError as e:
        # gRPC's details end with the reason: "...: Connection refused", "...: Domain name not found]"
        reason = (e.details() or "").rstrip("]").rpartition(": ")[2] or str(e.code())
        return e.code().name, reason
    finally:
        channel.close()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


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


def _run_step(task: TaskSpec, board: Any = None, key: str = "") -> TaskResult:
    node = ray.get_runtime_context().get_node_id()
    mapper = ray_map if ray.is_initialized() else local_map
    beats = (lambda beat: board.beat.remote(key, beat)) if board is not None else None
    return execute(task, mapper=mapper, node=node, beats=beats)


class _Board:
    """The newest heartbeat of each running attempt (executor.heartbeat), stamped with this
    actor's clock when it arrives (the workers' clocks are never compared with the driver's)."""

    def __init__(self) -> None:
        self.beats: dict[str, tuple[float, dict[str, Any]]] = {}

    def beat(self, key: str, data: dict[str, Any]) -> None:
        self.beats[key] = (time.monotonic(), data)

    def read(self, keys: list[str]) -> dict[str, tuple[float, dict[str, Any]]]:
        now = time.monotonic()
        return {k: (now - self.beats[k][0], self.beats[k][1]) for k in keys if k in self.beats}

    def forget(self, key: str) -> None:
        self.beats.pop(key, None)


def _dump_on_node(node: str | None, pid: int) -> str:
    """`outside_dump(pid)` run on the worker's node (a task pinned there, on no CPU)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    opts: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
    if node:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    try:
        return ray.get(ray.remote(outside_dump).options(**opts).remote(pid), timeout=DUMP_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - the node may be the thing that is wrong
        return f"no dump from node {node}: {type(e).__name__}: {_first_line(e)}\n"


DUMP_TIMEOUT = 60.0  # seconds the outside dump of a hung worker may take
_BOARDS: dict[str, Any] = {}  # Ray session -> its board: one actor for every run of this process


def _board() -> Any:
    """The heartbeat board of this process's Ray session (started once; the runs' keys never
    collide: they carry the run id)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # beside the driver (which goes down with it anyway), never on a worker node that may be lost
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    start = lambda: ray.remote(_Board).options(num_cpus=0, max_restarts=-1, scheduling_strategy=here).remote()  # noqa: E731
    try:  # unique per start of a cluster (a job id is not: a new local Ray counts from 1 again)
        session = ray._private.worker.global_worker.node.session_name + "/" + ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - unknown: a board of its own
        return start()
    if session not in _BOARDS:
        _BOARDS.clear()
        _BOARDS[session] = start()
    return _BOARDS[session]


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

    def __init__(self, watch: bool = True) -> None:
        self._remote = ray.remote(_run_step)
        self._watch = watch  # the heartbeats of attempts (executor.heartbeat), on a board actor
        self._board: Any = None
        self._keys: dict[Any, str] = {}

    def submit(self, task: TaskSpec, attempt: int) -> Any:
        res = task.resources
        # A multi-worker step's own task only coordinates, on no CPU of its own (so that N
        # workers of the cluster's size still fit); Ray Train places the workers.
        opts = _task_options(Resources(cpus=0) if res.workers > 1 else res)
        if self._watch and self._board is None:
            self._board = _board()
        key = f"{task.run_id}/{task.name}/{task.token}/{attempt}"
        ref = self._remote.options(**opts, max_retries=task.max_node_failures, retry_exceptions=False,
                                   name=f"step:{task.name}").remote(task, self._board, key)
        self._keys[ref] = key
        return ref

    def heartbeats(self, handles: list[Any]) -> dict[Any, Beat]:
        """The newest heartbeat of each running attempt that has sent one."""
        keys = {self._keys[h]: h for h in handles if h in self._keys}
        if self._board is None or not keys:
            return {}
        try:
            found = ray.get(self._board.read.remote(list(keys)), timeout=10)
        except Exception as e:  # noqa: BLE001 - no heartbeats this time: nothing is judged on them
            log.warning("reading the heartbeats failed: %s", _first_line(e))
            return {}
        return {keys[k]: Beat.from_dict(data, age) for k, (age, data) in found.items()}

    def stop_hung(self, handle: Any, beat: Beat) -> str:
        """Dump what can be seen of a hung attempt's worker from outside, then kill it through
        Ray (a stopped process included: Ray's forced cancel ends the worker process); returns
        the dump. Its result comes back through `wait` (a cancelled task)."""
        dump = _dump_on_node(beat.info.get("node"), int(beat.info.get("pid", 0))) if beat.info.get("pid") else \
            "no pid in the heartbeat: nothing dumped\n"
        try:
            ray.cancel(handle, force=True)
        except Exception as e:  # noqa: BLE001 - already finished or gone
            log.warning("cancelling a hung step's task failed: %s", _first_line(e))
        return dump

    def wait(self, handles: list[Any], timeout: float) -> list[tuple[Any, TaskResult]]:
        ready, _ = ray.wait(handles, num_returns=1, timeout=timeout)
        if ready:  # take everything that is done, not just the first
            ready, _ = ray.wait(handles, num_returns=len(handles), timeout=0)
        out = []
        for ref in ready:
            key = self._keys.pop(ref, None)
            if key is not None and self._board is not None:
                self._board.forget.remote(key)
            try:
                out.append((ref, ray.get(ref)))
            except Exception as e:  # the worker or node died more often than the policy allows
                out.append((ref, TaskResult(name="?", ok=False, error=f"{type(e).__name__}: {_first_line(e)}")))
        return out


