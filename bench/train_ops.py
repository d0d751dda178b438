"""The trainer's operations figures, on the laptop recipe on CPU:

    .venv/bin/python -m bench.train_ops stall      # checkpoint stall: sync vs async, plain and slow store
    .venv/bin/python -m bench.train_ops recover    # detection -> training again: watchdog and rewind
    .venv/bin/python -m bench.train_ops health     # MoE health metrics' cost per step, tiny and small

stall: the laptop recipe (tiny preset, 32 x 64 tokens a step, one thread) for `--steps` steps
with a checkpoint every 10, saved synchronously and asynchronously (steps/train/saving.py), on
the local disk and on a store with `--latency` seconds injected per data file written (the
`slow://` filesystem of tests/kits/slowfs.py). Stall = the seconds the training thread
spent in `save()` (for async: staging into host memory, plus waiting for the previous upload if
it is still running); median over the run's saves.

recover: a watchdog hang (an attempt blocked in step 12 with a 2 s bound): seconds from the
watchdog firing (the stacks written) to the first optimizer step of the next attempt, run
in-process right away (the executor's retry backoff, 1 s by default for a hang, and a Ray task's
start come on top); and a rewind (a poisoned stretch): seconds from the detection to training
again, as the trainer measures it (`rewind_s`).

health: per-step CPU time of `train_step` with and without the MoE health metrics (router
entropy hooks, load/bias statistics), interleaved in one process; the cost per step at the
default `log_every` (10) is the difference divided by 10. The small preset (dim 1024, 12 layers,
64 experts) runs 4 sequences a step by default so that one thread finishes in minutes.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import dataclasses
import json
import logging
import os
import pathlib
import shutil
import statistics
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

from executor import Hang  # noqa: E402

from executor.testing import build_context
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, mixture  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer  # noqa: E402
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.train.pretrain import pretrain  # noqa: E402
from steps.train.spikes import SpikeConfig  # noqa: E402
from steps.train.watchdog import WatchdogConfig  # noqa: E402


def run(name, fn, config, out, attempt=1):
    ctx = build_context(str(out), name=name, digest=(name * 64)[:64], attempt=attempt)
    t = time.perf_counter()
    fn(config, ctx)
    return ctx, time.perf_counter() - t


def make_mix(work: pathlib.Path, steps: int, batch: int = 32, seq_len: int = 65) -> str:
    corpus = ROOT / "data/corpus"
    raw = run("raw", ingest, IngestConfig(input=str(corpus / "kjv.jsonl.zst")), work / "raw")[0].output
    tok = run("tok", train_tokenizer, TrainTokenizerConfig(documents=raw, vocab_size=512, max_documents=300),
              work / "tok")[0].output
    tokens = run("tokens", tokenize, TokenizeConfig(documents=raw, tokenizer=tok, bos=None, eos="<|eos|>"),
                 work / "tokens")[0].output
    return run("mix", mixture, MixtureConfig(datasets={"kjv": tokens}, weights={"kjv": 1.0}, seq_len=seq_len,
                                             token_budget=steps * batch * seq_len, block_size=256), work / "mix")[0].output


def config(mix: str, preset: str = "tiny", batch: int = 32, **trainer) -> TrainConfig:
    base = dict(log_every=10, checkpoint_every=10, keep_last=2, tracker=TrackerConfig(kind="none"))
    return TrainConfig(data=DataConfig(mixture=mix, batch_size=batch), model=ModelSpec(preset),
                       optimizer=OptimizerConfig(lr=1e-2, warmup_steps=30, spikes=SpikeConfig(z=0)),
                       trainer=TrainerConfig(**{**base, **trainer}))


def stall(args, work: pathlib.Path) -> None:
    from kits import slowfs

    slowfs.register()
    mix = make_mix(work, args.steps)
    rows = []
    for store, latency in (("local disk", 0.0), (f"+{args.latency:g} s a file", args.latency)):
        os.environ["SLOW_WRITE_S"] = str(latency)
        for mode in ("sync", "async"):
            out = work / f"stall-{mode}-{latency}"
            ctx, wall = run("pre", pretrain, config(mix, async_checkpoint=mode == "async"), f"slow://{out}")
            stalls = ctx.results["checkpoint_stall_s"]
            rows.append({"store": store, "mode": mode, "saves": len(stalls), "stall_median_s": statistics.median(stalls),
                         "stall_total_s": sum(stalls), "wall_s": wall})
    print(f"laptop recipe (tiny, 32 x 64 tokens), {args.steps} steps, a checkpoint every 10, one thread")
    print(f"{'store':>16} {'mode':>6} {'saves':>6} {'stall median s':>15} {'stall total s':>14} {'wall s':>8}")
    for r in rows:
        print(f"{r['store']:>16} {r['mode']:>6} {r['saves']:>6} {r['stall_median_s']:>15.3f} {r['stall_total_s']:>14.2f} "
              f"{r['wall_s']:>8.1f}")
    for store in dict.fromkeys(r["store"] for r in rows):
        s, a = (next(r for r in rows if r["store"] == store and r["mode"] == m) for m in ("sync", "async"))
        print(f"{store}: async / sync stall {a['stall_median_s'] / s['stall_median_s']:.2f}x")
    print(json.dumps(rows))


def recover(args, work: pathlib.Path) -> None:
    mix = make_mix(work, 60)
    out = work / "hang"
    cfg = config(mix, log_every=1, hang_at_step=12, watchdog=WatchdogConfig(timeout_s=2.0, first_step_s=60.0, grace_s=30.0))
    try:
        run("pre", pretrain, cfg, out, attempt=1)
    except Hang:
        pass
    fired = os.path.getmtime(out / "logs/hang-attempt1-rank0.txt")
    n_before = sum(1 for _ in open(out / "metrics.jsonl"))
    run("pre", pretrain, cfg, out, attempt=2)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    first_again = rows[min(n_before, len(rows) - 1)]  # the first row of the resumed attempt (rows cut back to step 10)
    resumed = next(r["time"] for r in rows if r["step"] == 11)
    watchdog_s = resumed - fired
    poisoned = dataclasses.replace(cfg, optimizer=dataclasses.replace(
        cfg.optimizer, spikes=SpikeConfig(z=4.0, window=12, min_samples=8, sustained=3)),
        # six poisoned steps: 2 x sustained outliers in a row, which the guard rewinds (three are skipped one by one)
        trainer=dataclasses.replace(cfg.trainer, hang_at_step=-1, poison_steps=(25, 31)))
    ctx, _ = run("pre", pretrain, poisoned, work / "rewind")
    print("laptop recipe (tiny, 32 x 64 tokens), one thread")
    print(f"watchdog (bound 2 s): stacks written -> first step of the resumed attempt: {watchdog_s:.2f} s "
          f"(in-process; the executor's backoff and a Ray task start come on top)")
    print(f"rewind: detection -> training again: {', '.join(f'{x:.3f}' for x in ctx.results.get('rewind_s', []))} s "
          f"({len(ctx.results['spike_events'])} events)")
    print(json.dumps({"watchdog_s": watchdog_s, "rewind_s": ctx.results.get("rewind_s", []), "first_row": first_again["step"]}))


def health(args, work: pathlib.Path) -> None:
    import torch

    from steps.train import health as health_mod
    from steps.train.health import row as health_row
    from steps.train.loop import Trainer
    from steps.train.pretrain import prepare

    # The difference of two step times is as noisy as the step (a few % on a loaded machine), so
    # the health work is also timed directly: process time inside the entropy hooks and `row`.
    spent = [0.0]
    hook_of = health_mod.Entropy._hook

    def timed_hook(self, i):
        inner = hook_of(self, i)

        def hook(*a):
            t = time.process_time()
            inner(*a)
            spent[0] += time.process_time() - t
        return hook

    health_mod.Entropy._hook = timed_hook
    mix = make_mix(work, 400)
    torch.set_num_threads(1)
    print(f"MoE health metrics per step, CPU, one thread, {args.reps} x {args.block} steps each way, interleaved; "
          f"batch {args.batch} x 64 tokens (small: {args.small_batch})")
    print(f"{'preset':>7} {'step ms':>9} {'+health ms':>11} {'per logged step':>16} {'per step (log_every 10)':>24}"
          f" {'direct ms':>10} {'direct share':>13}")
    for preset in ("tiny", "small"):
        ctx = build_context(str(work / f"health-{preset}"), name="h", digest="h" * 64)
        job = prepare(config(mix, preset, args.batch if preset == "tiny" else args.small_batch), ctx, "pretrain")
        trainer = Trainer(job)
        sums = torch.zeros(3)
        times = {False: [], True: []}
        trainer.train_step(sums, health=True)  # warm up both paths
        trainer.train_step(sums, health=False)
        spent[0], logged = 0.0, 0
        for rep in range(args.reps):
            for on in ((False, True) if rep % 2 == 0 else (True, False)):
                t = time.process_time()
                for _ in range(args.block):
                    trainer.train_step(sums, health=on)
                    if on:
                        t_row = time.process_time()
                        load = torch.stack([m.expert_load_E for m in trainer.layers])
                        health_row(load, trainer.layers, trainer.entropy.mean())
                        spent[0] += time.process_time() - t_row
                        logged += 1
                    for m in trainer.layers:
                        m.expert_load_E.zero_()
                    trainer.step += 1
                times[on].append((time.process_time() - t) / args.block)
        off, on = statistics.median(times[False]), statistics.median(times[True])
        extra = on - off
        direct = spent[0] / logged
        print(f"{preset:>7} {1e3 * off:9.2f} {1e3 * extra:11.3f} {100 * extra / off:15.2f}% {100 * extra / off / 10:23.2f}%"
              f" {1e3 * direct:10.3f} {100 * direct / off:12.2f}%")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("stall", "recover", "health"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--latency", type=float, default=0.5)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--block", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--small-batch", type=int, default=4, help="the small preset's batch (one thread)")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("marin").setLevel(logging.ERROR)
    work = pathlib.Path(tempfile.mkdtemp(prefix="marin-bench-ops-"))
    try:
        {"stall": stall, "recover": recover, "health": health}[args.what](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
