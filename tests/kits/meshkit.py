"""Helpers of the mesh tests: run a pretrain job's Trainer on N spawned gloo processes (or in this
process) and write, from rank 0, the full state dicts it had at the moments the tests compare:
right after it was built (`init.pt`), right after it resumed from a checkpoint (`resumed.pt`),
after its last step (`final.pt`), and a checkpoint loaded into a fresh model on the same mesh after training (`loaded.pt`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

from executor import Resources

from executor.testing import build_context
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, ParallelConfig, TrackerConfig, TrainConfig, \
    TrainerConfig


def config(mix: str, pc: ParallelConfig, microbatch: int = 0, **trainer) -> TrainConfig:
    """20 steps of 16 sequences of the tiny preset, a metrics row every step."""
    return TrainConfig(data=DataConfig(mixture=mix, batch_size=16), model=ModelSpec("tiny"),
                       optimizer=OptimizerConfig(lr=1e-2, warmup_steps=5),
                       trainer=TrainerConfig(log_every=1, checkpoint_every=10, keep_last=5, microbatch=microbatch,
                                             parallel=pc, tracker=TrackerConfig(kind="none"), **trainer))


def job_of(cfg: TrainConfig, output: str, workers: int):
    from steps.train.pretrain import prepare

    ctx = build_context(output, name="mesh", digest="m" * 64, resources=Resources(cpus=1, workers=workers))
    return prepare(cfg, ctx, "pretrain")


def dump(model, path: str) -> None:
    """The full (unsharded) state dict of `model`, written by rank 0 (a collective)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from steps.train.parallel import unwrap

    model = unwrap(model)
    if dist.is_initialized():
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(state, path)


def mesh_run(job, out: str, load: str | None = None) -> None:
    """Build the job's Trainer, dump its initial state, resume (dump again if it resumed from a
    checkpoint), train to the phase's end, then optionally load `load` into a fresh model on the
    same mesh and dump it."""
    from steps.train import checkpoint
    from steps.train.loop import Trainer, build_model

    os.makedirs(out, exist_ok=True)
    trainer = Trainer(job)
    try:
        dump(trainer.model, f"{out}/init.pt")
        trainer.resume()
        if trainer.step > job.start:
            dump(trainer.model, f"{out}/resumed.pt")
        trainer.train()
        dump(trainer.model, f"{out}/final.pt")
        if load:
            model = build_model(job.model_config, job.config.trainer.seed, trainer.device, trainer.parallel)
            checkpoint.load(load, model, None)
            dump(model, f"{out}/loaded.pt")
    finally:
        trainer.close()


def run_mesh(cfg: TrainConfig, output: str, workers: int, load: str | None = None) -> str:
    """`mesh_run` on `workers` spawned processes (in this process for one); returns the output."""
    from steps.train.launch import spawn

    job = job_of(cfg, output, workers)
    if workers == 1:
        mesh_run(job, f"{output}/dumps", load)
    else:
        spawn(mesh_run, (job, f"{output}/dumps", load), workers)
    return output


def losses(output: str) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{output}/metrics.jsonl"))}


def metric(output: str, name: str) -> dict[int, float]:
    return {r["step"]: r[name] for r in map(json.loads, open(f"{output}/metrics.jsonl"))}


def seed_checkpoint(source: str, step: int, output: str) -> None:
    """Start `output` from `source`'s checkpoint at `step` (as if it had saved it itself)."""
    shutil.copytree(f"{source}/checkpoints/step-{step}", f"{output}/checkpoints/step-{step}")


def replace_pc(cfg: TrainConfig, pc: ParallelConfig, **trainer) -> TrainConfig:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, parallel=pc, **trainer))


def run_eval(trained: str, output: str, workers: int, pc: ParallelConfig) -> dict:
    """The eval step's scoring of `trained`'s newest checkpoint on `workers` spawned processes
    (in this process for one) sharded by `pc`; returns results.json."""
    from steps.eval.evaluate import EvalConfig, prepare, score
    from steps.train.launch import spawn

    ctx = build_context(output, name="eval", digest="e" * 64, resources=Resources(cpus=1, workers=workers))
    job = prepare(EvalConfig(checkpoint=trained, max_sequences=24, batch_size=5, parallel=pc), ctx)
    if workers == 1:
        score(job)
    else:
        spawn(score, (job,), workers)
    return json.load(open(f"{output}/results.json"))
