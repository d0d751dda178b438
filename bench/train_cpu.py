"""CPU training throughput of the tiny preset: one worker in-process vs two Ray Train workers.

    .venv/bin/python -m bench.train_cpu                 # 150 steps of 32 x 64 tokens each way
    .venv/bin/python -m bench.train_cpu --steps 300 --ray-defaults   # Ray Train's own settings

All runs train the same batches: one worker in-process with one torch thread, one worker with
all the cores as threads, and two Ray Train workers over gloo DDP with half the cores each. Tokens/s is the mean of the metrics rows
after the first (steady state); startup is the time from the step's start to the first batch
(for Ray Train: the worker group, the process group, and importing torch in each worker);
wall is the whole step, checkpoints included.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import json
import logging
import os
import pathlib
import shutil
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

from executor import Resources  # noqa: E402

from executor.testing import build_context
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, mixture  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer  # noqa: E402
from steps.train.config import (DataConfig, ModelSpec, OptimizerConfig, ParallelConfig, TrackerConfig,  # noqa: E402
                                TrainConfig, TrainerConfig)
from steps.train.pretrain import pretrain  # noqa: E402


def run(name, fn, config, work, resources=None):
    ctx = build_context(str(work / name), name=name, digest=(name * 64)[:64], resources=resources or Resources())
    t = time.perf_counter()
    fn(config, ctx)
    return ctx, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=65)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    p.add_argument("--ray-defaults", action="store_true", help="keep Ray Train's own polling and watchers")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.ray_defaults:
        from steps.train import launch

        launch.RAY_TRAIN_ENV.clear()
    work = pathlib.Path(tempfile.mkdtemp(prefix="marin-bench-train-"))
    corpus = ROOT / "data/corpus"
    raw = run("raw", ingest, IngestConfig(input=str(corpus / "kjv.jsonl.zst")), work)[0].output
    tok = run("tok", train_tokenizer, TrainTokenizerConfig(documents=raw, vocab_size=512, max_documents=300), work)[0].output
    tokens = run("tokens", tokenize, TokenizeConfig(documents=raw, tokenizer=tok, bos=None, eos="<|eos|>"), work)[0].output
    mix = run("mix", mixture, MixtureConfig(datasets={"kjv": tokens}, weights={"kjv": 1.0}, seq_len=args.seq_len,
                                            token_budget=args.steps * args.batch * args.seq_len, block_size=256), work)[0].output
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=args.batch), model=ModelSpec("tiny"),
                      optimizer=OptimizerConfig(lr=1e-2, warmup_steps=20),
                      trainer=TrainerConfig(log_every=10, checkpoint_every=50, tracker=TrackerConfig(kind="none"),
                                            parallel=ParallelConfig(dp_replicate=-1, dp_shard=1)))  # DDP

    import ray

    ray.init(num_cpus=args.cores, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rows = []
    for workers, cpus in ((1, 1), (1, args.cores), (2, args.cores / 2)):
        name = f"train-{workers}x{cpus:g}"
        ctx, wall = run(name, pretrain, cfg, work, Resources(cpus=cpus, workers=workers))
        metrics = [json.loads(line) for line in open(work / name / "metrics.jsonl")]
        steady = [m["tokens_per_s"] for m in metrics[1:]] or [metrics[0]["tokens_per_s"]]
        rows.append({"workers": workers, "threads_each": max(1, int(cpus)),
                     "tokens_per_s": sum(steady) / len(steady), "startup_s": ctx.results["startup_s"],
                     "wall_s": wall, "final_loss": metrics[-1]["loss"]})
    ray.shutdown()
    print(f"tiny preset, {args.steps} steps of {args.batch} x {args.seq_len - 1} tokens, {args.cores} cores"
          f"{' (Ray Train defaults)' if args.ray_defaults else ''}")
    heads = [f"{r['workers']}w x {r['threads_each']}t" for r in rows]
    print(f"{'':>14} " + " ".join(f"{h:>12}" for h in heads) + f" {'2w / 1w':>8}")
    formats = (("tokens_per_s", "{:12.0f}"), ("startup_s", "{:12.1f}"), ("wall_s", "{:12.1f}"),
               ("final_loss", "{:12.4f}"))
    for key, fmt in formats:
        ratio = rows[2][key] / rows[1][key] if rows[1][key] else float("nan")
        print(f"{key:>14} " + " ".join(fmt.format(r[key]) for r in rows) + f" {ratio:8.2f}")
    print(json.dumps(rows))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
