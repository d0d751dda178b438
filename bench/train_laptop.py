"""The laptop recipe, end to end in one process: the bundled corpus -> tokenizer -> tokenize ->
mixture (pretrain stage, midtrain stage) -> pretrain -> midtrain -> eval, timing each step and
printing the held-out loss beside the unigram baseline (docs/training.md, "Laptop settings").

    .venv/bin/python -m bench.train_laptop                      # the recipe
    .venv/bin/python -m bench.train_laptop --steps 200 --lr 3e-3  # a variant

The step functions run in-process (no Ray, no executor), so the times are the steps' own work;
under marin-run add Ray's start (a few seconds) and the executor's bookkeeping.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import dataclasses
import json
import logging
import pathlib
import shutil
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

from executor import Resources  # noqa: E402

from executor.testing import build_context
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, MixtureStage, mixture  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer  # noqa: E402
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from steps.train.pretrain import midtrain, pretrain  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--steps", type=int, default=400, help="optimizer steps, pretrain and midtrain together")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=65, help="mixture sequence: context + 1")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--cpus", type=float, default=2, help="torch threads of the one worker")
    p.add_argument("--tracker", default="none", choices=("none", "wandb"))
    p.add_argument("--workdir", default="")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="marin-laptop-"))
    shutil.rmtree(work, ignore_errors=True)
    times: dict[str, float] = {}

    def run(name, fn, config, resources=None):
        ctx = build_context(str(work / name), name=name, digest=(name * 64)[:64], resources=resources or Resources())
        t = time.perf_counter()
        fn(config, ctx)
        times[name] = time.perf_counter() - t
        return ctx

    corpus = ROOT / "data/corpus"
    raw = {n: run(f"raw-{n}", ingest, IngestConfig(input=str(corpus / f"{n}.jsonl.zst"))).output for n in ("kjv", "pydocs")}
    tok = run("tokenizer", train_tokenizer, TrainTokenizerConfig(documents=str(work / "raw-*/documents/*.jsonl.zst"),
                                                                  vocab_size=args.vocab)).output
    toks = {n: run(f"tokens-{n}", tokenize, TokenizeConfig(documents=raw[n], tokenizer=tok, bos=None,
                                                             eos="<|eos|>")).output for n in raw}
    budget = args.steps * args.batch * args.seq_len
    mix = run("mixture", mixture, MixtureConfig(
        datasets=toks, token_budget=budget, seq_len=args.seq_len, block_size=256,
        stages=(MixtureStage(0.8, {"kjv": 0.6, "pydocs": 0.4}), MixtureStage(0.2, {"kjv": 0.3, "pydocs": 0.7})))).output
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=args.batch), model=ModelSpec(args.preset),
                      optimizer=OptimizerConfig(lr=args.lr, warmup_steps=args.warmup, min_lr_ratio=0.1),
                      trainer=TrainerConfig(log_every=25, checkpoint_every=100, tracker=TrackerConfig(kind=args.tracker)))
    res = Resources(cpus=args.cpus)
    pre = run("pretrain", pretrain, cfg, res)
    mid = run("midtrain", midtrain, dataclasses.replace(cfg, init_from=pre.output), res)
    ev = run("eval", evaluate, EvalConfig(checkpoint=mid.output))
    out = {"args": vars(args), "seconds": {k: round(v, 2) for k, v in times.items()},
           "train_seconds": round(times["pretrain"] + times["midtrain"], 2), "total_seconds": round(sum(times.values()), 2),
           "pretrain_loss": pre.results.get("loss"), "midtrain_loss": mid.results.get("loss"),
           "tokens_per_s": mid.results.get("tokens_per_s"),
           "eval": {k: ev.results[k] for k in ("loss", "unigram_loss", "bpb", "unigram_bpb")},
           "eval_datasets": {n: {k: round(v, 4) for k, v in d.items() if isinstance(v, float)}
                             for n, d in ev.results["datasets"].items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
