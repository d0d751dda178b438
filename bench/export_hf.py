"""export_hf: time and peak host memory of exporting a checkpoint, against the ceiling the issue
names (the largest tensor plus a shard) and against the model.

    .venv/bin/python -m bench.export_hf                       # tiny (laptop shapes) and medium
    .venv/bin/python -m bench.export_hf --laptop OUT/midtrain/laptop-XXXX   # a real laptop checkpoint
    .venv/bin/python -m bench.export_hf --medium-layers 24    # the whole medium preset (~43 GB on disk)

For each case the parent writes a DCP checkpoint of the preset's randomly initialized weights
(fp32, tensor by tensor; model state only: the export never reads the optimizer's bytes), then
exports it in a child process that reports its wall time and peak RSS (VmHWM), once right
after its imports and once after the export. Printed side by side: peak RSS / (largest tensor +
shard) and peak RSS / model, with and without the interpreter's own baseline (torch alone is
~0.3-0.5 GB). `--medium-layers` keeps every tensor of the medium preset its real size but builds
fewer of its 24 layers, so the checkpoint fits a laptop's disk: the peak does not depend on the
layer count, the time is linear in it.
"""
from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = str(kit.ROOT)

GB = 1e9


def write_random_checkpoint(cfg, url: str, seed: int = 0) -> dict:
    """A checkpoint folder (DCP + meta.json) of `cfg` with the model's init rule, written one
    tensor at a time (the model is never whole in this process either)."""
    import torch

    from steps.export.dcp_io import write_checkpoint
    from steps.moe.model import MoETransformer

    with torch.device("meta"):
        state = MoETransformer(cfg).state_dict()
    gen = torch.Generator().manual_seed(seed)
    out_std = cfg.init_std / (2 * cfg.n_layers) ** 0.5

    def produce(fqn: str):
        shape = tuple(state[fqn].shape)
        if fqn.endswith("expert_bias_E"):
            return torch.randn(shape, generator=gen) * 1e-3
        if len(shape) == 1:
            return torch.ones(shape)
        std = out_std if fqn.endswith(("wo.weight", "w2.weight", "w2_EDF")) else cfg.init_std
        return torch.randn(shape, generator=gen) * std

    write_checkpoint(url, {k: (tuple(v.shape), torch.float32) for k, v in state.items()}, produce)
    meta = {"step": 0, "tokens": 0, "model": dataclasses.asdict(cfg), "seq_len": cfg.max_seq_len + 1}
    with open(os.path.join(url, "meta.json"), "w") as f:
        json.dump(meta, f)
    sizes = [v.numel() * 4 for v in state.values()]
    return {"model_bytes": sum(sizes), "largest_bytes": max(sizes), "tensors": len(sizes)}


def child(checkpoint: str, out: str, dtype: str, shard_bytes: int) -> None:
    """Export in this process and print {"wall_s", "base_rss", "peak_rss", ...} as JSON."""
    from steps.data.tokenizer import load_tokenizer  # noqa: F401  (imports as the step does)
    from steps.export.to_hf import export_folder, model_config_of
    from steps.export.tokenizer import Specials
    from steps.train.checkpoint import read_meta

    meta = read_meta(checkpoint)
    cfg = model_config_of(meta)
    tokenizer = byte_tokenizer_json(cfg.vocab_size)
    base = peak_rss()
    started = time.perf_counter()
    summary = export_folder(checkpoint, out, model_config=cfg, tokenizer_json=tokenizer,
                            specials=Specials(bos=None, eos="<|eos|>", pad=None), context=int(meta["seq_len"]) - 1,
                            dtype=dtype, max_shard_bytes=shard_bytes)
    wall = time.perf_counter() - started
    peak = peak_rss()
    print(json.dumps({"wall_s": wall, "base_rss": base, "peak_rss": peak, **summary}))


def peak_rss() -> int:
    """This process's peak resident set (bytes): VmHWM, which exec resets. (getrusage's ru_maxrss
    is not reset by exec on Linux, so a child started from a big parent reports the parent's
    peak.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def byte_tokenizer_json(vocab: int) -> str:
    """A byte-level BPE with `vocab` ids (the export needs a tokenizer; its size is irrelevant here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab, 300), special_tokens=["<|eos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer=trainer)
    return tok.to_str()


def run_case(name: str, checkpoint: str, info: dict, out: str, dtype: str, shard_bytes: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", checkpoint, out, dtype, str(shard_bytes)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"{name}: the export failed:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ceiling = info["largest_bytes"] + min(shard_bytes, info["model_bytes"])
    row = {"case": name, "dtype": dtype, **info, **got, "ceiling": ceiling}
    row["peak_over_ceiling"] = got["peak_rss"] / ceiling
    row["growth_over_ceiling"] = (got["peak_rss"] - got["base_rss"]) / ceiling
    row["peak_over_model"] = got["peak_rss"] / info["model_bytes"]
    row["gb_per_s"] = info["model_bytes"] / got["wall_s"] / GB
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--laptop", help="a laptop training output (midtrain/laptop-...) or checkpoint folder")
    p.add_argument("--medium-layers", type=int, default=6)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--shard-gb", type=float, default=1.0)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder, removed after)")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.child[2], int(args.child[3]))
        return

    from steps.moe.config import PRESETS

    root = args.dir or tempfile.mkdtemp(prefix="bench-export-")
    shard = int(args.shard_gb * GB)
    rows = []
    try:
        if args.laptop:
            from steps.train import checkpoint
            from steps.train.checkpoint import saved_shapes

            found = checkpoint.resolve(args.laptop, "--laptop")
            sizes = [4 * _numel(s) for s in saved_shapes(found.url).values()]
            info = {"model_bytes": sum(sizes), "largest_bytes": max(sizes), "tensors": len(sizes)}
            rows.append(run_case("laptop (trained)", found.url, info, os.path.join(root, "hf-laptop"), "float32",
                                 shard))
        else:
            cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=512)
            info = write_random_checkpoint(cfg, os.path.join(root, "ckpt-tiny"))
            rows.append(run_case("tiny (laptop shapes)", os.path.join(root, "ckpt-tiny"), info,
                                 os.path.join(root, "hf-tiny"), "float32", shard))
        cfg = dataclasses.replace(PRESETS["medium"], n_layers=args.medium_layers)
        started = time.perf_counter()
        info = write_random_checkpoint(cfg, os.path.join(root, "ckpt-medium"))
        print(f"(wrote the medium checkpoint, {info['model_bytes'] / GB:.1f} GB, in "
              f"{time.perf_counter() - started:.0f} s)", flush=True)
        rows.append(run_case(f"medium, {args.medium_layers} of 24 layers", os.path.join(root, "ckpt-medium"), info,
                             os.path.join(root, "hf-medium"), args.dtype, shard))
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    head = (f"{'case':28} {'dtype':9} {'model':>8} {'largest':>8} {'shard':>6} {'export':>8} {'GB/s':>5} "
            f"{'peak RSS':>9} {'base':>6} {'peak/(largest+shard)':>21} {'growth/(largest+shard)':>23} "
            f"{'peak/model':>10}")
    print(head)
    for r in rows:
        print(f"{r['case']:28} {r['dtype']:9} {r['model_bytes'] / GB:7.2f}G {r['largest_bytes'] / GB:7.3f}G "
              f"{min(shard, r['model_bytes']) / GB:5.2f}G {r['wall_s']:7.2f}s {r['gb_per_s']:5.2f} "
              f"{r['peak_rss'] / GB:8.2f}G {r['base_rss'] / GB:5.2f}G {r['peak_over_ceiling']:21.2f} "
              f"{r['growth_over_ceiling']:23.2f} {r['peak_over_model']:10.3f}")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


if __name__ == "__main__":
    main()
