"""The plan's figures read from the real model: built on `meta`, sharded by the trainer's own
`parallelize` in a fake process group of the mesh's full size, every DTensor's shard read; and
one block of each kind (global, windowed) plus the head traced under FakeTensorMode at the real
micro-batch (steps/scale/trace.py). Nothing is allocated: a 535B model on 704 ranks plans in a
few seconds and a few hundred MB.

The largest rank decides the peak: FSDP2 pads every shard to ceil(rows / ranks) rows, so the
bytes a shard's storage holds (read here) are what the largest rank uses, and what every rank
allocates; `to_local()` of a rank past the end is shorter (tests build rank 0 and the last rank).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any

import torch

from executor import VoyageError
from steps.scale import memory as mem
from steps.scale.hardware import GIB
from steps.scale.mesh_plan import (Activations, Choice, MeshPlan, Setup, estimate, layer_kinds, pick, shortfall,
                              with_measurement)
from steps.scale.trace import fake_world, trace_block, trace_head


@dataclass(frozen=True)
class ShardReading:
    """What the fake-process-group build found on one rank."""

    shards: mem.Shards  # padded elements by unit
    local: int  # elements of `to_local()`, summed (shorter than padded on a rank past the end)
    uneven: tuple[str, ...]  # parameters whose rows do not divide over their shard group
    rank: int
    world: int
    seconds: float


def _unit(name: str) -> str:
    if name.startswith("embed."):
        return "embed"
    if name.startswith(("norm.", "head.")):
        return "head"
    return "experts" if name.endswith(("_EFD", "_EDF")) else "dense"


def read_shards(cfg: Any, choice: Choice, rank: int = 0) -> ShardReading:
    """Build `cfg` on meta, shard it with steps.train.parallel over a fake process group of the
    mesh's size (as `rank`), and count each parameter's shard."""
    from steps.moe.model import MoETransformer
    from steps.train.config import ParallelConfig
    from steps.train.parallel import build_meshes, mixed_precision, parallelize

    m = choice.mesh
    # the offload moves no shard: the same shapes live on the host or the GPU
    pc = ParallelConfig(dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, ep=m.ep, checkpointing=choice.checkpointing)
    start = time.perf_counter()
    with fake_world(m.ranks, rank=rank):
        with torch.device("meta"):
            model = MoETransformer(cfg)
        parallelize(model, build_meshes(pc, "cpu"), pc, mixed_precision("bf16"))
        padded = {"dense": 0, "experts": 0, "embed": 0, "head": 0}
        local = 0
        uneven = []
        for name, p in model.named_parameters():
            shard = p.to_local()
            local += shard.numel()
            padded[_unit(name)] += shard.untyped_storage().nbytes() // shard.element_size()
            groups = [p.device_mesh.size(i) for i, pl in enumerate(p.placements) if pl.is_shard()]
            if p.shape[0] % max(1, _prod(groups)) and not _dim1(p):
                uneven.append(name)
    per_block = cfg.n_layers or 1
    shards = mem.Shards(dense_per_block=padded["dense"] // per_block, experts_per_block=padded["experts"] // per_block,
                        embed=padded["embed"], head=padded["head"])
    return ShardReading(shards=shards, local=local, uneven=tuple(uneven), rank=rank, world=m.ranks,
                        seconds=time.perf_counter() - start)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _dim1(p) -> bool:
    return any(pl.is_shard() and getattr(pl, "dim", 0) == 1 for pl in p.placements)


def trace_activations(setup: Setup, choice: Choice) -> Activations:
    """One block of each kind and the head, traced at the choice's micro-batch, experts over an
    expert-parallel group of the mesh's ep in a fake process group."""
    from torch.distributed.device_mesh import init_device_mesh

    cfg, ep = setup.model, choice.mesh.ep
    layers = layer_kinds(cfg)
    kept, working = {}, {}
    with fake_world(ep):
        mesh = init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",)) if ep > 1 else None
        for is_global, layer in layers.items():
            tr = trace_block(cfg, layer, choice.microbatch, setup.context, choice.checkpointing, mesh)
            kept[is_global], working[is_global] = tr.kept, tr.working
    head = trace_head(cfg, choice.microbatch, setup.context).peak
    return Activations(kept=kept, working=working, head=head, source="traced")


@dataclass(frozen=True)
class Measured:
    """A plan from measured figures, beside the closed-form plan of the same choice."""

    plan: MeshPlan
    formula: MeshPlan
    reading: ShardReading
    trace_seconds: float
    passed_over: tuple[str, ...] = ()  # faster choices whose measured figures did not fit (plan_for)


@functools.lru_cache(maxsize=8)
def measure(setup: Setup, choice: Choice) -> Measured:
    """The plan of `choice` from the real sharding and the traced activations (cached: the
    voyage and its summary, or two configs that resolve to one choice, measure once)."""
    formula = estimate(setup, choice)  # checks divisibility first: nothing to build if it fails
    reading = read_shards(setup.model, choice)
    start = time.perf_counter()
    acts = trace_activations(setup, choice)
    return Measured(plan=with_measurement(formula, acts, reading.shards), formula=formula, reading=reading,
                    trace_seconds=time.perf_counter() - start)


@functools.lru_cache(maxsize=8)
def plan_for(setup: Setup, dp_replicate: int = 0, dp_shard: int = 0, ep: int = 0, microbatch: int = 0,
             checkpointing: str = "auto", offload: str = "auto",
             tries: int = 4) -> tuple[Measured, tuple[MeshPlan, ...]]:
    """The search's choice for the fields given (steps.scale.mesh_plan.pick), measured; and the
    alternatives. When the measured figures do not fit where the closed form did, the next
    alternative by step time is measured instead (up to `tries` in all; `Measured.passed_over`
    names the ones that missed). A VoyageError when nothing divides or fits, or when none of the
    tries fits measured. Cached: a voyage and its summary plan once."""
    chosen, alternatives = pick(setup, dp_replicate, dp_shard, ep, microbatch, checkpointing, offload)
    order = [chosen, *sorted((p for p in alternatives if p.choice != chosen.choice and p.fits),
                             key=lambda p: p.time.total)]
    missed: list[Measured] = []
    for plan in order[:tries]:
        measured = measure(setup, plan.choice)
        if measured.plan.fits:
            if missed:
                measured = dataclasses.replace(measured, passed_over=tuple(
                    f"{m.plan.choice.describe()}: {m.plan.peak / GIB:.2f} GiB measured, {m.plan.verdict()}"
                    for m in missed))
            return measured, tuple(p for p in alternatives if p.choice != plan.choice or p is plan)
        missed.append(measured)
    raise VoyageError(shortfall(missed[0].plan, "measured, the search's choice") +
                      (f"; the next {len(missed) - 1} by step time did not fit measured either" if len(missed) > 1 else ""))
