"""Where each training worker sits (rack, node, GPU), the mesh order that follows from it, and the
placement that keeps every expert-parallel group inside one rack.

A rack is a Ray node label, `marin.rack` (docs/scaling-out.md: `ray start ... --labels
'{"marin.rack": "r07"}'`); nodes without it share one unnamed rack. Each worker reports its place
(rack label, Ray node id, its index on that node), the places are all-gathered, and the mesh is
built from the ranks sorted by place (`mesh_order`): the order does not depend on how Ray Train
numbered its workers, and the workers of one rack are consecutive. Since the expert-parallel
dimension is the mesh's innermost (steps/train/parallel.py), an `ep` group is `ep` consecutive
ranks of that order; `check_ep_groups` refuses a run whose group would span two racks.

Placement (`rack_selectors`): when the cluster's nodes carry rack labels, a training step asks
Ray Train for its workers rack by rack, in whole groups of `ep` (Ray Train's per-worker
`label_selector`): e.g. 704 workers with ep 64 on 11 racks of 72 GPUs take 64 GPUs of each rack,
never 72 of one and 56 of another.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import asdict, dataclass
from typing import Any

from executor import VoyageError

RACK_LABEL = "marin.rack"


@dataclass(frozen=True, order=True)
class Place:
    """A worker's place: sorting places sorts by rack, then node, then the worker's index there."""

    rack: str
    node: str
    local: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def my_place(local: int | None = None) -> Place:
    """This process's place: under Ray (a Ray Train worker, or a task), its node's rack label and
    node id; else the `MARIN_RACK` environment variable and the host name. `local` defaults to
    the process's local rank (`LOCAL_RANK`, which Ray Train and torchrun set)."""
    if local is None:
        local = int(os.environ.get("LOCAL_RANK", "0"))
    ray = sys.modules.get("ray")  # a Ray worker has imported it; importing it here would cost seconds
    if ray is not None and ray.is_initialized():
        ctx = ray.get_runtime_context()
        labels = ctx.get_node_labels() or {}
        return Place(rack=str(labels.get(RACK_LABEL, "")), node=ctx.get_node_id(), local=local)
    return Place(rack=os.environ.get("MARIN_RACK", ""), node=socket.gethostname(), local=local)


def gather_places(place: Place) -> list[Place]:
    """Every rank's place, indexed by global rank (a collective; one rank: just this one)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [place]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, place.as_dict())
    return [Place(**p) for p in out]


def mesh_order(places: list[Place]) -> list[int]:
    """Global ranks sorted by place (rack, node, local index; ties by rank)."""
    return sorted(range(len(places)), key=lambda r: (places[r], r))


def check_ep_groups(order: list[int], places: list[Place], ep: int) -> None:
    """A VoyageError naming the first expert-parallel group (ep consecutive ranks of `order`)
    that spans more than one rack."""
    for start in range(0, len(order), ep):
        group = order[start:start + ep]
        racks = sorted({places[r].rack for r in group})
        if len(racks) > 1:
            counts = {rack: sum(places[r].rack == rack for r in group) for rack in racks}
            raise VoyageError(f"trainer.parallel.ep: the expert-parallel group of mesh positions "
                              f"{start}..{start + ep - 1} "
                              f"spans racks {counts}; every rack must hold a multiple of ep={ep} training workers "
                              f"(label nodes with {RACK_LABEL!r} and let the step place its workers, "
                              f"docs/scaling-out.md)")


def rack_capacity(nodes: list[dict[str, Any]], per_worker: dict[str, float]) -> dict[str, int]:
    """Workers of `per_worker` resources each rack's alive nodes can hold (ray.nodes() rows);
    nodes without a rack label are left out."""
    racks: dict[str, int] = {}
    for node in nodes:
        if not node.get("Alive", True):
            continue
        rack = (node.get("Labels") or {}).get(RACK_LABEL)
        if rack is None:
            continue
        have = node.get("Resources") or {}
        fits = min((int(have.get(k, 0) // v) for k, v in per_worker.items() if v > 0), default=0)
        racks[rack] = racks.get(rack, 0) + fits
    return racks


def rack_selectors(workers: int, ep: int, capacity: dict[str, int]) -> list[dict[str, str]] | None:
    """One Ray label selector per worker, filling racks in sorted order with whole groups of
    `ep` workers; None when no node carries a rack label. A VoyageError when the racks cannot
    hold `workers` in groups of `ep`."""
    if not capacity:
        return None
    if workers % ep:
        raise VoyageError(f"trainer.parallel.ep: {ep} does not divide the step's {workers} workers")
    selectors: list[dict[str, str]] = []
    for rack in sorted(capacity):
        take = min(capacity[rack] // ep * ep, workers - len(selectors))
        selectors += [{RACK_LABEL: rack}] * take
    if len(selectors) < workers:
        offer = ", ".join(f"{rack}: {n}" for rack, n in sorted(capacity.items()))
        raise VoyageError(f"Resources.workers: {workers} workers in groups of ep={ep} inside one rack do not fit the "
                          f"cluster's racks (workers each rack can hold: {offer})")
    return selectors
