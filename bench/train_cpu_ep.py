"""Expert parallelism on the CPU: tokens/s of a small MoE on 4 gloo processes as ep=4 (and ep=2)
against data parallelism only (FSDP2 over 4, DDP over 4), the share of step time spent in the
all-to-alls, and each mesh's loss against one process on the same batches.

    .venv/bin/python -m bench.train_cpu_ep                        # tiny preset, 30 timed steps
    .venv/bin/python -m bench.train_cpu_ep --dim 256 --experts 16 --expert-dim 128 --seq 128

Every run uses the trainer's own pieces (steps/train: the mesh and component from a
ParallelConfig, the model built on meta and initialized by name, AdamW, gradient clipping, the
expert-bias update) on 4 processes (`steps.train.launch.spawn`: gloo, one torch thread each; the
machine's cores are shared by all four) and synthetic text with something to learn (each token
followed by one of 4 successors fixed per token, so the loss falls from ln 512 towards ln 4): step
s draws the same global batch on every mesh (a generator seeded with s), each rank takes its
data-parallel slice. Tokens/s: over
`--steps` steps after `--warmup`. All-to-all share: a further `--profile` steps under
torch.profiler on rank 0, the time inside `_c10d_functional` all_to_all_single and the waits on
it (forward and backward) over the wall time of those steps. Loss: the largest relative
difference, over all steps, from one process training the same batches, and from DDP on the same
4 processes (the same per-rank batch shapes, so the same rounding in the matmuls). AdamW turns
the last-bit differences of gradients near zero into whole updates, so over many steps at a
larger width the first column drifts to ~1e-3 on every mesh alike while the second stays small:
rounding, amplified, not a difference between meshes (the tests hold 1e-5 a step on the tiny
preset through the real trainer).
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import dataclasses
import json
import os
import tempfile
import time

from bench import kit  # noqa: E402

ROOT = kit.ROOT

MESHES = {  # name -> ParallelConfig kwargs
    "ddp": {"dp_replicate": -1, "dp_shard": 1},
    "fsdp": {},
    "ep2": {"ep": 2},
    "ep4": {"ep": 4},
}


def model_config(args):
    from steps.moe.config import PRESETS

    over = {k: v for k, v in (("dim", args.dim), ("n_experts", args.experts), ("expert_dim", args.expert_dim))
            if v}
    return dataclasses.replace(PRESETS[args.preset], vocab_size=512, max_seq_len=args.seq, **over)


def train(args, mesh: str, out: str) -> None:
    """One run on this process group (or alone): write {losses, step_s, a2a_share} from rank 0."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from steps.moe.balance import update_expert_bias
    from steps.train.config import OptimizerConfig, ParallelConfig
    from steps.train.loop import build_model, build_optimizer
    from steps.train.parallel import build_parallel, clip_grad_norm, unwrap

    torch.set_num_threads(1)
    cfg = model_config(args)
    parallel = build_parallel(ParallelConfig(**MESHES.get(mesh, {})), torch.device("cpu"), "fp32")
    model = build_model(cfg, 0, torch.device("cpu"), parallel)
    optimizer = build_optimizer(unwrap(model), OptimizerConfig(lr=3e-3), torch.device("cpu"))
    layers = unwrap(model).moe_layers()
    ranks = parallel.pc.dp
    share = args.batch // ranks

    successors = torch.randint(0, cfg.vocab_size, (cfg.vocab_size, 4), generator=torch.Generator().manual_seed(-1))

    def step(s: int) -> float:
        g = torch.Generator().manual_seed(s)
        seq = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, cfg.vocab_size, (args.batch,), generator=g)
        picks = torch.randint(0, 4, (args.batch, args.seq), generator=g)
        for i in range(args.seq):
            seq[:, i + 1] = successors[seq[:, i], picks[:, i]]
        mine = seq[parallel.data_rank * share:(parallel.data_rank + 1) * share]
        logits, router_loss = model(mine[:, :-1])
        ce = F.cross_entropy(logits.flatten(0, 1), mine[:, 1:].flatten())
        ((ce + router_loss) / parallel.loss_divisor).backward()
        clip_grad_norm(model.parameters(), 1.0, parallel.norm_group)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        update_expert_bias(layers, cfg.bias_update_rate)
        loss = ce.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(loss)
        return float(loss) / ranks

    losses = [step(s) for s in range(args.warmup)]
    if dist.is_initialized():
        dist.barrier()
    t = time.perf_counter()
    losses += [step(s) for s in range(args.warmup, args.warmup + args.steps)]
    step_s = (time.perf_counter() - t) / args.steps
    a2a_share = 0.0
    if args.profile and getattr(parallel.pc, "ep", 1) > 1:
        from torch.profiler import ProfilerActivity, profile

        first = args.warmup + args.steps
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            losses += [step(s) for s in range(first, first + args.profile)]
            wall = time.perf_counter() - t
        spent = sum(e.self_cpu_time_total for e in prof.key_averages()
                    if "all_to_all" in e.key or e.key.endswith("wait_tensor")) / 1e6
        a2a_share = spent / wall
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "step_s": step_s, "a2a_share": a2a_share}, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--dim", type=int, default=0)
    p.add_argument("--experts", type=int, default=0)
    p.add_argument("--expert-dim", type=int, default=0)
    p.add_argument("--batch", type=int, default=16, help="sequences per step, all ranks together")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=5)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--meshes", default="ddp,fsdp,ep2,ep4")
    args = p.parse_args()

    from steps.train.launch import spawn

    work = tempfile.mkdtemp(prefix="marin-bench-ep-")
    results = {}
    ref = os.path.join(work, "one.json")
    train(args, "one", ref)
    results["one"] = json.load(open(ref))
    for mesh in args.meshes.split(","):
        out = os.path.join(work, f"{mesh}.json")
        spawn(train, (args, mesh, out), args.workers)
        results[mesh] = json.load(open(out))
    tokens = args.batch * args.seq
    base = results["one"]["losses"]
    cfg = model_config(args)
    print(f"{args.preset} (dim {cfg.dim}, {cfg.n_experts} experts of {cfg.expert_dim}, top {cfg.top_k}), "
          f"{args.batch} x {args.seq} tokens a step, {args.workers} gloo processes, {os.cpu_count()} cores, "
          f"{args.steps} timed steps")
    ddp = results.get("ddp", results["one"])["losses"]
    print(f"{'mesh':>6} {'tokens/s':>9} {'vs fsdp':>8} {'a2a share':>10} {'loss vs 1 process':>18} {'vs ddp':>8}"
          f" {'final loss':>10}")
    for mesh, r in results.items():
        rate = tokens / r["step_s"]
        vs = rate / (tokens / results["fsdp"]["step_s"]) if "fsdp" in results else float("nan")
        diff = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base))
        diff_ddp = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ddp))
        r.update(tokens_per_s=rate, max_rel_loss_diff=diff, max_rel_loss_diff_ddp=diff_ddp)
        print(f"{mesh:>6} {rate:9.0f} {vs:8.2f} {100 * r['a2a_share']:9.1f}% {diff:18.1e} {diff_ddp:8.1e}"
              f" {r['losses'][args.warmup + args.steps - 1]:10.4f}")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "losses"} for k, v in results.items()}))


if __name__ == "__main__":
    main()
