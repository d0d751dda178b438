"""A poisoned source drawn alone for a stretch: does the spike guard end at or below no guard?

    .venv/bin/python bench/train_poison.py                  # 200 pretrain steps, poison drawn alone ~150..155
    .venv/bin/python bench/train_poison.py --steps 40 --poison-at 28 --window 12 --min-samples 8   # the test's size

The data: the bundled corpora (kjv, pydocs, a 512-id BPE) and a fourth kind of source, random
printable-ASCII documents (seeded), ingested and tokenized like the others. The mixture's stages:
the clean mix, then the poison source alone for `--poison-steps` optimizer steps' worth of
tokens, then the clean mix again (pretrain reads these three; a short last stage is midtrain's,
not run). The control has the same stages with the clean mix in the poison's place (the poison
never drawn). Five pretrain runs of the tiny preset on one CPU thread, the same seed:

    control     the control mixture, the guard on (SpikeConfig's defaults unless given)
    guard off   the poisoned mixture, SpikeConfig(z=0)
    guard on    the poisoned mixture, the guard on
    control, same steps dropped
                the control mixture, the guard on, and the optimizer steps whose data or update the
                guard-on run dropped (its `skipped_steps`) dropped here too (`trainer.drop_steps`:
                no data read, no update, the schedule moves on): what the guard would cost with no
                poison to remove
    poisoned, same steps dropped
                the poisoned mixture, the guard on, the same steps dropped (every poisoned step is
                among them when the guard caught the stretch): the guard-on run's data less the
                dropped steps, with no rewind and no skip. The poisoned mixture's clean stages draw
                other windows than the control's after the stretch (the control drew clean
                sequences in it), so this - control, same steps dropped is that draw difference,
                and guard on - this is what the guard's run did beyond dropping those steps

Each final checkpoint is evaluated (steps/eval/evaluate.py) on the held-out windows of kjv and
pydocs (windows the mixture never draws); the figure is their mean held-out loss in nats. Printed
side by side with the differences, the guard's events and the steps whose data it dropped.
`--json FILE` writes the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from executor.testing import build_context  # noqa: E402
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, MixtureStage, mixture  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.train.config import DataConfig, ModelSpec, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from steps.train.pretrain import pretrain  # noqa: E402
from steps.train.spikes import SpikeConfig  # noqa: E402

CLEAN = {"kjv": 0.6, "pydocs": 0.4}
HELD_OUT = ("kjv", "pydocs")


def run_step(fn, config, output, name):
    ctx = build_context(str(output), name=name, digest=(name.replace("/", "") * 64)[:64])
    fn(config, ctx)
    return ctx


def ascii_documents(path: pathlib.Path, n: int, length: int, seed: int) -> None:
    """`n` documents of random printable ASCII (letters, digits, punctuation, spaces), seeded."""
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(32, 127)]
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"noise/{i}", "text": "".join(rng.choice(alphabet) for _ in range(length))}) + "\n")


def build(root: pathlib.Path, args) -> tuple[str, str]:
    """(poisoned mixture, control mixture) output URLs."""
    from kits.trainkit import build_tokens

    tokens = build_tokens(root / "tokens")
    ascii_documents(root / "noise.jsonl", 400, 2000, args.seed)
    raw = run_step(ingest, IngestConfig(input=str(root / "noise.jsonl")), root / "raw-noise", "ingest/noise").output
    tokens["noise"] = run_step(tokenize, TokenizeConfig(documents=raw, tokenizer=tokens["tokenizer"], bos=None,
                                                        eos="<|eos|>"), root / "tokens-noise", "tokenize/noise").output
    tail = 10  # midtrain's stage: not run
    total = args.steps + tail
    fractions = [args.poison_at / total, args.poison_steps / total,
                 (args.steps - args.poison_at - args.poison_steps) / total, tail / total]
    out = []
    for name, middle in (("poisoned", {"noise": 1.0}), ("control", CLEAN)):
        weights = [CLEAN, middle, CLEAN, CLEAN]
        config = MixtureConfig(datasets={k: tokens[k] for k in ("kjv", "pydocs", "noise")},
                               token_budget=total * args.batch * args.seq_len, seq_len=args.seq_len, block_size=64,
                               stages=tuple(MixtureStage(f, w) for f, w in zip(fractions, weights)))
        out.append(run_step(mixture, config, root / f"mix-{name}", f"mixture/{name}").output)
    return out[0], out[1]


def train_and_eval(root: pathlib.Path, name: str, mix: str, spikes: SpikeConfig, args,
                   drop_steps: tuple[int, ...] = ()) -> dict:
    config = TrainConfig(data=DataConfig(mixture=mix, batch_size=args.batch), model=ModelSpec("tiny"),
                         optimizer=OptimizerConfig(lr=args.lr, warmup_steps=args.warmup, spikes=spikes),
                         trainer=TrainerConfig(seed=args.seed, log_every=10, checkpoint_every=args.checkpoint_every,
                                               keep_last=2, tracker=TrackerConfig(kind="none"),
                                               drop_steps=drop_steps))
    t = time.perf_counter()
    ctx = run_step(pretrain, config, root / f"pre-{name}", "pretrain/x")
    train_s = time.perf_counter() - t
    ev = run_step(evaluate, EvalConfig(checkpoint=ctx.output, max_sequences=args.eval_sequences), root / f"eval-{name}",
                  "eval/x")
    results = json.load(open(root / f"eval-{name}" / "results.json"))
    losses = {d: results["datasets"][d]["loss"] for d in HELD_OUT}
    return {"run": name, "held_out": sum(losses.values()) / len(losses), "per_dataset": losses,
            "train_loss": ctx.results.get("loss"), "events": ctx.results.get("spike_events", []),
            "skipped_steps": ctx.provenance["tokens"].get("skipped_steps", []), "train_s": round(train_s, 1),
            "eval": ev.name}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="pretrain optimizer steps")
    p.add_argument("--poison-at", type=int, default=150, help="the step the poison stage starts at (about)")
    p.add_argument("--poison-steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=33)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--window", type=int, default=SpikeConfig.window)
    p.add_argument("--min-samples", type=int, default=SpikeConfig.min_samples)
    p.add_argument("--eval-sequences", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="a folder to keep the outputs in (default: a temporary one)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    logging.getLogger("marin").setLevel(logging.WARNING)
    import torch

    torch.set_num_threads(1)
    root = pathlib.Path(args.work or tempfile.mkdtemp(prefix="train-poison-"))
    root.mkdir(parents=True, exist_ok=True)
    poisoned, control = build(root, args)
    guard = SpikeConfig(window=args.window, min_samples=args.min_samples)
    runs = [train_and_eval(root, "control", control, guard, args),
            train_and_eval(root, "guard_off", poisoned, SpikeConfig(z=0), args),
            train_and_eval(root, "guard_on", poisoned, guard, args)]
    dropped = tuple(sorted({s for a, b, _ in runs[2]["skipped_steps"] for s in range(a, b + 1)}))
    runs.append(train_and_eval(root, "control_dropped", control, guard, args, drop_steps=dropped))
    runs.append(train_and_eval(root, "poisoned_dropped", poisoned, guard, args, drop_steps=dropped))
    base = runs[0]["held_out"]
    print(f"poisoned source drawn alone from about step {args.poison_at} for {args.poison_steps} steps of "
          f"{args.steps}; held-out loss (nats, mean of {', '.join(HELD_OUT)}):")
    for r in runs:
        print(f"  {r['run']:<16} {r['held_out']:.4f}  vs control {r['held_out'] - base:+.4f}  "
              f"train {r['train_s']:.0f}s  events {[(e['step'], e['kind']) for e in r['events']]}"
              + (f"  dropped/skipped {r['skipped_steps']}" if r["skipped_steps"] else ""))
    on, off, same, oracle = (runs[i]["held_out"] for i in (2, 1, 3, 4))
    print(f"  guard on - guard off: {on - off:+.4f} nats; guard on - control: {on - base:+.4f} nats "
          f"(targets: <= 0 and <= +0.02)")
    print(f"  guard on - control = {on - base:+.4f}: the {len(dropped)} dropped steps {list(dropped)} on the control "
          f"mixture (control, same steps dropped - control) {same - base:+.4f}; the poisoned mixture's other clean "
          f"draws (poisoned, same steps dropped - control, same steps dropped) {oracle - same:+.4f}; the guard's run "
          f"beyond dropping those steps (guard on - poisoned, same steps dropped) {on - oracle:+.4f}")
    out = {"args": vars(args), "runs": runs, "on_minus_off": on - off, "on_minus_control": on - base,
           "dropped_steps": list(dropped), "dropped_minus_control": same - base, "draws": oracle - same,
           "on_minus_poisoned_dropped": on - oracle}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
