"""A distributed optimizer across the data-parallel replicas (`offload="replicas"`): fp32 master
weights, gradients and AdamW's moments sharded over `dp_replicate` as well as `dp_shard`
(Megatron-Core's distributed optimizer, ZeRO-1/2 across the replicas) on top of FSDP2.

FSDP2 shards over dp_shard only (its mesh has no replica dimension, so it never all-reduces across
replicas). What each rank holds, for its FSDP2 shard of every parameter (`numel` elements):

- the working parameter FSDP2 gathers each block: in the run's compute dtype (bf16 when the run is
  bf16, so 2 bytes; fp32 otherwise, 4);
- an fp32 gradient accumulator of the whole shard (4 bytes), allocated with the rest before the
  first forward: FSDP2 reduce-scatters each
  micro-batch's gradient over dp_shard in fp32; its all-reduce hook (per parameter group, run on
  the fp32 output before FSDP2 casts it to the working dtype) adds each shard into the
  accumulator, and a post-accumulate-grad hook drops FSDP2's cast copy, so gradients are summed
  in fp32 whatever the working dtype;
- after the last micro-batch, the accumulator is reduce-scattered over the replica group, in
  place (`_reduce_scatter_in_place`: the reduced slice is the accumulator's own chunk, no buffer
  of its own): each rank keeps the fp32 sum of its 1/R slice (`_slice`: the flat shard cut into R
  equal chunks, the last ones short or empty). The hook starts each parameter's reduce-scatter as soon as FSDP2 hands
  over its last gradient (async work handles), so they run beside the rest of the backward; the
  step waits for them after it;
- the fp32 master weights of its slice (4/R bytes; with an fp32 working dtype the working shard is
  its own master, and the slice is a view into it) and AdamW's two moments of the slice (8/R).

The step: the gradient norm is summed over every rank's slices (one all-reduce over the world),
the slices are clipped, AdamW updates the master slice, and the updated slices are all-gathered
over the replica group into the working shard, in the working dtype, once a step.

Bytes across racks a step: a reduce-scatter of the fp32 shard plus an all-gather in the working
dtype, which is at most what the ring all-reduce of plain HSDP moves (fp32 both ways).

Numerics: every sum is the one plain HSDP makes, in fp32 (on gloo the reduce-scatter is an
all-reduce of which each rank keeps its slice; with two replicas a sum of two, the same bits);
in bf16 the master slices and the update are fp32, as plain bf16 HSDP's whole fp32 weights are.

Checkpoints hold plain AdamW's keys and full logical tensors: the optimizer's `state_dict` gathers
each moment back to its parameter's shard as a DTensor of the parameter's layout, and, when the
working dtype is not fp32, the model's state dict (a hook) holds the fp32 master weights gathered
the same way, not the working copy; loading (a load pre-hook) puts the fp32 values back into the
master slices. A checkpoint written here loads on any mesh and optimizer, and the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from steps.train.ranks import local as _local


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


def _reduce_scatter_in_place(acc: Tensor, chunk: int, index: int, group: Any) -> tuple[Any, Tensor]:
    """Reduce-scatter the accumulator `acc` (R chunks) over the replica `group` into its own
    chunk `index` (this rank's place in the group): NCCL's in-place form (recvbuff == sendbuff +
    rank * recvcount), as Megatron-Core's distributed optimizer reduce-scatters into its gradient
    buffer, so the reduced slice takes no memory of its own (4/R bytes a parameter less; the
    other chunks of `acc` are left partial, and the next step's first micro-batch overwrites
    them). Returns the work handle and the slice."""
    out = acc[index * chunk:(index + 1) * chunk]
    return dist.reduce_scatter_tensor(out, acc, group=group, async_op=True), out


def _gloo(group: Any) -> bool:
    return dist.get_backend(group) == "gloo"


class ReplicaShards:
    """The replica-sharded state of one FSDP2-sharded model (see the module docstring): master
    slices, fp32 gradient accumulators, the reduced gradient slices of the current step. Built
    once after the model was materialized in fp32 (`shard_over_replicas`)."""

    def __init__(self, model: nn.Module, replicas: Replicas, dtype: torch.dtype) -> None:
        self.replicas, self.dtype = replicas, dtype
        self.names = {p: name for name, p in model.named_parameters()}
        self.params = list(self.names)
        self.bounds = {p: _slice(_local(p).numel(), replicas.size, replicas.index) for p in self.params}
        # fp32, padded to R chunks, allocated here, before the first forward: allocated
        # lazily in the first backward, among the freed activations, they fragment the memory
        self.acc: dict[Tensor, Tensor] = {
            p: torch.zeros(chunk * replicas.size, dtype=torch.float32, device=_local(p).device)
            for p, (_, _, chunk) in self.bounds.items()}
        self.seen: set[Tensor] = set()  # accumulated into this step
        self.grads: dict[Tensor, Tensor] = {}  # this rank's reduced fp32 slice, once the step's backward is done
        self.pending: list[tuple[Tensor, Any, Tensor]] = []
        self.last = True  # the micro-batch running is the step's last: reduce as gradients arrive
        self.separate = any(p.is_floating_point() and p.dtype != dtype for p in self.params)
        # the fp32 master slices: copies when the working dtype is not fp32, else views of the weights
        self.master = {p: self._flat(p)[s:e].detach().float().clone() if self.separate else self._flat(p)[s:e]
                       for p, (s, e, _) in self.bounds.items()}
        if self.separate:
            _cast_parameters(model, dtype)  # FSDP2 re-registers its shards (FSDPModule._apply)
            if [id(p) for p in model.parameters()] != [id(p) for p in self.params]:
                raise RuntimeError("casting the working weights replaced the parameter objects")
            # plain functions: torch marks a public hook with an attribute, which a bound method refuses
            model.register_state_dict_post_hook(lambda *args: self._state_dict_hook(*args))
            model.register_load_state_dict_pre_hook(lambda *args: self._load_hook(*args))
        self._hook_groups(model)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._take_grad)

    @staticmethod
    def _flat(p: Tensor) -> Tensor:
        return _local(p).detach().view(-1)

    # -- gradients --------------------------------------------------------------------------------
    def _hook_groups(self, model: nn.Module) -> None:
        """Take each FSDP2 parameter group's reduce-scattered gradients in their reduce dtype (fp32),
        before FSDP2 casts them to the working dtype: its all-reduce hook (the hook a custom
        replica reduction is meant to use) sees the group's flat output, one padded chunk a
        parameter in the group's order."""
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                for group in module._get_fsdp_state()._fsdp_param_groups:
                    params = [fp.sharded_param for fp in group.fsdp_params]
                    sizes = [fp.padded_sharded_param_size.numel() for fp in group.fsdp_params]
                    group._all_reduce_hook = (lambda out, params=params, sizes=sizes:
                                              self._accumulate(params, sizes, out))

    @torch.no_grad()
    def _accumulate(self, params: list[Tensor], sizes: list[int], reduced: Tensor) -> None:
        """One micro-batch's dp_shard-reduced gradients of a parameter group, in fp32, into the
        accumulators (FSDP2 runs this on its reduce stream, before its cast)."""
        if reduced.numel() != sum(sizes):  # a parameter without a gradient shifts the layout
            raise RuntimeError(f"offload='replicas': a parameter group reduced {reduced.numel()} elements, its "
                               f"{len(params)} parameters' shards hold {sum(sizes)}; every parameter must have a "
                               f"gradient every micro-batch")
        offset = 0
        for p, size in zip(params, sizes):
            n = _local(p).numel()
            grad = reduced[offset:offset + n]
            offset += size
            acc = self.acc[p]
            if p in self.seen:
                acc[:n].add_(grad)
            else:
                acc[:n].copy_(grad)
                self.seen.add(p)

    @torch.no_grad()
    def _take_grad(self, p: Tensor) -> None:
        """FSDP2 has handed over `p`'s gradient shard of one micro-batch, cast to the working
        dtype: dropped (the fp32 sum is in the accumulator); on the last micro-batch, start its
        reduce-scatter over the replicas."""
        p.grad = None
        if p not in self.seen:
            raise RuntimeError(f"offload='replicas': {self.names[p]} got a gradient its group's reduce did not pass on")
        if self.last:
            self._launch(p)

    def _launch(self, p: Tensor) -> None:
        r, acc = self.replicas, self.acc[p]
        start, stop, chunk = self.bounds[p]
        if r.group is None:
            self.pending.append((p, None, acc[start:stop]))
        elif _gloo(r.group):  # gloo has no reduce-scatter of one tensor: all-reduce, keep the slice
            self.pending.append((p, dist.all_reduce(acc, group=r.group, async_op=True), acc[start:stop]))
        else:
            work, out = _reduce_scatter_in_place(acc, chunk, r.index, r.group)
            self.pending.append((p, work, out[:stop - start]))

    def finish(self) -> None:
        """Wait for the step's reduce-scatters; the reduced slices are then `grads`. Every rank of
        a replica group launches the same parameters in the same order (FSDP2's reduce order)."""
        for p, work, out in self.pending:
            if work is not None:
                work.wait()  # the slice is the accumulator's own memory: nothing to hand between streams
            self.grads[p] = out
        self.pending.clear()
        self.seen.clear()

    def clear(self) -> None:
        """Drop the step's gradients (after the update, or when the update is skipped)."""
        self.grads.clear()
        self.seen.clear()
        self.pending.clear()

    def clip(self, max_norm: float, group: Any) -> Tensor:
        """The global L2 norm of the gradients (each rank's slices partition the gradient: the
        squares are summed over `group`, every rank); the slices are scaled to `max_norm` (inf:
        measure only). Returns the norm before clipping, an fp32 tensor."""
        import math

        slices = [self.grads[p] for p in self.params if p in self.grads]
        device = next(iter(self.master.values())).device if self.master else torch.device("cpu")
        square = (torch.stack(torch._foreach_norm(slices, 2.0)).square().sum() if slices
                  else torch.zeros((), dtype=torch.float32, device=device))
        if group is not None:
            dist.all_reduce(square, group=group)
        total = square.sqrt()
        if math.isfinite(max_norm) and slices:
            torch._foreach_mul_(slices, float((max_norm / (total + 1e-6)).clamp(max=1.0)))
        return total

    # -- weights ----------------------------------------------------------------------------------
    @torch.no_grad()
    def publish(self, p: Tensor) -> None:
        """All-gather every replica's updated master slice of `p` into its working shard, in the
        working dtype (a collective over the replica group)."""
        r, flat = self.replicas, self._flat(p)
        start, stop, chunk = self.bounds[p]
        if self.separate:
            flat[start:stop].copy_(self.master[p])
        if r.group is None:
            return
        mine = torch.zeros(chunk, dtype=flat.dtype, device=flat.device)
        mine[:stop - start] = flat[start:stop]
        whole = torch.empty(chunk * r.size, dtype=flat.dtype, device=flat.device)
        if _gloo(r.group):
            dist.all_gather(list(whole.chunk(r.size)), mine, group=r.group)
        else:
            dist.all_gather_into_tensor(whole, mine, group=r.group)
        flat.copy_(whole[:flat.numel()])

    def whole(self, p: Tensor, mine: Tensor) -> Tensor:
        """A slice-sized tensor of `p` (a master slice, a moment) gathered over the replicas into
        the shape of `p`'s shard, as a DTensor of `p`'s layout (a collective)."""
        r, local = self.replicas, _local(p)
        start, stop, chunk = self.bounds[p]
        padded = torch.zeros(chunk * r.size, dtype=mine.dtype, device=mine.device)
        padded[start:stop] = mine
        if r.group is not None:
            piece = padded[r.index * chunk:(r.index + 1) * chunk].clone()
            if _gloo(r.group):
                dist.all_gather(list(padded.chunk(r.size)), piece, group=r.group)
            else:
                dist.all_gather_into_tensor(padded, piece, group=r.group)
        # to the host at once: a save then holds one parameter's gathered shard on the device at a
        # time, not all of them (12 bytes a parameter with the masters, 93 GiB at 535B); the host
        # copy is what an async save's staging makes anyway
        shard = padded[:local.numel()].view(local.shape).cpu()
        if not hasattr(p, "device_mesh"):
            return shard
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(shard, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())

    def _state_dict_hook(self, module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
        """The model's weights as the fp32 masters, not the working copy (every rank calls it)."""
        for p in self.params:
            key = prefix + self.names[p]
            if key in state_dict:
                state_dict[key] = self.whole(p, self.master[p])

    @torch.no_grad()
    def _load_hook(self, module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
        """Loaded weights (fp32 when they came through `_state_dict_hook`'s tensors, possibly on
        the host) into the master slices and, cast, into the working shards; the entry is then
        the parameter itself, so load_state_dict's own copy changes nothing."""
        for p in self.params:
            key = prefix + self.names[p]
            value = state_dict.get(key)
            if value is not None:
                start, stop, _ = self.bounds[p]
                loaded = _local(value).reshape(-1)
                self.master[p].copy_(loaded[start:stop])
                self._flat(p).copy_(loaded)
                state_dict[key] = p.detach()


def _cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """The floating-point parameters to `dtype`, the buffers (rotary tables, expert loads) as they are."""
    model._apply(lambda t: t.to(dtype) if isinstance(t, nn.Parameter) and t.is_floating_point() else t)


def shard_over_replicas(model: nn.Module, replicas: Replicas, precision: str) -> nn.Module:
    """Give an FSDP2-sharded model, materialized in fp32, its replica-sharded state (its working
    weights become bf16 for a bf16 run); returns the model, the state at `model.replica_shards`."""
    model.replica_shards = ReplicaShards(model, replicas, torch.bfloat16 if precision == "bf16" else torch.float32)
    return model


class ReplicaShardedAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay, no amsgrad) over `shards`: the update of each
    parameter is that of its fp32 master slice from its reduced gradient slice, with moments of
    the slice's size; the updated slices are then all-gathered into the working weights."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 shards: ReplicaShards) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False, fused=False)
        self.shards = shards

    def _state_of(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state[p]
        if not state:
            master = self.shards.master[p]
            state["step"] = torch.tensor(0.0, dtype=torch.float32)  # on the CPU, as AdamW keeps it
            state["exp_avg"] = torch.zeros_like(master, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(master, dtype=torch.float32)
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
                grad = self.shards.grads.get(p)
                if grad is None:
                    if p.grad is not None:  # DCP's state init (a step of zero gradients at lr 0)
                        self._state_of(p)
                    continue
                s = self._state_of(p)
                adam([self.shards.master[p]], [grad], [s["exp_avg"]], [s["exp_avg_sq"]], [], [s["step"]],
                     foreach=False, capturable=False, differentiable=False, fused=False, has_complex=False,
                     decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                     weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
                self.shards.publish(p)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self.shards.clear()

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
            sd["state"][idx] = {k: (self.shards.whole(p, v) if k in ("exp_avg", "exp_avg_sq") else v)
                                for k, v in entry.items()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as AdamW does, keeping of each moment only this rank's slice."""
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        slim = {idx: {k: v for k, v in entry.items() if k not in ("exp_avg", "exp_avg_sq")}
                for idx, entry in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": slim})
        for idx, p in zip(ids, params):
            entry = state_dict["state"].get(idx, {})
            start, stop, _ = self.shards.bounds[p]
            master = self.shards.master[p]
            for key in ("exp_avg", "exp_avg_sq"):
                if key in entry:
                    value = _local(entry[key]).to(device=master.device, dtype=torch.float32).reshape(-1)
                    self.state[p][key] = value[start:stop].clone()
