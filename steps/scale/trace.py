"""Activation memory measured, not assumed: one block's forward and backward traced under
`FakeTensorMode` (shapes and dtypes, no data, no memory) at the real micro-batch, counting the
bytes of every storage the ops create while it is alive.

What a block keeps for its backward is what is still alive after its forward, less its output
(the next block's input) and plus its input (which every checkpointing mode keeps). Its
backward's working set is the peak above that while its backward runs: the recomputed forward
(under checkpointing), activation gradients, the incoming and outgoing gradients, and the
gradients of its own parameters (bf16, this rank's shards: FSDP2 frees them only after the
block's reduce-scatter). Storages that existed before the trace (parameters, the gathered
weights, the input) are not counted as created.

Expert parallelism is traced through the real all-to-all path (steps/moe/expert_parallel.py) in
a fake process group: the one host sync of that path (the split sizes) returns even splits of the
rank's N = T*K token-expert slots, the balanced load; the imbalance headroom is added by the plan.

The CPU kernels decide what is saved here: RMSNorm is the composite of its fp32 parts on the
CPU (the fused CUDA kernel keeps only its input and one fp32 per row), so the figures are an
upper bound for the GPU by that much (docs/training.md, "The plan").
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages created by ops under it while they are alive, and their
    peak. Views share their base's storage, so they add nothing."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._sizes: dict[int, int] = {}
        # kept alive, so that their ids stay unique
        self._ignored = {id(p.untyped_storage()): p.untyped_storage() for t in existing for p in _plain_tensors(t)}
        self.now = 0
        self.peak = 0
        self._created = 0

    def reset_peak(self) -> None:
        self.peak = self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                for plain in _plain_tensors(t):
                    self._add(plain.untyped_storage())
        return out

    def _add(self, storage) -> None:
        key = id(storage)
        if key in self._ignored or key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self._created += size
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.now -= self._sizes.pop(key, 0)

    def bytes_of(self, *tensors: torch.Tensor) -> int:
        """Bytes of the distinct storages of `tensors` that this mode counts."""
        seen = {id(p.untyped_storage()): p for t in tensors for p in _plain_tensors(t)}
        return sum(self._sizes.get(k, 0) for k in seen)

    def created_total(self) -> int:
        """Bytes of every storage created so far, freed or not (work done, not memory held)."""
        return self._created


def _plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that own memory: a wrapper subclass (a DTensor) by its inner tensors, whose
    ops this mode does not see (they run inside the subclass's own dispatch)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = (getattr(t, name) for name in names)
    return [p for i in inner if isinstance(i, torch.Tensor) for p in _plain_tensors(i)]


@dataclass(frozen=True)
class BlockTrace:
    """One block's activation bytes at a micro-batch, under one checkpointing mode."""

    layer: int
    tokens: int  # T: micro-batch x context, on this rank
    kept: int  # held from the block's forward to its backward, its input included
    working: int  # peak above `kept` while the block's backward runs
    backward_created: int  # bytes of all storages created by the backward (recompute included)


@dataclass(frozen=True)
class HeadTrace:
    """The final norm, output head and cross-entropy, forward and backward (the model's own loss
    code, run on a model without blocks)."""

    tokens: int
    peak: int  # the most bytes alive at once, logits and their gradients included


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """A fake process group of `world_size` ranks with this process as `rank` (torch's fake
    backend: collectives do nothing, meshes and DTensor shards have their real shapes)."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized; the plan needs its own fake one")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _even_splits(slots: int, ranks: int) -> Iterator[None]:
    """Answer the all-to-all path's one host sync (the rows sent to and received from each rank,
    a `tolist()` of a [2P] integer tensor: expert_parallel._splits) with even splits of `slots`
    both ways: fake tensors have no values to sync."""
    from torch._subclasses.fake_tensor import FakeTensor

    original = FakeTensor.tolist
    base, extra = divmod(slots, ranks)

    def tolist(self):
        if self.dim() == 1 and self.numel() == 2 * ranks and not self.dtype.is_floating_point:
            return [base + (i < extra) for i in range(ranks)] * 2
        return original(self)

    FakeTensor.tolist = tolist
    try:
        yield
    finally:
        FakeTensor.tolist = original


def trace_block(cfg, layer: int, microbatch: int, context: int, checkpointing: str, ep_mesh=None) -> BlockTrace:
    """Forward and backward of block `layer` of `cfg` on `microbatch` sequences of `context`
    tokens, its weights in bf16 as FSDP2 gathers them, its routed experts sharded over `ep_mesh`
    (a 1-D DeviceMesh of a fake process group) when given."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from steps.moe.model import Block, rope_tables
    from steps.train.recompute import context_fn

    ep = ep_mesh.size() if ep_mesh is not None else 1
    tokens = microbatch * context
    with FakeTensorMode():
        with _default_dtype(torch.bfloat16):
            block = Block(cfg, layer)
        if ep > 1:
            from steps.moe.expert_parallel import shard_experts

            shard_experts(block.moe, ep_mesh)
        block.recompute = context_fn(checkpointing)
        x = torch.empty(microbatch, context, cfg.dim, dtype=torch.bfloat16, requires_grad=True)
        cos, sin = rope_tables(context, cfg.head_dim, cfg.rope_theta, "cpu")
        params = [p.to_local() if hasattr(p, "to_local") else p for p in block.parameters()]
        live = LiveBytes(existing=[x, cos, sin, *params, *block.buffers()])
        with _even_splits(tokens * cfg.top_k, ep), live:
            y, loss = block(x, cos, sin)
            out = live.bytes_of(y, loss)
            kept = live.now - out
            dy = torch.empty_like(y)
            live.reset_peak()
            before = live.created_total()
            torch.autograd.backward([y, loss], [dy, torch.ones_like(loss)])
            working = live.peak - out - kept
            created = live.created_total() - before
    return BlockTrace(layer=layer, tokens=tokens, kept=kept + x.nbytes, working=working, backward_created=created)


def trace_head(cfg, microbatch: int, context: int) -> HeadTrace:
    """The model without blocks (embedding, final norm, head, loss) on `microbatch` sequences:
    the peak of its forward and backward, weights in bf16, less the embedding's output (the first
    block's input, which the blocks' figures already hold)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from steps.moe.model import MoETransformer

    with FakeTensorMode():
        with _default_dtype(torch.bfloat16):
            model = MoETransformer(dataclasses.replace(cfg, n_layers=0))
        model.embed.weight.requires_grad_(False)  # its backward comes at the very end, on its own
        tokens = torch.zeros(microbatch, context, dtype=torch.long)
        live = LiveBytes(existing=[tokens, *model.parameters()])
        with live:
            loss, _ = model.loss(tokens, tokens)
            loss.backward()
    embedded = microbatch * context * cfg.dim * 2
    return HeadTrace(tokens=microbatch * context, peak=live.peak - embedded)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)
