"""The training loop one worker runs, in-process or as a Ray Train worker.

Start-up: find every worker's place and the mesh order (steps/train/topology.py), pick the
parallel component for the mesh (steps/train/parallel.py), build the model on `meta`, shard it
there, allocate it on this worker's device and initialize it by parameter name and seed: no rank
ever holds more than its shards, and the weights are the same on any mesh.

Per optimizer step s (0-based; the checkpoint after it is `step-(s+1)`): read this rank's slice
of global sequences s*B .. s*B+B-1 (its data-parallel rank in the mesh order), forward and
backward each micro-batch (the component decides what each micro-batch's backward reduces),
clip, then the step's loss and gradient norm are checked (one device sync): a non-finite value
ends the attempt (`NonFinite`, no update, no checkpoint); a spike skips the update or rewinds
(steps/train/spikes.py); else AdamW step. Then the scheduler step and one end-of-step path
(`Trainer.end_step`) for an update, a skip and a rewind alike: the expert-bias update (one
all-reduce of the expert loads; an update only), the metrics row when the reporter's cadence
asks for one (rank 0 writes it, with the MoE health of steps/train/health.py:
steps/train/reporting.py), the checkpoint when the saver's cadence asks for one (all ranks; it
counts once it is finite, uploaded and verified: steps/train/saving.py, the cadence in
steps/train/checkpoint_policy.py). A watchdog (steps/train/watchdog.py) ends an attempt whose
steps stop coming. The test knobs (a poisoned stretch, a hang, a kill) are steps/train/faults.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from executor import NonFinite, StepContext
from steps.data.paths import ref
from steps.moe.balance import update_expert_bias
from steps.moe.expert_parallel import take_dropped_layers
from steps.train import checkpoint
from steps.train.checkpoint_policy import CheckpointConfig
from steps.train.config import TrainConfig
from steps.train.data import Batches, Phases
from steps.train.health import Entropy
from steps.train.health import row as health_row
from steps.train.faults import Faults, Killed  # noqa: F401  (Killed: the tests' import)
from steps.train.reporting import Reporter
from steps.train.saving import Saver, on_rank0_under_lease
from steps.train.spikes import DROP, OK, REWIND, SKIP, SpikeGuard
from steps.train.watchdog import Watchdog
from steps.train.parallel import join_mesh, materialize, pick_device, pick_precision, unwrap
from steps.train.tracking import flops_per_token, peak_flops


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did: the learning rate it used, the gradient norm before clipping,
    the spike guard's verdict (OK: updated; SKIP: update dropped; REWIND: back to a checkpoint),
    and whether a metrics row is due after it (its expert loads are then kept for the row)."""

    lr: float
    grad_norm: torch.Tensor
    verdict: str
    logged: bool


@dataclass
class Job:
    """Everything a worker needs; built and checked by the step before training starts."""

    ctx: StepContext
    config: TrainConfig
    phase: str  # "pretrain" or "midtrain"
    model_config: Any  # steps.moe.model.MoEConfig
    manifest: dict[str, Any]  # the mixture
    phases: Phases
    start: int  # first optimizer step of this phase
    end: int  # one past the last
    init_from: str | None  # a checkpoint to start from when the output has none of its own
    workers: int
    cpus_per_worker: float
    created: float  # time.time() when the step built the job (for the startup overhead)
    init_weights_only: bool = False  # init_from holds weights only (import_hf): start this phase fresh from them

    @property
    def parallel(self) -> Any:  # steps.train.config.ParallelConfig
        return self.config.trainer.parallel


def build_model(model_config: Any, seed: int, device: torch.device, parallel: Any = None) -> torch.nn.Module:
    """The MoE built on `meta`, sharded by `parallel` (a steps.train.parallel component; None:
    one process), allocated on `device` and initialized by parameter name and seed, then wrapped
    (DDP) if the component wraps."""
    from steps.moe.model import MoETransformer
    from steps.train.config import ParallelConfig
    from steps.train.parallel import OneProcess

    parallel = parallel or OneProcess(ParallelConfig().resolve(1))
    with torch.device("meta"):
        model = MoETransformer(model_config)
    model = materialize(parallel.parallelize(model), device, seed, offload=parallel.pc.offload == "all")
    return parallel.wrap(model)


def build_optimizer(model: torch.nn.Module, cfg: Any, device: torch.device, offload: str = "none") \
        -> torch.optim.Optimizer:
    """AdamW; matrices decay, norms do not. Two parameter groups whatever the mesh, so an
    optimizer (and scheduler) state saved on one mesh loads on any other. With offload="moments",
    the moments live in host memory (steps/train/offload.py). Else fused on the GPU when every
    parameter lives on one mesh; a plain per-parameter loop when expert parallelism puts the
    experts on a mesh of their own (one multi-tensor kernel cannot span two meshes; a few hundred
    small kernels a step cost milliseconds); on the host when the state is offloaded ("all")."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    flat = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": flat, "weight_decay": 0.0}]
    if offload == "replicas":  # master weights, gradients and moments over dp_replicate (steps/train/replicas.py)
        from steps.train.replicas import ReplicaShardedAdamW

        return ReplicaShardedAdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                   weight_decay=cfg.weight_decay, shards=model.replica_shards)
    if offload == "moments":
        from steps.train.offload import HostMomentsAdamW

        return HostMomentsAdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                weight_decay=cfg.weight_decay)
    one_mesh = len({id(p.device_mesh) for p in model.parameters() if hasattr(p, "device_mesh")}) <= 1
    on_gpu = all(p.device.type == "cuda" for p in model.parameters())
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             fused=on_gpu and one_mesh, foreach=None if one_mesh else False)


def _log_to_stderr(logger: logging.Logger) -> None:
    if not logging.getLogger("marin").handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        logging.getLogger("marin").addHandler(handler)
    logging.getLogger("marin").setLevel(logging.INFO)


class Trainer:
    """One worker's share of a phase: built from a Job, resumed, then `train()`."""

    def __init__(self, job: Job) -> None:
        self.job, self.cfg, self.tcfg, self.ctx = job, job.config, job.config.trainer, job.ctx
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.main = self.rank == 0
        self.device = pick_device(self.tcfg.device)
        self.threads = max(1, int(job.cpus_per_worker))
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)
        torch.manual_seed(self.tcfg.seed)
        had_group = dist.is_initialized()
        precision = pick_precision(self.tcfg.precision, self.device)
        pc = self.tcfg.parallel.validate(self.world, job.model_config, self.cfg.data.batch_size, self.tcfg.microbatch)
        self.parallel, self.places, self.order = join_mesh(pc, self.device, precision)
        self.pc = pc
        self.own_group = dist.is_initialized() and not had_group  # bf16 on one worker: a group of one
        self.model = build_model(job.model_config, self.tcfg.seed, self.device, self.parallel)
        self.layers = unwrap(self.model).moe_layers()
        self.optimizer = build_optimizer(unwrap(self.model), self.cfg.optimizer, self.device, pc.offload)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, self.cfg.optimizer.schedule(job.phases.total, job.phases.switch))
        self.context = job.phases.seq_len - 1
        self.step = job.start
        self.tokens = job.start * self.cfg.data.batch_size * self.context
        self.batches = Batches(job.manifest, self.cfg.data.batch_size, self.parallel.data_rank, pc.dp,
                               self.tcfg.microbatch)
        self.flops = flops_per_token(job.model_config, self.context)
        self.peak = (self.tcfg.peak_flops or peak_flops(str(self.device), self.threads)) * self.world
        self.spikes = SpikeGuard(self.cfg.optimizer.spikes)
        self.drop_share_max = 0.0  # the largest share of assignments dropped in a metrics row of this attempt
        self.saver = Saver(self.ctx.output, CheckpointConfig.of(self.tcfg, job.end),
                           async_save=self.tcfg.async_checkpoint, device=self.device, fence=self.ctx.fenced)
        self.entropy = Entropy(self.layers)
        self.faults = Faults.of(self.tcfg, self.ctx.attempt, job.model_config.vocab_size)
        self.rewinds: list[float] = []  # seconds from detection to training again, per rewind
        self.refused: set[int] = set()  # checkpoint steps that failed verification in this attempt
        self.trained = 0  # optimizer steps of this attempt that were not rewound over
        self.started = time.time()
        self.report: Reporter | None = None  # built when training starts
        self.furthest = job.start  # the furthest step reached (progress)

    def resume(self) -> None:
        """From this step's own newest checkpoint that verifies (an older one when the newest is
        refused), else from `init_from` (midtrain), else fresh."""
        # a superseded attempt of this lineage may be mid-save here: only the lease's holder deletes
        on_rank0_under_lease(self.ctx.fenced, "removing unfinished checkpoints", lambda: checkpoint.remove_incomplete(self.ctx.output))
        own = checkpoint.list_checkpoints(self.ctx.output)
        if not own and self.job.init_from is not None and self.job.init_weights_only:
            # imported weights: a fresh optimizer, the run's schedule at this phase's start
            from steps.export.from_hf import start_schedule_at

            checkpoint.load(self.job.init_from, self.model, None)
            start_schedule_at(self.scheduler, self.step)
        if not own and (self.job.init_from is None or self.job.init_weights_only):
            torch.manual_seed(self.tcfg.seed * 1_000_003 + self.rank + 1)  # nothing samples today
            return
        candidates = own or [checkpoint.SavedCheckpoint(checkpoint.step_of(self.job.init_from) or 0, self.job.init_from)]
        restored = self.restore(candidates)
        if restored is None:
            raise checkpoint.CorruptCheckpoint(
                f"no checkpoint of {self.ctx.output if own else self.job.init_from} verifies (refused: "
                f"{', '.join(f'step-{n}' for n in sorted(self.refused))}; the lines above say why); delete them to "
                f"start over")
        source, state = restored
        self.step, self.tokens = state["step"], state["tokens"]
        self.spikes.load_state_dict(state.get("spikes") or {})
        if self.step < self.job.start:
            raise RuntimeError(f"checkpoint {source.url} is at step {self.step}, before this phase's first step "
                               f"{self.job.start}")
        if self.main:
            self.ctx.logger.info("%s: resumed from %s (step %d)", self.ctx.name, source.url, self.step)

    def restore(self, candidates: list[checkpoint.SavedCheckpoint]) -> tuple[checkpoint.SavedCheckpoint, dict[str, Any]] | None:
        """Load the newest of `candidates` that verifies (model, optimizer, scheduler, RNG) and
        return it with its train state; None when none does. A refused checkpoint is said in one
        line and never tried again by this attempt (until it is saved anew)."""
        loaded = None  # a refused state already copied into the model
        for found in reversed(candidates):
            if found.step in self.refused:
                continue
            try:
                state = checkpoint.load(found.url, self.model, self.optimizer)
            except checkpoint.CorruptCheckpoint as e:
                self.refused.add(found.step)
                loaded = e if e.loaded else loaded
                if self.main:
                    self.ctx.logger.error("%s: %s; falling back to an older checkpoint", self.ctx.name, e)
                continue
            self.scheduler.load_state_dict(state["scheduler"])
            checkpoint.restore_rng(state, self.rank)
            return found, state
        if loaded is not None:  # the model holds the refused state now: this attempt cannot go on
            raise loaded
        return None

    def train_step(self, health: bool = False) -> StepResult:
        """One optimizer step; adds (ce, router loss, 1) per micro-batch to the report's sums.
        Raises NonFinite, before any update, when the loss or the gradient norm is not finite. A
        step whose data a rewind dropped reads nothing and only moves the schedule (DROP)."""
        self.faults.before_step(self.step)
        if self.spikes.dropping(self.step) or self.faults.dropped(self.step):
            lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()
            return StepResult(lr, torch.zeros(()), DROP, False)
        micro = self.faults.batch(self.step, self.batches.step(self.step))
        # the mean over micro-batches, and over ranks when the component sums gradients (FSDP)
        divisor = len(micro) * self.parallel.loss_divisor
        step_ce = torch.zeros((), device=self.device)
        sums = self.report.sums
        with self.entropy if health else contextlib.nullcontext():
            for i, rows in enumerate(micro):
                seq = torch.from_numpy(rows).to(self.device, non_blocking=True)
                with self.parallel.sync(self.model, last=i == len(micro) - 1):
                    ce, router_loss = self.model(seq[:, :-1], seq[:, 1:])  # the head fused with the loss, chunked
                    ((ce + router_loss) / divisor).backward()
                sums += torch.stack([ce.detach(), router_loss.detach().float(), torch.ones((), device=self.device)])
                step_ce += ce.detach()
        lr = self.scheduler.get_last_lr()[0]
        clip = self.cfg.optimizer.grad_clip or math.inf
        grad_norm = self.parallel.clip_grad_norm(self.model, clip)
        step_loss = step_ce / len(micro)
        if dist.is_initialized():  # every rank decides the same: the mean over data-parallel ranks
            dist.all_reduce(step_loss)
            step_loss = step_loss / self.world
        loss, norm = torch.stack([step_loss.float(), torch.as_tensor(grad_norm).float().to(self.device)]).tolist()
        if not (math.isfinite(loss) and math.isfinite(norm)):
            raise NonFinite(f"step {self.step}: loss {loss}, gradient norm {norm}: no update made, no checkpoint "
                            f"written from it")
        verdict = self.spikes.observe(self.step, loss, norm)
        if verdict == OK:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if verdict != REWIND:
            self.scheduler.step()
        return StepResult(lr, grad_norm, verdict, health)

    def end_step(self, result: StepResult, watchdog: Watchdog, progress: Any) -> None:
        """After every optimizer step, whatever the guard decided: the expert bias (moved by an
        update only), the counters, the metrics row, the checkpoint the saver's cadence asks for,
        and the fault knobs. A rewind goes back to a checkpoint and returns; a rewind with
        nothing to go back to ends as a skipped update; a dropped step makes no row."""
        load_LE = torch.stack([m.expert_load_E for m in self.layers]).clone() if result.logged else None
        verdict = result.verdict
        if verdict == REWIND:
            with watchdog.paused():
                went_back = self.rewind()
            if went_back:
                self.report.restart(self.tokens)
                return
            verdict = SKIP
        self.balance(updated=verdict == OK)
        self.trained += 1
        if verdict != DROP:  # a dropped step's data was never read
            self.tokens += self.cfg.data.batch_size * self.context
        self.step += 1
        if self.step > self.furthest:  # steps trained again after a rewind are not progress
            progress.update(self.step - self.furthest)
            self.furthest = self.step
        if result.logged and result.verdict == verdict != DROP:
            rate = self.report.rate(self.tokens)
            row = self.metrics_row(load_LE, result.lr, result.grad_norm, rate)
            self.report.write(row, progress.line())
            self.watch_drops(row)
        if self.saver.due(self.step):
            with watchdog.paused():
                self.save()
            self.report.flush()
        self.saver.poll()
        self.faults.after_step(self.trained, self.step, self.job.end)

    def watch_drops(self, row: dict[str, Any]) -> None:
        """The largest share of token-expert assignments a capacity dropped in a row of this
        attempt; a warning above `trainer.moe_drop_warn`."""
        self.drop_share_max = max(self.drop_share_max, row["moe_dropped_share"])
        warn = self.tcfg.moe_drop_warn
        if self.main and warn and row["moe_dropped_share"] > warn:
            worst = row["health"].get("dropped_share", [])
            self.ctx.logger.warning(
                "%s: %.3f%% of the token-expert assignments dropped by the capacity in the %d steps to %d "
                "(trainer.moe_drop_warn %.3f%%); the worst layer %s", self.ctx.name, 100 * row["moe_dropped_share"],
                self.tcfg.log_every, self.step, 100 * warn,
                f"{worst.index(max(worst))} at {100 * max(worst):.3f}%" if worst else "-")

    def balance(self, updated: bool) -> None:
        """The expert-bias update from the loads counted in this step; a skipped update moves no
        bias either (its loads are dropped)."""
        if updated:
            update_expert_bias(self.layers, self.job.model_config.bias_update_rate)
        else:
            for m in self.layers:
                m.expert_load_E.zero_()

    def rewind(self) -> bool:
        """A sustained spike at this step (steps/train/spikes.py): back to the newest verified
        checkpoint at or before the first step whose data is dropped, to train again from there
        (the guard drops the data of the lead-in and the outliers when training reaches them).
        False when there is nothing to go back to: the outlier stays a skipped update."""
        t0 = time.perf_counter()
        spike, first = self.step, self.spikes.drop_from()
        self.saver.finish()
        good = [f for f in checkpoint.list_checkpoints(self.ctx.output) if f.step <= first]
        if not good and self.job.init_from is not None and not self.job.init_weights_only:
            good = [checkpoint.SavedCheckpoint(checkpoint.step_of(self.job.init_from) or 0, self.job.init_from)]
        restored = self.restore(good)  # never a checkpoint that failed verification
        if restored is None:  # nothing to go back to: the outliers stay skipped updates
            self.spikes.not_rewound("no checkpoint before the spike to rewind to" if not good else
                                    "no verified checkpoint before the spike to rewind to")
            self.scheduler.step()
            return False
        state = restored[1]
        to_step = state["step"]
        self.spikes.rewound(to_step, spike)
        self.step, self.tokens = to_step, state["tokens"]  # the scheduler is the checkpoint's
        for m in self.layers:  # the loads counted since the checkpoint are trained again or dropped
            m.expert_load_E.zero_()
        self.rewinds.append(time.perf_counter() - t0)
        if self.main:
            self.ctx.logger.warning("%s: sustained spike at step %d: rewound to step-%d; steps %d..%d are trained "
                                    "again, the data of steps %d..%d dropped", self.ctx.name, spike, to_step, to_step,
                                    first - 1, first, spike)
        return True

    def metrics_row(self, load_LE: torch.Tensor, lr: float, grad_norm: torch.Tensor, rate: float) -> dict[str, Any]:
        """The metrics.jsonl row (a collective when distributed: every rank calls it)."""
        sums = self.report.sums
        if dist.is_initialized():
            dist.all_reduce(sums)
            dist.all_reduce(load_LE)
        share_LE = load_LE / load_LE.sum(-1, keepdim=True).clamp_min(1)
        # [layer, (routed, dropped)] past the rank or the per-expert capacity
        drops_L2 = take_dropped_layers(self.layers).float()
        if dist.is_initialized():
            dist.all_reduce(drops_L2)
        drops = drops_L2.sum(0)
        norm = grad_norm
        events = [e.as_dict() for e in self.spikes.events if e.step >= self.step - self.tcfg.log_every]
        return {"step": self.step, "loss": (sums[0] / sums[2]).item(), "router_loss": (sums[1] / sums[2]).item(),
                "lr": lr, "grad_norm": float(norm), "tokens_per_s": rate, "mfu": rate * self.flops / self.peak,
                "expert_load_max": share_LE.max().item(), "expert_load_min": share_LE.min().item(),
                "bias_norm": torch.stack([m.expert_bias_E for m in self.layers]).norm().item(),
                "moe_dropped": int(drops[1]), "moe_dropped_share": (drops[1] / drops[0].clamp_min(1)).item(),
                "tokens": self.tokens, "time": time.time(), "phase": self.job.phase,
                "health": health_row(load_LE, self.layers, self.entropy.mean(), drops_L2),
                **({"events": events} if events else {})}

    def save(self) -> None:
        job, cfg, row, started = self.job, self.cfg, self.report.row, self.started
        self.refused.discard(self.step)  # saved anew
        train = {"step": self.step, "tokens": self.tokens, "scheduler": self.scheduler.state_dict(),
                 "data": {"next_sequence": self.step * cfg.data.batch_size, "batch_size": cfg.data.batch_size},
                 "spikes": self.spikes.state_dict()}
        meta = {"step": self.step, "tokens": self.tokens, "phase": job.phase,
                "model": dataclasses.asdict(job.model_config),
                "mixture": ref(self.ctx, cfg.data.mixture, checkpoint.folder(self.ctx.output, self.step)),
                "batch_size": cfg.data.batch_size, "seq_len": job.phases.seq_len,
                "total_steps": job.phases.total, "switch_step": job.phases.switch, "world_size": self.world,
                "mesh": dataclasses.asdict(self.pc),
                "spike_events": [e.as_dict() for e in self.spikes.events]}
        # what varies from run to run (timings, the nodes) is a log, out of the output digest
        run = {"metrics": row, "startup_s": started - job.created, "time": time.time(),
               "mesh": {**dataclasses.asdict(self.pc), "ranks": self.order,
                        "places": [self.places[r].as_dict() for r in self.order]}}
        self.saver.save(self.step, self.model, self.optimizer, train, meta, run)

    def train(self) -> dict[str, Any]:
        """Steps until the phase's end; returns the last metrics row plus timings."""
        job, ctx = self.job, self.ctx
        self.started = time.time()
        self.report = Reporter(ctx, self.tcfg, main=self.main, step=self.step, final_step=job.end, tokens=self.tokens,
                               device=self.device, run_config={"phase": job.phase, "config": _plain(self.cfg),
                                                               "model": dataclasses.asdict(job.model_config)})
        if self.main:
            ctx.logger.info("%s: %s steps %d..%d on %d worker(s), %s; ready %.1fs after the step started", ctx.name,
                            job.phase, self.step, job.end, self.world, self.device, self.started - job.created)
        self.model.train()
        self.furthest = self.step
        progress_of = ctx.progress if self.main else _SilentProgress
        hang_log = ctx.path(f"logs/hang-attempt{ctx.attempt}-rank{self.rank}.txt")
        try:
            with progress_of(total=job.end - self.step, unit="step", desc=f"{ctx.name} ({job.phase})") as progress, \
                    Watchdog(self.tcfg.watchdog, hang_log, f", rank {self.rank}") as watchdog:
                while self.step < job.end:
                    result = self.train_step(health=self.report.due(self.step))
                    watchdog.beat()
                    self.end_step(result, watchdog, progress)
            self.saver.finish()  # the last upload counts before the attempt ends
        finally:
            self.report.close()
        return {**self.report.row, "startup_s": self.started - job.created, "train_s": time.time() - self.started,
                "steps_run": self.trained, "checkpoint_stall_s": self.saver.stalls, "rewind_s": self.rewinds,
                "moe_dropped_share_max": self.drop_share_max}

    def close(self) -> None:
        if self.own_group:
            dist.destroy_process_group()


class _SilentProgress:
    """The progress reporter of ranks other than 0: one line per step, not per rank."""

    def __init__(self, **_: Any) -> None:
        pass

    def __enter__(self) -> "_SilentProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def line(self) -> str:
        return ""


def run(job: Job) -> dict[str, Any]:
    """Train one phase on this worker; returns rank 0's last metrics row and timings."""
    _log_to_stderr(job.ctx.logger)
    trainer = Trainer(job)
    try:
        trainer.resume()
        return trainer.train()
    finally:
        trainer.close()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
