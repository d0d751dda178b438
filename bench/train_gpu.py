"""MFU of training the `small` preset (917.8M total, 389.3M active parameters) on one GPU
(written for an H200), under each activation-checkpointing mode, and our MoE layer beside
torchtitan's at the same shape.

    python -m bench.train_gpu                                  # the whole thing (bench/gpu_all.sh)
    python -m bench.train_gpu --checkpointing selective --batch 4 --steps 10  # less
    python -m bench.train_gpu --device cpu --preset tiny --seq 64 --batch 2 --steps 2 --warmup 1 \
        --layer-tokens 256 --repeats 2                         # the script itself, on the CPU
    pip install torchtitan  # first, for the side-by-side (skipped with a reason if absent)

1. Training: the trainer's own pieces (steps/train: the model built on meta and initialized by
   name, sharded by a one-rank FSDP2 component with its bf16 mixed-precision policy, the
   grouped-GEMM expert path and the fused Triton router on CUDA, fused AdamW, z-loss, gradient
   clipping, the expert-bias update after each step) on random tokens of the preset's vocabulary
   (no data pipeline: this measures the model and optimizer), `--batch` sequences of `--seq`
   tokens per step, once per `--checkpointing` mode (none, selective, full:
   steps/train/recompute.py). MFU = model FLOPs per token (steps/moe/config.py
   flops_per_token: 6 x active matmul parameters + attention; recomputation is not counted) x
   tokens/s over the GPU's dense bf16 peak (989.4 TFLOP/s for H100/H200). Target: 35%
   with selective checkpointing.
2. One MoE layer, forward + backward, bf16 parameters: ours (steps/moe/model.py MoE) and
   torchtitan's (torchtitan.models.moe.MoE) at dim 1024, 64 experts of width 256, top 8, one
   shared expert of width 256, sigmoid scores, 32,768 tokens.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import dataclasses
import json
import pathlib
import sys
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from steps.moe.balance import update_expert_bias  # noqa: E402
from steps.moe.model import PRESETS, MoE, count_params  # noqa: E402
from steps.train.config import OptimizerConfig, ParallelConfig  # noqa: E402
from steps.train.loop import build_model, build_optimizer  # noqa: E402
from steps.train.parallel import build_parallel, clip_grad_norm, unwrap  # noqa: E402
from steps.train.tracking import flops_per_token, peak_flops  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_mfu(preset: str, batch: int, seq: int, steps: int, warmup: int, device: torch.device,
              checkpointing: str = "selective") -> dict:
    cfg = dataclasses.replace(PRESETS[preset], max_seq_len=seq)
    parallel = build_parallel(ParallelConfig(checkpointing=checkpointing), device, "bf16")
    model = build_model(cfg, 0, device, parallel)
    optimizer = build_optimizer(unwrap(model), OptimizerConfig(lr=3e-4), device)
    layers = unwrap(model).moe_layers()
    gen = torch.Generator(device=device).manual_seed(0)

    def step() -> float:
        seq_ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device, generator=gen)
        logits, router_loss = model(seq_ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), seq_ids[:, 1:].flatten()) + router_loss
        (loss / parallel.loss_divisor).backward()
        clip_grad_norm(model.parameters(), 1.0, parallel.norm_group)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        update_expert_bias(layers, cfg.bias_update_rate)
        return loss.detach()

    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(steps):
        loss = step()
    _sync(device)
    seconds = (time.perf_counter() - t) / steps
    tokens_per_s = batch * seq / seconds
    flops = flops_per_token(cfg, seq)
    total, active = count_params(cfg)
    peak = peak_flops(str(device), torch.get_num_threads())
    cuda = device.type == "cuda"
    return {"preset": preset, "checkpointing": checkpointing, "params_total": total, "params_active": active,
            "batch": batch, "seq": seq,
            "step_s": seconds, "tokens_per_s": tokens_per_s, "model_tflops_per_token": flops / 1e12,
            "achieved_tflops": tokens_per_s * flops / 1e12, "peak_tflops": peak / 1e12,
            "mfu": tokens_per_s * flops / peak, "loss": float(loss),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
            "gpu": torch.cuda.get_device_name() if cuda else "cpu"}


def time_layer(layer: torch.nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of forward + backward of one MoE layer."""
    def once():
        out = layer(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()

    for _ in range(3):
        once()
    times = []
    for _ in range(repeats):
        _sync(x.device)
        t = time.perf_counter()
        once()
        _sync(x.device)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def moe_layers(tokens: int, repeats: int, device: torch.device) -> dict:
    dim, experts, width, top_k = 1024, 64, 256, 8
    x = torch.randn(1, tokens, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    # routed experts: 3 matmuls of 2*dim*width per slot; shared: 3 of 2*dim*width; router 2*dim*E; x3 fwd+bwd
    flops = 3 * tokens * (3 * 2 * dim * width * (top_k + 1) + 2 * dim * experts)
    out = {"tokens": tokens, "dim": dim, "experts": experts, "expert_dim": width, "top_k": top_k}
    cfg = dataclasses.replace(PRESETS["small"], n_experts=experts, top_k=top_k, expert_dim=width,
                              n_shared_experts=1, shared_expert_dim=width)
    ours = MoE(cfg).to(device)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.02)
    ours = ours.to(torch.bfloat16)
    ours.expert_bias_E = ours.expert_bias_E.float()  # fp32 buffers, as the trainer keeps them
    ours.expert_load_E = ours.expert_load_E.float()
    s = time_layer(ours, x, repeats)
    out["ours_ms"], out["ours_tflops"] = 1e3 * s, flops / s / 1e12
    try:
        from torchtitan.models.moe import MoE as TitanMoE, MoEArgs
    except Exception as e:  # noqa: BLE001
        out["torchtitan"] = f"not available: {type(e).__name__}: {e}"
        return out
    args = MoEArgs(num_experts=experts, num_shared_experts=1, score_func="sigmoid", route_norm=True, top_k=top_k,
                   use_grouped_mm=True, load_balance_coeff=1e-3)
    titan = TitanMoE(args, dim=dim, hidden_dim=width).to(device)
    with torch.no_grad():
        for p in titan.parameters():
            p.normal_(0, 0.02)
    titan = titan.to(torch.bfloat16)
    for name in ("expert_bias", "tokens_per_expert"):  # fp32 buffers, as torchtitan keeps them
        if getattr(titan, name, None) is not None:
            setattr(titan, name, getattr(titan, name).float())
    s = time_layer(titan, x, repeats)
    out["torchtitan_ms"], out["torchtitan_tflops"] = 1e3 * s, flops / s / 1e12
    out["ours_over_torchtitan_speed"] = out["torchtitan_ms"] / out["ours_ms"]
    return out


def _measured_matmul_tflops() -> float | None:
    """The bf16 matmul peak bench/gpu_block_memory.py measured earlier in the same bench/gpu_all.sh
    run ($OUT/block.json), if any."""
    import os

    try:
        got = json.loads((pathlib.Path(os.environ.get("OUT", "/tmp")) / "block.json").read_text())
        return float(got["parts"]["matmul"]["tflops"]) if not got.get("dry") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layer-tokens", type=int, default=32768)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--checkpointing", default="none,selective,full", help="modes to train under, comma-separated")
    p.add_argument("--device", default="cuda", help="cpu only to check the script itself (with --preset tiny)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/train_gpu.py needs a CUDA GPU (bench/train_cpu.py is the CPU form)")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    results = {}
    measured_peak = _measured_matmul_tflops() if device.type == "cuda" else None
    if measured_peak:
        results["measured_matmul_tflops"] = measured_peak
    if not args.skip_train:
        results["train"] = []
        for mode in args.checkpointing.split(","):
            r = train_mfu(args.preset, args.batch, args.seq, args.steps, args.warmup, device, mode)
            if measured_peak:  # against this GPU's own bf16 matmul peak (bench/gpu_block_memory.py, same run)
                r["mfu_of_measured_peak"] = r["achieved_tflops"] / measured_peak
            results["train"].append(r)
            print(f"train {r['preset']} ({r['params_total'] / 1e9:.2f}B total, {r['params_active'] / 1e9:.2f}B active) "
                  f"on {r['gpu']}, checkpointing {mode}: {r['tokens_per_s']:,.0f} tokens/s, "
                  f"{r['achieved_tflops']:.0f} TFLOP/s, MFU {100 * r['mfu']:.1f}%"
                  + (f" ({100 * r['mfu_of_measured_peak']:.1f}% of the measured {measured_peak:.0f} TFLOP/s matmul)"
                     if measured_peak else "") + f", {r['peak_memory_gib']:.1f} GiB peak",
                  flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if dist.is_initialized():
            dist.destroy_process_group()
    results["moe_layer"] = layer = moe_layers(args.layer_tokens, args.repeats, device)
    print(f"MoE layer fwd+bwd, {layer['tokens']} tokens: ours {layer['ours_ms']:.2f} ms "
          f"({layer['ours_tflops']:.0f} TFLOP/s)", end="")
    if "torchtitan_ms" in layer:
        print(f", torchtitan {layer['torchtitan_ms']:.2f} ms ({layer['torchtitan_tflops']:.0f} TFLOP/s), "
              f"ours {layer['ours_over_torchtitan_speed']:.2f}x")
    else:
        print(f"; torchtitan {layer['torchtitan']}")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
