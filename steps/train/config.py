"""The training configs: `data`, `model`, `optimizer` and `trainer` (run mechanics only), and the
learning-rate schedule. Torch-free: a voyage builds these without importing torch.

    TrainConfig(data=DataConfig(mixture=output_of(mix), batch_size=32),
                model=ModelSpec("tiny"),
                optimizer=OptimizerConfig(lr=3e-3, warmup_steps=30),
                trainer=TrainerConfig(checkpoint_every=100))

Everything in `trainer` but the seed is run-only (left out of the step's digest): worker counts,
the mesh (`trainer.parallel`), micro-batches, checkpoint cadence, logging and W&B change how a run
goes, not what it computes (docs/design.md, "The mesh is run-only").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from executor import InputPath, VoyageError, run_only
from steps.train.spikes import SpikeConfig
from steps.train.watchdog import WatchdogConfig

CHECKPOINTING = ("none", "selective", "full")
OFFLOAD = ("none", "moments", "all", "replicas")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
TRACKERS = ("wandb", "none")


@dataclass(frozen=True)
class ModelSpec:
    """A preset of `steps.moe.model.PRESETS`, with `overrides` of MoEConfig fields.

    `vocab_size` None takes the vocabulary of the mixture's tokenizer; a number must equal it.
    """

    preset: str = "tiny"
    vocab_size: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "vocab_size" in self.overrides:
            raise VoyageError("model.overrides: set model.vocab_size, not overrides['vocab_size']")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise VoyageError(f"model.vocab_size must be positive, got {self.vocab_size}")

    def build_config(self, vocab_size: int):  # -> steps.moe.model.MoEConfig (imports torch)
        """The MoEConfig this spec names, with the given vocabulary."""
        from steps.moe.model import PRESETS, MoEConfig

        if self.preset not in PRESETS:
            raise VoyageError(f"model.preset: unknown preset {self.preset!r}; known: {sorted(PRESETS)}")
        known = {f.name for f in dataclasses.fields(MoEConfig)}
        unknown = sorted(set(self.overrides) - known)
        if unknown:
            raise VoyageError(f"model.overrides: {unknown} are not MoEConfig fields")
        try:
            return dataclasses.replace(PRESETS[self.preset], vocab_size=vocab_size, **self.overrides)
        except (TypeError, ValueError) as e:
            raise VoyageError(f"model.overrides: {e}") from e


@dataclass(frozen=True)
class DataConfig:
    """What to train on: a mixture step's output, read `batch_size` sequences per optimizer step.

    A sequence of the mixture (`seq_len` tokens) gives `seq_len - 1` inputs and their shifted
    targets. Pretrain reads every stage but the last (all of them if there is only one),
    midtrain the last; a step whose batch straddles the switch belongs to midtrain.
    """

    mixture: InputPath
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise VoyageError(f"data.batch_size must be positive, got {self.batch_size}")


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW, with linear warmup, a constant phase, and a linear decay to `min_lr_ratio * lr`.

    The schedule spans the whole mixture (pretrain and midtrain together). `decay_fraction` is the
    share of all steps, at the end, spent decaying; None decays over the last mixture stage (the
    midtrain stage) when there are several, and right after warmup when there is one.
    """

    lr: float = 3e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 100
    decay_fraction: float | None = None
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    spikes: SpikeConfig = field(default_factory=SpikeConfig)  # skip / rewind (steps/train/spikes.py)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise VoyageError(f"optimizer.lr must be positive, got {self.lr}")
        if self.warmup_steps < 0:
            raise VoyageError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.decay_fraction is not None and not 0 <= self.decay_fraction <= 1:
            raise VoyageError(f"optimizer.decay_fraction must lie in [0, 1], got {self.decay_fraction}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise VoyageError(f"optimizer.min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise VoyageError(f"optimizer.grad_clip must be >= 0, got {self.grad_clip}")

    def schedule(self, total_steps: int, switch_step: int) -> "Schedule":
        """The schedule of a run of `total_steps`, whose last stage starts at `switch_step`."""
        warmup = min(self.warmup_steps, total_steps)
        if self.decay_fraction is not None:
            decay_start = total_steps - round(self.decay_fraction * total_steps)
        elif 0 < switch_step < total_steps:
            decay_start = switch_step
        else:
            decay_start = warmup
        return Schedule(warmup, max(decay_start, warmup), total_steps, self.min_lr_ratio)


@dataclass(frozen=True)
class Schedule:
    """The multiplier of the peak learning rate for optimizer step s (0-based):
    (s + 1) / warmup during warmup, 1 until `decay_start`, then linear down to `floor` at the
    last step."""

    warmup: int
    decay_start: int
    total: int
    floor: float

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if step < self.decay_start or self.total <= self.decay_start:
            return 1.0
        done = min(step - self.decay_start + 1, self.total - self.decay_start)
        return 1.0 - (1.0 - self.floor) * done / (self.total - self.decay_start)


@dataclass(frozen=True)
class TrackerConfig:
    """W&B (`kind="wandb"`), offline unless WANDB_API_KEY is set or `mode` says otherwise;
    `kind="none"` tracks nothing (metrics.jsonl is written either way)."""

    kind: str = "wandb"
    project: str = "marin-voyage"
    entity: str | None = None
    mode: str | None = None  # "online", "offline", "disabled"; None: online iff WANDB_API_KEY is set
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in TRACKERS:
            raise VoyageError(f"trainer.tracker.kind must be one of {TRACKERS}, got {self.kind!r}")


@dataclass(frozen=True)
class ParallelConfig:
    """How the workers of a training step are arranged: a data-parallel mesh of `dp_replicate`
    replicas x `dp_shard` shards (FSDP2 inside a replica group, HSDP when both exceed one), with
    the routed experts spread over `ep` of the `dp_shard` ranks (expert parallelism borrows its
    ranks from dp_shard: each expert shard is FSDP-sharded again over dp_shard / ep ranks), and
    activation checkpointing per block.

    One of `dp_replicate` and `dp_shard` may be -1: all the workers the other leaves. The default
    is FSDP over every worker; `ParallelConfig(dp_replicate=-1, dp_shard=1)` is plain data
    parallelism (DDP in fp32). The 535B plan (steps/scale): `ParallelConfig(dp_replicate=11,
    dp_shard=64, ep=64, checkpointing="selective", offload="moments")` on 704 workers, one 64-GPU
    expert mesh per rack, as the anchor's mesh (whose checkpointing is not published).

    `offload="moments"` (the anchor's choice at 535B) keeps the two AdamW moments of each rank's
    shards in pinned host memory and streams them through the device one parameter at a time for
    the update (steps/train/offload.py); weights and gradients stay on the device.
    `offload="replicas"` keeps nothing on the host: the fp32 master weights, the gradients and the
    AdamW moments are sharded over the `dp_replicate` replicas as well (a distributed optimizer,
    steps/train/replicas.py), the working weights in the compute dtype (bf16 on the GPU):
    gradients summed in fp32 and reduce-scattered across replicas instead of all-reduced, each
    rank updating its master slice and the working weights all-gathered once a step.
    `offload="all"` keeps the fp32 weight shards, their gradients and the AdamW state on the host
    (FSDP2's CPUOffloadPolicy): weights are copied to the device for each all-gather, gradients
    back after each reduce-scatter, and the optimizer step runs on the CPU. Neither is measured
    on a GPU yet; on the CPU "moments" is bitwise plain AdamW.

    Torch-free; `resolve` and `validate` check a mesh against a world size, a model and a batch
    (steps.train.parallel builds it). Run-only as a whole (docs/design.md)."""

    dp_replicate: int = 1
    dp_shard: int = -1
    ep: int = 1
    checkpointing: str = "none"  # "none", "selective" (save matmul and all-to-all outputs), "full"
    offload: str = "none"  # "moments": AdamW moments in host memory; "all": weights, gradients too;
    # "replicas": fp32 masters, gradients and moments sharded over dp_replicate (no host memory)

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard"):
            value = getattr(self, name)
            if value == 0 or value < -1:
                raise VoyageError(f"trainer.parallel.{name} must be >= 1 or -1 (the rest), got {value}")
        if self.dp_replicate == -1 and self.dp_shard == -1:
            raise VoyageError("trainer.parallel: only one of dp_replicate and dp_shard may be -1 (the rest)")
        if self.ep < 1:
            raise VoyageError(f"trainer.parallel.ep must be >= 1, got {self.ep}")
        if self.checkpointing not in CHECKPOINTING:
            raise VoyageError(f"trainer.parallel.checkpointing must be one of {CHECKPOINTING}, "
                              f"got {self.checkpointing!r}")
        if self.offload not in OFFLOAD:
            raise VoyageError(f"trainer.parallel.offload must be one of {OFFLOAD}, got {self.offload!r}")

    def resolve(self, world_size: int) -> "ParallelConfig":
        """The same mesh with -1 replaced by what `world_size` workers leave; a VoyageError when
        the degrees do not multiply to the world size or ep does not divide dp_shard."""
        rep, shard = self.dp_replicate, self.dp_shard
        if rep == -1 or shard == -1:
            known = shard if rep == -1 else rep
            if world_size % known:
                raise VoyageError(f"trainer.parallel: {self.describe()} does not divide the step's {world_size} "
                                  f"workers (trainer.workers / Resources.workers)")
            rep, shard = (world_size // known, shard) if rep == -1 else (rep, world_size // known)
        if rep * shard != world_size:
            raise VoyageError(f"trainer.parallel: dp_replicate {rep} x dp_shard {shard} = {rep * shard} ranks, but "
                              f"the step has {world_size} workers (trainer.workers / Resources.workers)")
        if shard % self.ep:
            raise VoyageError(f"trainer.parallel.ep: {self.ep} does not divide dp_shard {shard} (expert "
                              f"parallelism borrows its ranks from dp_shard)")
        return dataclasses.replace(self, dp_replicate=rep, dp_shard=shard)

    def validate(self, world_size: int, model: Any = None, batch_size: int | None = None,
                 microbatch: int = 0, ranks_per_rack: int | None = None) -> "ParallelConfig":
        """`resolve`, then check the mesh against a model (its routed experts must divide over
        `ep`), a batch (whole sequences on every data-parallel rank, micro-batches that divide
        them) and, when given, the ranks of one rack (an `ep` group must stay inside one). Returns
        the resolved config; raises one VoyageError naming what does not divide."""
        pc = self.resolve(world_size)
        if model is not None and model.n_experts % pc.ep:
            raise VoyageError(f"trainer.parallel.ep: {pc.ep} does not divide the model's {model.n_experts} routed "
                              f"experts")
        if ranks_per_rack is not None and ranks_per_rack % pc.ep:
            raise VoyageError(f"trainer.parallel.ep: {pc.ep} does not divide the {ranks_per_rack} training ranks of "
                              f"a rack, so an expert-parallel group would cross racks")
        if batch_size is not None:
            from steps.train.data import check_batch

            check_batch(batch_size, pc, microbatch)
        return pc

    @property
    def dp(self) -> int:
        """Data-parallel ranks (each reads its own slice of the batch); needs a resolved config."""
        return self.dp_replicate * self.dp_shard

    @property
    def efsdp(self) -> int:
        """Ranks that FSDP-shard one expert shard (dp_shard / ep); needs a resolved config."""
        return self.dp_shard // self.ep

    def describe(self) -> str:
        """The mesh in words, for errors and logs: `dp_replicate 11 x dp_shard 64 (ep 64)`."""
        text = f"dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard}".replace("-1", "(rest)")
        return text + (f" (ep {self.ep} inside dp_shard)" if self.ep > 1 else "")


@dataclass(frozen=True)
class TrainerConfig:
    """Run mechanics. Only `seed` enters the step's identity."""

    seed: int = 0
    workers: int = run_only(default=0)  # 0: the step's Resources.workers
    microbatch: int = run_only(default=0)  # sequences per worker per forward; 0: the worker's whole share
    parallel: ParallelConfig = run_only(default_factory=ParallelConfig)  # the mesh
    device: str = run_only(default="auto")  # "auto": cuda when available
    precision: str = run_only(default="auto")  # "auto": bf16 on the GPU (FSDP2 policy), fp32 on the CPU
    checkpoint_every: int = run_only(default=100)
    keep_last: int = run_only(default=2)
    permanent_every: int = run_only(default=0)  # also keep every checkpoint at a multiple of this
    log_every: int = run_only(default=10)
    # warn (the step's log) when a metrics row drops more than this share of the token-expert
    # assignments past a capacity; 0: never (the anchor dropped 0.018% at capacity 1.15)
    moe_drop_warn: float = run_only(default=0.01)
    tracker: TrackerConfig = run_only(default_factory=TrackerConfig)
    peak_flops: float = run_only(default=0.0)  # per worker, for MFU; 0: looked up from the device
    fail_after_steps: int = run_only(default=0)  # tests: raise after this many steps of this attempt
    # a reference loss curve for the live page: a CSV/JSON of tokens and loss, or another training
    # step's output (relative: under the prefix); steps/train/tracking.py
    reference_curve: str = run_only(default="")
    async_checkpoint: bool = run_only(default=False)  # upload in the background (steps/train/saving.py)
    watchdog: WatchdogConfig = run_only(default_factory=WatchdogConfig)  # the hang bound (steps/train/watchdog.py)
    hang_at_step: int = run_only(default=-1)  # tests: block forever in this optimizer step, on attempt 1 only
    poison_steps: tuple[int, int] = run_only(default=(0, 0))  # tests: random tokens in steps [a, b)
    # tests and benchmarks: these optimizer steps read no data and make no update (the schedule
    # moves on), as the guard's dropped steps (bench/train_poison.py's same-steps control)
    drop_steps: tuple[int, ...] = run_only(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.parallel, ParallelConfig):
            raise VoyageError(f"trainer.parallel must be a ParallelConfig, got {self.parallel!r}")
        if self.precision not in PRECISIONS:
            raise VoyageError(f"trainer.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.device not in DEVICES:
            raise VoyageError(f"trainer.device must be one of {DEVICES}, got {self.device!r}")
        for name in ("workers", "microbatch", "permanent_every", "fail_after_steps"):
            if getattr(self, name) < 0:
                raise VoyageError(f"trainer.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.moe_drop_warn <= 1:
            raise VoyageError(f"trainer.moe_drop_warn must lie in [0, 1], got {self.moe_drop_warn}")
        for name in ("checkpoint_every", "keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise VoyageError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class TrainConfig:
    """One training step: pretrain from scratch, or midtrain from `init_from` (the output of a
    pretrain step: `output_of(pretrain_step)`; or of an `import_hf` step, whose weights start
    midtraining with a fresh optimizer: steps/export/from_hf.py)."""

    data: DataConfig
    model: ModelSpec = field(default_factory=ModelSpec)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    init_from: InputPath | None = None
    # A ladder's law to be held against (docs/ladder.md): the output of a `ladder_fit` step or of
    # a `ladder_predict` step (a sealed prediction: the target of a ladder takes its own, so its
    # identity includes the prediction). The record then says how far the step's final training
    # loss lies from the law at its compute ("+2.1% above the law at 3e15 FLOPs").
    law: InputPath | None = None
