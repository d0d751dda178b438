"""A distributed optimizer across the data-parallel replicas (`offload="replicas"`): AdamW's
state sharded over `dp_replicate` as well as `dp_shard`, Megatron-Core's distributed optimizer
(ZeRO-1 with the gradient reduce-scattered) on top of FSDP2 / HSDP.

Under plain HSDP every replica holds the same shard of every parameter, of its gradient and of
its two moments, and all-reduces the gradient shards across replicas once a step. Here:

- FSDP2 shards over dp_shard only (its mesh has no replica dimension, so it never all-reduces
  across replicas): after the last micro-batch each replica holds its own sum of the gradient
  shard;
- `reduce_gradients` splits each local gradient shard, flattened, into `dp_replicate` equal
  slices (the last ones short or empty), reduce-scatters it over the replica group, and leaves
  in the gradient only this rank's slice of the sum (zeros elsewhere, so a norm summed over all
  ranks is the global norm and clipping scales what is owned);
- `ReplicaShardedAdamW.step` updates only that slice of the parameter with moments of the
  slice's size, then all-gathers the updated slices over the replica group, once a step.

Bytes across racks: a reduce-scatter plus an all-gather of the fp32 shard, which is what the
ring all-reduce they replace moves. Memory a GPU: the moments fall from 8 to 8/dp_replicate
bytes a parameter, with nothing on the host. The fp32 weights stay whole on every replica (they
are what FSDP gathers each block), so they are their own master copy.

The slices are a function of the local shard's size, the replica count and the replica's place
in it (`_slice`), the same in the reduce, the update and a checkpoint. Checkpoints: `state_dict`
gathers each moment back to the parameter's shard, as a DTensor of the parameter's layout, so
torch.distributed.checkpoint saves the same keys and full logical tensors as a plain AdamW: a
checkpoint written on this optimizer loads on any mesh and optimizer, and the other way round.
On gloo (the CPU tests) the reduce-scatter is an all-reduce of which each rank keeps its slice:
with two replicas a sum of two, the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


@dataclass(frozen=True)
class Replicas:
    """The replica group of this rank: the ranks at its place in dp_shard (the same group for
    dense and expert shards: the expert mesh's (efsdp, ep) is dp_shard, in the same order)."""

    group: Any  # ProcessGroup, or None with one replica
    size: int
    index: int

    @classmethod
    def of(cls, dense_mesh: Any) -> "Replicas":
        """From the dense DeviceMesh (dp_replicate, dp_shard)."""
        size = dense_mesh.size(0)
        if size == 1:
            return cls(None, 1, 0)
        return cls(dense_mesh.get_group("dp_replicate"), size, dense_mesh.get_local_rank("dp_replicate"))


ONE = Replicas(None, 1, 0)


def _slice(numel: int, replicas: int, index: int) -> tuple[int, int, int]:
    """(start, stop, padded slice length) of replica `index`'s part of a flat shard of `numel`."""
    chunk = -(-numel // replicas) if numel else 0
    start = min(numel, index * chunk)
    return start, min(numel, start + chunk), chunk


def _reduce_scatter(flat: Tensor, group: Any, replicas: int, index: int) -> Tensor:
    """This rank's slice of the sum of `flat` over `group`."""
    start, stop, chunk = _slice(flat.numel(), replicas, index)
    if dist.get_backend(group) == "gloo":  # gloo has no reduce-scatter of one tensor
        total = flat.clone()
        dist.all_reduce(total, group=group)
        return total[start:stop]
    padded = torch.zeros(chunk * replicas, dtype=flat.dtype, device=flat.device)
    padded[:flat.numel()] = flat
    out = torch.empty(chunk, dtype=flat.dtype, device=flat.device)
    dist.reduce_scatter_tensor(out, padded, group=group)
    return out[:stop - start]


def _all_gather(flat: Tensor, group: Any, replicas: int, index: int) -> None:
    """Every replica's updated slice of `flat`, in place."""
    start, stop, chunk = _slice(flat.numel(), replicas, index)
    mine = torch.zeros(chunk, dtype=flat.dtype, device=flat.device)
    mine[:stop - start] = flat[start:stop]
    whole = torch.empty(chunk * replicas, dtype=flat.dtype, device=flat.device)
    if dist.get_backend(group) == "gloo":
        dist.all_gather(list(whole.chunk(replicas)), mine, group=group)
    else:
        dist.all_gather_into_tensor(whole, mine, group=group)
    flat.copy_(whole[:flat.numel()])


@torch.no_grad()
def reduce_gradients(params: Any, replicas: Replicas) -> None:
    """Sum each gradient shard over the replicas, keeping this rank's slice (zeros elsewhere).
    A collective over the replica group; call once a step, after the last backward."""
    if replicas.group is None:
        return
    for p in params:
        if p.grad is None:
            continue
        flat = _local(p.grad).view(-1)
        mine = _reduce_scatter(flat, replicas.group, replicas.size, replicas.index)
        start, stop, _ = _slice(flat.numel(), replicas.size, replicas.index)
        flat.zero_()
        flat[start:stop] = mine


class ReplicaShardedAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay, no amsgrad) whose moments hold only this
    rank's slice of its parameter shard; each step updates that slice and all-gathers the
    parameter over the replicas. The gradients must have been through `reduce_gradients`."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 replicas: Replicas = ONE) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False, fused=False)
        self.replicas = replicas

    def _bounds(self, p: Tensor) -> tuple[Any, int, int, int, int]:
        r = self.replicas
        start, stop, _ = _slice(_local(p).numel(), r.size, r.index)
        return r.group, r.size, r.index, start, stop

    def _state_of(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state[p]
        if not state:
            _, _, _, start, stop = self._bounds(p)
            local = _local(p)
            state["step"] = torch.tensor(0.0, dtype=torch.float32)  # on the CPU, as AdamW keeps it
            state["exp_avg"] = torch.zeros(stop - start, dtype=local.dtype, device=local.device)
            state["exp_avg_sq"] = torch.zeros(stop - start, dtype=local.dtype, device=local.device)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        from torch.optim.adam import adam

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                s = self._state_of(p)
                pg, replicas, index, start, stop = self._bounds(p)
                flat = _local(p).view(-1)
                adam([flat[start:stop]], [_local(p.grad).view(-1)[start:stop]], [s["exp_avg"]], [s["exp_avg_sq"]],
                     [], [s["step"]], foreach=False, capturable=False, differentiable=False, fused=False,
                     has_complex=False, decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                     lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
                if pg is not None:
                    _all_gather(flat, pg, replicas, index)
        return loss

    def state_dict(self) -> dict[str, Any]:
        """AdamW's state dict with each moment gathered back to its parameter's shard, a DTensor
        of the parameter's layout (a collective over the replica groups: every rank calls it)."""
        sd = super().state_dict()
        params = [p for group in self.param_groups for p in group["params"]]
        ids = [i for group in sd["param_groups"] for i in group["params"]]
        for idx, p in zip(ids, params):
            entry = sd["state"].get(idx)
            if not entry:
                continue
            sd["state"][idx] = {k: (self._whole(p, v) if k in ("exp_avg", "exp_avg_sq") else v) for k, v in entry.items()}
        return sd

    def _whole(self, p: Tensor, mine: Tensor) -> Tensor:
        pg, replicas, index, start, stop = self._bounds(p)
        local = _local(p)
        flat = torch.zeros(local.numel(), dtype=mine.dtype, device=mine.device)
        flat[start:stop] = mine
        if pg is not None:
            _all_gather(flat, pg, replicas, index)
        whole = flat.view(local.shape)
        if not hasattr(p, "device_mesh"):
            return whole
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(whole, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as AdamW does, keeping of each moment only this rank's slice."""
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        slim = {idx: {k: v for k, v in entry.items() if k not in ("exp_avg", "exp_avg_sq")}
                for idx, entry in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": slim})
        for idx, p in zip(ids, params):
            entry = state_dict["state"].get(idx, {})
            _, _, _, start, stop = self._bounds(p)
            local = _local(p)
            for key in ("exp_avg", "exp_avg_sq"):
                if key in entry:
                    value = _local(entry[key]).to(device=local.device, dtype=local.dtype).reshape(-1)
                    self.state[p][key] = value[start:stop].clone()
