"""`pretrain` and `midtrain`: the step types that train the MoE on a mixture (docs/training.md).

    pre = Step("pretrain", pretrain, TrainConfig(data=DataConfig(mixture=output_of(mix))),
               resources=Resources(cpus=1, workers=2))
    mid = Step("midtrain", midtrain, dataclasses.replace(pre.config, init_from=output_of(pre)))

Both are resumable: an attempt that died leaves its checkpoints in the output, and the next one
resumes from the newest. Everything that can be wrong with the input (tokenizer vs model
vocabulary, a checkpoint of another shape, a batch or mesh that does not divide across workers) is
checked here, before any worker starts, and raised as one VoyageError naming the field.
"""

from __future__ import annotations

import time

from executor import StepContext, VoyageError, step_type
from steps.data.mixture import consumption
from steps.train.checkpoint_policy import newest_problem
from steps.train.config import TrainConfig
from steps.train.data import check_vocab, phases, read_mixture
from steps.train.spikes import SpikeEvent, skipped_ranges
from steps.train.tracking import METRICS_FILE, run_links, write_reference

# The training steps' logs: out of their output digest (W&B, the metrics rows, and each
# checkpoint's run.json: timings and nodes), so an identical rerun cuts off downstream.
# logs/: the watchdog's stacks; wandb_run.json: which W&B run (its URL when online).
LOGS = ("wandb/**", "wandb_run.json", "metrics.jsonl", "checkpoints/*/run.json", "logs/**", "reference_curve.json")


@step_type(version="1", resumable=True, logs=LOGS, check_output=newest_problem)
def pretrain(config: TrainConfig, ctx: StepContext) -> None:
    """Train the MoE from scratch on every mixture stage but the last (all, if only one)."""
    if config.init_from is not None:
        raise VoyageError("init_from: pretrain starts from scratch; use the midtrain step type to continue "
                          "from a checkpoint")
    _train(config, ctx, "pretrain")


@step_type(version="1", resumable=True, logs=LOGS, check_output=newest_problem)
def midtrain(config: TrainConfig, ctx: StepContext) -> None:
    """Continue a pretrain step's run (`init_from`) on the mixture's last stage, through the
    decay phase of the schedule."""
    if config.init_from is None:
        raise VoyageError("init_from: midtrain needs the pretrain step to continue from (output_of(pretrain_step))")
    _train(config, ctx, "midtrain")


def prepare(config: TrainConfig, ctx: StepContext, phase: str):  # -> steps.train.loop.Job
    """Read and check everything before training: the mixture, the vocabulary, the batch split,
    the checkpoint to start from. Imports torch."""
    from steps.train import checkpoint
    from steps.train.loop import Job

    created = time.time()
    manifest = read_mixture(config.data.mixture)
    steps = phases(manifest, config.data.batch_size)
    start, end = steps.range_of(phase)
    if phase == "midtrain" and len(manifest["stages"]) < 2:
        raise VoyageError("data.mixture: midtrain reads the mixture's last stage, but the mixture has one stage")
    if end <= start:
        raise VoyageError(f"data.mixture: the {phase} phase has no steps at batch size {config.data.batch_size} "
                          f"(steps {start}..{end})")
    vocab = check_vocab(config.model.vocab_size, manifest)
    model_config = config.model.build_config(vocab)
    workers = config.trainer.workers or ctx.resources.workers
    config.trainer.parallel.validate(workers, model_config, config.data.batch_size, config.trainer.microbatch)

    init_from, weights_only = None, False
    if phase == "midtrain":
        found = checkpoint.resolve(config.init_from, "init_from")
        meta = checkpoint.read_meta(found.url)
        weights_only = bool(meta.get("weights_only"))  # an import_hf output: weights, no run to continue
        if weights_only:
            from steps.export.from_hf import check_weights_only

            check_weights_only(meta, model_config, "init_from")
        elif meta.get("batch_size") != config.data.batch_size:
            raise VoyageError(f"data.batch_size: {config.data.batch_size}, but the checkpoint at init_from was "
                              f"trained with {meta.get('batch_size')}")
        if found.step != start and not weights_only:
            raise VoyageError(f"init_from: the checkpoint is at step {found.step}, but this mixture's midtrain "
                              f"stage starts at step {start} (batch size {config.data.batch_size})")
        checkpoint.check_shapes(found.url, model_config, "init_from")
        init_from = found.url
    own = checkpoint.list_checkpoints(ctx.output)
    if own:
        checkpoint.check_shapes(own[-1].url, model_config, "model")
    return Job(ctx=ctx, config=config, phase=phase, model_config=model_config, manifest=manifest, phases=steps,
               start=start, end=end, init_from=init_from, workers=workers, cpus_per_worker=ctx.resources.cpus,
               created=created, init_weights_only=weights_only)


def _train(config: TrainConfig, ctx: StepContext, phase: str) -> None:
    from steps.moe.model import count_params
    from steps.train import checkpoint
    from steps.train.launch import launch

    job = prepare(config, ctx, phase)
    law = None
    if config.law is not None:  # read before training: a bad reference fails here, not after the run
        from steps.ladder.steps import read_law

        law = read_law(config.law)
    with ctx.fenced("writing the reference curve"):  # a superseded attempt of the lineage stops here
        write_reference(config.trainer.reference_curve, ctx.output)  # for the live page; a bad URL fails here
    total, active = count_params(job.model_config)
    ctx.results.update(phase=phase, workers=job.workers, start_step=job.start, end_step=job.end,
                       total_steps=job.phases.total, params=total, active_params=active)
    started = time.time()
    timings = launch(job) or {}  # in-process: the loop's own timings (Ray Train workers keep theirs)
    if timings.get("checkpoint_stall_s"):
        ctx.results["checkpoint_stall_s"] = [round(x, 4) for x in timings["checkpoint_stall_s"]]
    if timings.get("rewind_s"):
        ctx.results["rewind_s"] = [round(x, 4) for x in timings["rewind_s"]]
    drops = _drop_shares(ctx.path(METRICS_FILE), job.start, job.end)
    if drops:  # the largest share of assignments a capacity dropped in a metrics row
        ctx.results["moe_dropped_share_max"] = max(drops)
    final = checkpoint.list_checkpoints(ctx.output)[-1]
    meta, run = checkpoint.read_meta(final.url), checkpoint.read_run(final.url)
    row = run.get("metrics") or {}
    # Exact tokens per source and licence: the mixture's sequences of the optimizer steps this
    # output's checkpoints trained on (steps.data.provenance), not the declared weights.
    batch = config.data.batch_size
    ctx.provenance["tokens"] = dict(consumption(job.manifest, job.start * batch, final.step * batch),
                                    steps=[job.start, final.step])
    # The spike guard's skips and rewinds of this phase (steps/train/spikes.py): in the record, and
    # the optimizer steps whose data was read but never trained on for --which-saw.
    events = [e for e in map(SpikeEvent.from_dict, meta.get("spike_events") or []) if job.start <= e.step < job.end]
    if events:
        ctx.results["spike_events"] = [e.as_dict() for e in events]
        ctx.provenance["tokens"]["skipped_steps"] = [list(r) for r in skipped_ranges(events)]
    ctx.results.update(final_step=final.step, checkpoint=final.url, tokens=meta["tokens"],
                       **{k: row[k] for k in ("loss", "grad_norm", "tokens_per_s", "mfu", "moe_dropped",
                                              "moe_dropped_share") if k in row},
                       startup_s=run.get("startup_s"), wall_s=time.time() - started)
    ctx.results.update(run_links(ctx.output))  # the W&B run, its URL when online (the logbook page links it)
    if law is not None and "loss" in row:  # the run against a ladder's law (docs/ladder.md)
        from steps.ladder.steps import against_law
        from steps.moe.config import flops_per_token

        compute = flops_per_token(job.model_config, job.manifest["seq_len"] - 1) * meta["tokens"]
        ctx.results["law"] = against_law(law, compute, float(row["loss"]))


def _drop_shares(url: str, start: int, end: int) -> list[float]:
    """moe_dropped_share of the metrics rows of steps (start, end] (empty: no file, no rows)."""
    import json

    import fsspec

    try:
        with fsspec.open(url, "r") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [r["moe_dropped_share"] for r in rows if start < r.get("step", -1) <= end and "moe_dropped_share" in r]
