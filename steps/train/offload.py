"""AdamW with its moments in host memory: the anchor's optimizer offload.

Parameters and gradients stay on the device; each parameter's two moments (exp_avg, exp_avg_sq,
fp32, the shape of its local shard) live in pinned host memory. `step()` streams them to the
device one parameter at a time, runs torch's own AdamW update there (the functional
`torch.optim.adam.adam` with decoupled weight decay: the same arithmetic as `torch.optim.AdamW`'s
single-tensor path), and streams them back. On CUDA the copies run on a side stream, double
buffered: parameter i+1's moments travel to the device while parameter i updates, and i's go
back while i+1 updates, so the device holds the moments of two parameters at a time (at 535B
on EP64 x DP11: 2 x 2 x 226 MB for an expert weight, instead of 66.7 GB of moments per GPU). On
the CPU nothing moves and the numbers are bitwise those of `torch.optim.AdamW`.

State and checkpoints: `state[p]` holds `step` (a CPU scalar, as AdamW keeps it) and the moments,
as DTensors with the parameter's layout whose local tensors live on the host, so
`torch.distributed.checkpoint` saves the same full logical tensors under the same keys as for an
on-device AdamW: a checkpoint written with the offload loads without it and the other way round.
A load puts the moments straight into (pinned) host memory, never through the device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import _get_scalar_dtype

from steps.train.ranks import local as _local


def _like_param(local: Tensor, p: Tensor) -> Tensor:
    """`local` (host memory) as a DTensor of `p`'s layout when `p` is one, without moving it to
    the mesh's device (DTensor.from_local would)."""
    if not hasattr(p, "device_mesh"):
        return local
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    spec = DTensorSpec(p.device_mesh, p.placements, tensor_meta=TensorMeta(p.shape, p.stride(), local.dtype))
    return DTensor(local, spec, requires_grad=False)


class HostMomentsAdamW(torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay, no amsgrad) whose moments live in host memory
    and visit the device one parameter at a time."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False, fused=False)
        self._copy_stream = None

    def _host_zeros(self, p: Tensor) -> Tensor:
        local = _local(p)
        pin = local.is_cuda
        return _like_param(torch.zeros(local.shape, dtype=local.dtype, pin_memory=pin), p)

    def _state_of(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())  # on the CPU, as AdamW keeps it
            state["exp_avg"] = self._host_zeros(p)
            state["exp_avg_sq"] = self._host_zeros(p)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            todo = [p for p in group["params"] if p.grad is not None]
            self._update(group, todo)
        return loss

    def _update(self, group: dict[str, Any], params: list[Tensor]) -> None:
        from torch.optim.adam import adam

        beta1, beta2 = group["betas"]

        def apply(p: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor) -> None:
            adam([_local(p)], [_local(p.grad)], [exp_avg], [exp_avg_sq], [], [step], foreach=False,
                 capturable=False, differentiable=False, fused=False, has_complex=False,
                 decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                 weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

        states = [self._state_of(p) for p in params]
        cuda = [p for p in params if _local(p).is_cuda]
        if not cuda:  # nothing to move: the host tensors are the working ones
            for p, s in zip(params, states):
                apply(p, _local(s["exp_avg"]), _local(s["exp_avg_sq"]), s["step"])
            return
        copy = self._copy_stream = self._copy_stream or torch.cuda.Stream()
        compute = torch.cuda.current_stream()

        def upload(s: dict[str, Tensor], device: torch.device):
            with torch.cuda.stream(copy):
                moments = [_local(s[k]).to(device, non_blocking=True) for k in ("exp_avg", "exp_avg_sq")]
                ready = torch.cuda.Event()
                ready.record(copy)
            return moments, ready

        pending = upload(states[0], _local(params[0]).device)
        for i, (p, s) in enumerate(zip(params, states)):
            (exp_avg, exp_avg_sq), ready = pending
            if i + 1 < len(params):
                pending = upload(states[i + 1], _local(params[i + 1]).device)
            compute.wait_event(ready)
            for t in (exp_avg, exp_avg_sq):
                t.record_stream(compute)
            apply(p, exp_avg, exp_avg_sq, s["step"])
            done = torch.cuda.Event()
            done.record(compute)
            with torch.cuda.stream(copy):
                copy.wait_event(done)
                _local(s["exp_avg"]).copy_(exp_avg, non_blocking=True)
                _local(s["exp_avg_sq"]).copy_(exp_avg_sq, non_blocking=True)
        copy.synchronize()  # the host moments are final before anyone reads them

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as AdamW does, except that the moments go straight to (pinned) host memory:
        AdamW's own load would first put them on the parameters' device, 66.7 GB per GPU at
        535B. After `torch.distributed.checkpoint` filled this optimizer's own host tensors in
        place, nothing moves at all."""
        moments: dict[Any, dict[str, Tensor]] = {}
        slim: dict[Any, dict[str, Any]] = {}
        for idx, entry in state_dict["state"].items():
            moments[idx] = {k: v for k, v in entry.items() if k in ("exp_avg", "exp_avg_sq")}
            slim[idx] = {k: v for k, v in entry.items() if k not in moments[idx]}
        super().load_state_dict({**state_dict, "state": slim})
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for idx, p in zip(ids, params):
            for key, value in moments.get(idx, {}).items():
                local = _local(value).to(device="cpu", dtype=_local(p).dtype)
                if _local(p).is_cuda and not local.is_pinned():
                    local = local.pin_memory()
                self.state[p][key] = _like_param(local, p)
