"""The plan's memory and compute model against one GPU (issue 22 item 6): one decoder block of
the 535B shapes, forward and backward at micro-batch 1 under the plan's checkpointing, with as
many routed experts as one GPU holds (EP64: 6 of 384, N = 4,095 x 8 rows at the mean load).

One GPU cannot run the all-to-all of a 64-rank group, so the block routes locally over 8
experts (top-8 needs at least 8): the same N rows at the mean load, 8 experts' weights instead of
6 (+113 MB). The plan's figures are computed for this very block (the closed forms of
steps/scale/memory.py, ep = 1), so the check is of the model, not of the difference.

Prints, and writes as JSON to $OUT/gpu_block_memory.json:
- torch.cuda.max_memory_allocated and max_memory_reserved above the weights, against the
  plan's kept + working bytes for the block, and reserved over allocated (the fragmentation the
  plan reserves 5% for);
- the block's forward + backward time against the plan's compute time for it at the calibrated
  efficiency (steps/scale/anchor.py), and the efficiency the GPU actually reached.

    python3 bench/gpu_block_memory.py [--checkpointing selective] [--repeat 5]
Prepared for bench/gpu_all.sh; not run on a GPU yet (no GPU was lent when it was written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from steps.moe.config import PRESETS  # noqa: E402
from steps.scale import memory as mem  # noqa: E402
from steps.scale.comms import block_flops_per_token, recompute_flops_per_token  # noqa: E402
from steps.scale.plan import Setup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpointing", default="selective", choices=mem.MODES)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layer", type=int, default=3, help="3: a global layer; 0: a windowed one")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="this GPU's dense bf16 peak (H200: 989)")
    args = ap.parse_args()
    from steps.moe.model import Block, rope_tables
    from steps.train.recompute import context_fn

    big = PRESETS["535b-a23b"]
    cfg = dataclasses.replace(big, n_experts=8, rank_capacity_factor=0.0, router_impl="auto")
    context, dev = 4095, torch.device("cuda")
    torch.manual_seed(0)
    with torch.device(dev):
        block = Block(cfg, args.layer).to(torch.bfloat16)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    block.moe.expert_bias_E.zero_()
    block.recompute = context_fn(args.checkpointing)
    cos, sin = rope_tables(context, cfg.head_dim, cfg.rope_theta, dev)
    weights = torch.cuda.memory_allocated()

    def step() -> None:
        x = torch.randn(1, context, cfg.dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
        y, loss = block(x, cos, sin)
        torch.autograd.backward([y, loss], [torch.randn_like(y), torch.ones_like(loss)])
        block.zero_grad(set_to_none=True)

    step()  # warm-up: kernels, cuBLAS workspaces
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(args.repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    allocated = torch.cuda.max_memory_allocated() - base
    reserved = torch.cuda.max_memory_reserved() - base

    t = mem.Tokens.of(cfg, 1, context, 1)
    m = mem.Mesh(1, 1, 1)
    planned = mem.kept_bytes(cfg, args.layer, t, args.checkpointing) + mem.working_bytes(
        cfg, args.layer, t, args.checkpointing, m)
    setup = Setup(model=big, batch=11_264, context=context, gpus=792)
    eff = setup.compute_efficiency
    fwd, _ = block_flops_per_token(big, context)
    per_block = context * (3 * fwd + recompute_flops_per_token(big, context, args.checkpointing)) / big.n_layers
    planned_s = per_block / (setup.hardware.peak_flops * eff)
    measured_s = sorted(times)[len(times) // 2]
    out = {"gpu": torch.cuda.get_device_name(), "checkpointing": args.checkpointing, "layer": args.layer,
           "weights_gib": weights / 2**30, "allocated_gib": allocated / 2**30, "reserved_gib": reserved / 2**30,
           "planned_gib": planned / 2**30, "allocated_over_plan": allocated / planned,
           "reserved_over_allocated": reserved / max(allocated, 1),
           "block_s": measured_s, "planned_block_s": planned_s, "planned_efficiency": eff,
           "reached_efficiency_of_this_gpu": per_block / (args.peak_tflops * 1e12) / measured_s}
    print(f"one 535B block ({args.checkpointing}, layer {args.layer}, micro-batch 1, 8 local experts) on "
          f"{out['gpu']}: peak above the weights {allocated / 2**30:.2f} GiB allocated, {reserved / 2**30:.2f} GiB "
          f"reserved ({out['reserved_over_allocated']:.2f}x); the plan's kept + working: {planned / 2**30:.2f} GiB "
          f"({out['allocated_over_plan']:.2f}x); forward + backward {measured_s * 1e3:.1f} ms against the plan's "
          f"{planned_s * 1e3:.1f} ms at {eff:.1%} of a GB200's peak; {out['reached_efficiency_of_this_gpu']:.1%} of this "
          f"GPU's {args.peak_tflops:g} TFLOP/s reached (the figure to set beside the plan's {eff:.1%})")
    print(json.dumps(out))
    dest = pathlib.Path(os.environ.get("OUT", "/tmp")) / "gpu_block_memory.json"
    dest.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
