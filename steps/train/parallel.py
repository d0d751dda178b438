"""How the model is spread over workers, and at what precision: the mesh a `ParallelConfig`
describes, the sharding it applies to a model built on `meta`, and three small components the
trainer picks once, so the training loop has no branches on either.

The mesh (torchtitan's layout). Two `DeviceMesh`es over the same ranks, in the topology order
(steps/train/topology.py: rack, node, GPU):

    dense   (dp_replicate, dp_shard)        everything but the routed experts: FSDP2 over
                                            dp_shard, replicated across dp_replicate (HSDP)
    sparse  (dp_replicate, efsdp, ep)       routed experts, when ep > 1: `Shard(0)` over ep
                                            (whole experts per rank, tokens sent to them by
                                            all-to-all), then FSDP2 over efsdp = dp_shard / ep

`ep` is innermost, so an expert-parallel group is `ep` consecutive ranks of the topology order:
one rack when ep divides a rack's training ranks. Expert parallelism adds no ranks: every rank
is a data-parallel rank and reads its own share of the batch.

What the sharding applies (`parallelize`, on `meta`, with no communication: it runs in a fake
process group of the full world size as well):
- expert weights `Shard(0)` over ep, and the MoE's routed path set to the all-to-all one;
- activation checkpointing per block (steps/train/recompute.py);
- `fully_shard` per block (expert weights on the expert data-parallel mesh through FSDP2's
  per-parameter mesh, the rest on the dense one), on the embedding, on the final norm with the
  head, and at the root; expert weights are sharded on dim 1 when their FSDP group is larger than
  the experts it shares (no padding rows);
- gradients summed, not averaged, by FSDP (divide factor 1): the trainer divides the loss by the
  number of data-parallel ranks instead, which is right for dense and expert weights alike (an
  expert's gradient already sums the tokens every rank of its ep group sent it);
- with `offload="all"`, FSDP2's CPUOffloadPolicy (`offload="moments"` is the optimizer's
  business: steps/train/offload.py).

Components (`build_parallel`):
- `OneProcess`: one process, no torch.distributed (fp32).
- `DDP`: fp32 with no sharding at all (dp_shard 1, ep 1): torch DistributedDataParallel, buffers
  not broadcast, gradient sync on the last micro-batch only (every rank holds whole gradients
  anyway); bitwise equal to one worker running the same micro-batches.
- `FSDP`: everything else (bf16 always, and offload="all"): FSDP2 / HSDP with expert parallelism. Every
  micro-batch reduce-scatters its gradients (only sharded gradients are ever accumulated); with
  HSDP, the all-reduce across replicas waits for the last micro-batch.
- `ShardedReplicas` (offload="replicas"): FSDP2 over dp_shard with a distributed optimizer across
  the replicas (steps/train/replicas.py): working weights in the compute dtype, fp32 master
  weights, gradient slices and moments sharded over dp_replicate; the gradients accumulated in
  fp32, reduce-scattered across replicas instead of all-reduced, the parameters all-gathered once
  a step.

Precision: bf16 on the GPU, fp32 on the CPU. bf16 always goes through FSDP2's policy (parameters
gathered in bf16, gradients reduced in fp32, fp32 master weights; a 1-rank process group when
there is one worker), never through torch.autocast: autocast casts the matmul inside the
model's fp32 router-logits function to bf16 and its backward then fails on mixed dtypes.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from steps.train.config import ParallelConfig  # noqa: F401  (re-exported: the public entry point)
from steps.train.recompute import apply_checkpointing

__all__ = ["ParallelConfig", "Meshes", "build_meshes", "parallelize", "materialize", "mixed_precision",
           "build_parallel", "join_mesh", "clip_grad_norm", "OneProcess", "DDP", "FSDP", "ShardedReplicas"]


@dataclass
class Meshes:
    """The meshes of a resolved ParallelConfig over `ranks` (global ranks in mesh order)."""

    pc: ParallelConfig
    ranks: list[int]
    dense: Any  # DeviceMesh (dp_replicate, dp_shard)
    sparse: Any | None  # DeviceMesh (dp_replicate, efsdp, ep) when ep > 1

    @property
    def dp_mesh(self):
        """The mesh FSDP2 shards dense parameters on: 1-D dp_shard, or 2-D for HSDP."""
        return self.dense if self.hsdp else self.dense["dp_shard"]

    @property
    def hsdp(self) -> bool:
        """FSDP2 replicates across dp_replicate itself (HSDP); not with offload="replicas", whose
        optimizer does that sync (steps/train/replicas.py)."""
        return self.pc.dp_replicate > 1 and self.pc.offload != "replicas"

    @property
    def expert_dp_mesh(self):
        """The mesh FSDP2 shards expert weights on: efsdp, or (dp_replicate, efsdp) for HSDP."""
        if self.sparse is None:
            return self.dp_mesh
        return self.sparse["dp_replicate", "efsdp"] if self.hsdp else self.sparse["efsdp"]

    @property
    def ep_mesh(self):
        return None if self.sparse is None else self.sparse["ep"]

    @property
    def data_rank(self) -> int:
        """This rank's share of the batch: its place in the mesh order."""
        return self.ranks.index(dist.get_rank())

    def ep_groups(self) -> list[list[int]]:
        """The global ranks of each expert-parallel group (consecutive in the mesh order)."""
        ep = self.pc.ep
        return [self.ranks[i:i + ep] for i in range(0, len(self.ranks), ep)]


def build_meshes(pc: ParallelConfig, device_type: str, ranks: list[int] | None = None) -> Meshes:
    """The dense mesh and, when ep > 1, the expert mesh of `pc` over the initialized process
    group (any backend, the fake one included). `ranks` is the mesh order (a permutation of the
    world's ranks, e.g. topology-sorted); None is 0..W-1. Every rank must call it alike."""
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.get_world_size()
    pc = pc.resolve(world)
    ranks = list(range(world)) if ranks is None else [int(r) for r in ranks]
    if sorted(ranks) != list(range(world)):
        raise ValueError(f"mesh order must be a permutation of the {world} ranks, got {ranks}")
    order = torch.tensor(ranks, dtype=torch.int)
    dense = DeviceMesh(device_type, order.view(pc.dp_replicate, pc.dp_shard),
                       mesh_dim_names=("dp_replicate", "dp_shard"))
    sparse = None
    if pc.ep > 1:
        sparse = DeviceMesh(device_type, order.view(pc.dp_replicate, pc.efsdp, pc.ep),
                            mesh_dim_names=("dp_replicate", "efsdp", "ep"))
    return Meshes(pc=pc, ranks=ranks, dense=dense, sparse=sparse)


def mixed_precision(precision: str):
    """FSDP2's policy: bf16 parameters and fp32 gradient reduction for "bf16", else fp32. Block
    inputs are not cast, so the rotary tables stay fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    return MixedPrecisionPolicy(cast_forward_inputs=False)


def parallelize(model: nn.Module, meshes: Meshes, pc: ParallelConfig | None = None, mp_policy: Any = None,
                reshard_after_forward: bool = True) -> nn.Module:
    """Shard a MoETransformer (built on `meta`, or anywhere) over `meshes` in place: expert
    parallelism, activation checkpointing, FSDP2 / HSDP (see the module docstring). No
    communication; returns the model."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import Shard

    from steps.moe.expert_parallel import EXPERT_WEIGHTS, shard_experts

    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    pc = meshes.pc if pc is None else pc.resolve(len(meshes.ranks))
    mp_policy = mp_policy or mixed_precision("fp32")
    offload = (CPUOffloadPolicy(pin_memory=meshes.dense.device_type == "cuda") if pc.offload == "all"
               else OffloadPolicy())
    if meshes.ep_mesh is not None:
        for block in model.blocks:
            shard_experts(block.moe, meshes.ep_mesh)
    apply_checkpointing(model, pc.checkpointing)

    n_experts = model.cfg.n_experts
    expert_fsdp = meshes.expert_dp_mesh.size(-1)  # ranks sharing one expert shard
    expert_dim = Shard(1) if expert_fsdp > n_experts // pc.ep else Shard(0)
    placement = _placement_fn(meshes, expert_dim)
    common = dict(mesh=meshes.dp_mesh, mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model.embed, reshard_after_forward=reshard_after_forward, **common)
    for block in model.blocks:
        experts = {getattr(block.moe, name) for name in EXPERT_WEIGHTS}
        fully_shard(block, reshard_after_forward=reshard_after_forward,
                    shard_placement_fn=lambda p, experts=experts: placement(p in experts), **common)
    # the last unit's parameters are needed first in the backward: kept gathered after forward
    fully_shard([model.norm, model.head], reshard_after_forward=False, **common)
    fully_shard(model, **common)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # summed: the loss is divided by the dp ranks
            module.set_force_sum_reduction_for_comms(True)
    return model


def _placement_fn(meshes: Meshes, expert_dim):
    """`is_expert -> placement` for FSDP2's shard_placement_fn: experts on their own mesh when
    expert-parallel (FSDP2's per-parameter mesh), every other parameter Shard(0) on the dense one."""
    from torch.distributed.tensor import Shard

    if meshes.sparse is None:
        return lambda is_expert: expert_dim if is_expert else Shard(0)
    from torch.distributed.fsdp._fully_shard._fsdp_common import ShardPlacementResult
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info

    expert_info, dense_info = _get_mesh_info(meshes.expert_dp_mesh), _get_mesh_info(meshes.dp_mesh)
    return lambda is_expert: (ShardPlacementResult(expert_dim, expert_info) if is_expert
                              else ShardPlacementResult(Shard(0), dense_info))


def materialize(model: nn.Module, device: torch.device, seed: int, offload: bool = False) -> nn.Module:
    """Allocate a (sharded) meta-device model on `device` and initialize it by parameter name and
    seed (steps/moe/init.py): each rank writes only its shards, the same values on any mesh. With
    `offload` the parameter shards are allocated in host memory (FSDP2 moves them to the device
    for each gather) and only the buffers go to `device`."""
    model.to_empty(device=torch.device("cpu") if offload else device)
    model.init_weights(seed)
    if offload:
        for module in model.modules():
            for name, buf in list(module.named_buffers(recurse=False)):
                module.register_buffer(name, buf.to(device), persistent=name not in module._non_persistent_buffers_set)
    return model


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float, shard_group: Any = None) -> torch.Tensor:
    """Clip gradients to a global L2 norm of `max_norm` (inf: measure only); returns the norm
    before clipping, a plain fp32 tensor.

    Without `shard_group`, torch's clip_grad_norm_ (plain or single-mesh gradients: bitwise what
    the trainer always did). With it, the gradients are shards that partition each parameter over
    the ranks of `shard_group` and are replicated across the other ranks, as FSDP2 / HSDP with
    expert parallelism leave them (dense and expert weights alike are split over the dp_shard
    ranks of a replica, efsdp x ep = dp_shard): the squares of the local shards are summed and
    all-reduced once over that group."""
    params = [p for p in params if p.grad is not None]
    if shard_group is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    local = [g.to_local() if hasattr(g, "to_local") else g for g in (p.grad for p in params)]
    square = torch.stack([n.float() for n in torch._foreach_norm(local, 2.0)]).square().sum() if local else \
        torch.zeros((), dtype=torch.float32)
    if dist.get_backend(shard_group) == "nccl":  # offloaded gradients live on the host
        square = square.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(square, group=shard_group)
    total = square.sqrt().to(local[0].device if local else square.device)
    if math.isfinite(max_norm):
        torch._foreach_mul_(local, float((max_norm / (total + 1e-6)).clamp(max=1.0)))
    return total


class OneProcess:
    """One process, no torch.distributed: the model as it is."""

    loss_divisor = 1  # what the summed loss of a rank is divided by (besides the micro-batches)
    norm_group = None  # the group gradient norms are summed over (clip_grad_norm)

    def __init__(self, pc: ParallelConfig) -> None:
        self.pc = pc

    @property
    def data_rank(self) -> int:
        return 0

    def parallelize(self, model: nn.Module) -> nn.Module:
        apply_checkpointing(model, self.pc.checkpointing)
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def sync(self, model: nn.Module, last: bool) -> Iterator[None]:
        yield

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the step's gradients to a global norm of `max_norm` (inf: measure only); the
        norm before clipping."""
        return clip_grad_norm(model.parameters(), max_norm, self.norm_group)


class DDP(OneProcess):
    """Plain data parallelism in fp32 (dp_shard 1, ep 1): DistributedDataParallel, which
    averages gradients itself."""

    def __init__(self, pc: ParallelConfig, device: torch.device, ranks: list[int]) -> None:
        super().__init__(pc)
        self.device, self.ranks = device, ranks

    @property
    def data_rank(self) -> int:
        return self.ranks.index(dist.get_rank())

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def sync(self, model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else model.no_sync()


class FSDP(OneProcess):
    """FSDP2 / HSDP with expert parallelism over `meshes` (see the module docstring)."""

    def __init__(self, meshes: Meshes, precision: str) -> None:
        super().__init__(meshes.pc)
        self.meshes, self.precision = meshes, precision
        self.loss_divisor = meshes.pc.dp  # FSDP sums gradients over the data-parallel ranks
        self.norm_group = meshes.dense["dp_shard"].get_group()

    @property
    def data_rank(self) -> int:
        return self.meshes.data_rank

    def parallelize(self, model: nn.Module) -> nn.Module:
        return parallelize(model, self.meshes, self.pc, mixed_precision(self.precision))

    @contextlib.contextmanager
    def sync(self, model: nn.Module, last: bool) -> Iterator[None]:
        # Reduce-scatter every micro-batch (sharded gradients accumulate); across replicas
        # (HSDP), all-reduce only after the last one.
        model.set_requires_all_reduce(last)
        yield


class ShardedReplicas(FSDP):
    """FSDP2 over dp_shard with a distributed optimizer across the replicas
    (`offload="replicas"`, steps/train/replicas.py): fp32 master weights, gradients and moments
    sharded over dp_replicate; the working weights in the compute dtype. Each rank's reduced
    gradient slices partition the gradient, so gradient norms are summed over every rank."""

    def __init__(self, meshes: Meshes, precision: str) -> None:
        from steps.train.replicas import Replicas

        super().__init__(meshes, precision)
        self.replicas = Replicas.of(meshes.dense)
        if self.replicas.size > 1:
            self.norm_group = dist.group.WORLD

    def wrap(self, model: nn.Module) -> nn.Module:
        from steps.train.replicas import shard_over_replicas

        return shard_over_replicas(model, self.replicas, self.precision)

    @contextlib.contextmanager
    def sync(self, model: nn.Module, last: bool) -> Iterator[None]:
        # FSDP2 reduce-scatters every micro-batch over dp_shard; the fp32 accumulation and, on
        # the last micro-batch, the reduce-scatter over the replicas run from its gradient hooks
        shards = model.replica_shards
        shards.last = last
        yield
        if last:
            shards.finish()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return model.replica_shards.clip(max_norm, self.norm_group)


def build_parallel(pc: ParallelConfig, device: torch.device, precision: str,
                   ranks: list[int] | None = None) -> OneProcess:
    """The component for this run: FSDP for bf16, offload="all" or any sharding, DDP for fp32
    replication only, OneProcess for one fp32 process. FSDP on one worker starts a 1-rank process
    group for FSDP2's mesh (the caller destroys it)."""
    if (precision == "bf16" or pc.offload == "all") and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size() if dist.is_initialized() else 1
    pc = pc.resolve(world)
    if not dist.is_initialized():
        return OneProcess(pc)
    ranks = list(range(world)) if ranks is None else ranks
    if precision != "bf16" and pc.dp_shard == 1 and pc.ep == 1 and pc.offload not in ("all", "replicas"):
        return DDP(pc, device, ranks)
    component = ShardedReplicas if pc.offload == "replicas" else FSDP
    return component(build_meshes(pc, device.type, ranks), precision)


def join_mesh(pc: ParallelConfig, device: torch.device, precision: str) -> tuple[OneProcess, list, list[int]]:
    """This worker's component, after every worker's place was gathered and the mesh order taken
    from them (steps/train/topology.py); refuses an expert-parallel group that spans racks.
    Returns (component, places by global rank, mesh order). A collective."""
    from steps.train.topology import check_ep_groups, gather_places, mesh_order, my_place

    places = gather_places(my_place())
    order = mesh_order(places)
    check_ep_groups(order, places, pc.resolve(len(places)).ep)
    return build_parallel(pc, device, precision, order), places, order


def pick_precision(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return choice


def unwrap(model: nn.Module) -> nn.Module:
    """The MoETransformer inside a DDP wrapper (FSDP2 shards in place and wraps nothing)."""
    return getattr(model, "module", model)


EXPANDABLE = "expandable_segments:True"


def expandable_segments() -> str:
    """Turn on the CUDA caching allocator's expandable segments, which the plan's 5% fragmentation
    reserve assumes (steps/scale/mesh_plan.py FRAGMENTATION): PYTORCH_CUDA_ALLOC_CONF gains
    `expandable_segments:True` unless it names expandable_segments already (a user's setting
    stands). Read when CUDA starts; if it has started, set through torch's allocator settings
    too. Returns the setting in force."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in conf:
        return conf
    conf = ",".join(x for x in (conf, EXPANDABLE) if x)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(EXPANDABLE)
    return conf


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        expandable_segments()  # before current_device(), which starts CUDA
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return torch.device("cuda", index)
    return torch.device("cpu")
