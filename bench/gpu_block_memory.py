"""The block check: one 535B decoder block on one GPU against what the plan
predicts for the very same shapes, with a PASS / FAIL verdict, plus the checks that need a GPU
to mean anything (the fused router against eager, the grouped-GEMM offsets, the matmul peak).

The block runs as the plan runs it, only smaller in one direction:
- expert parallelism with a real all-to-all: `AllToAllExperts` (steps/moe/expert_parallel.py)
  over a 1-rank NCCL group, so the send and receive buffers, the counts' exchange and the host
  sync are the real ones; the plan's form with an exchange (memory.kept_bytes at ep > 1) is the
  one it is compared with, with e = all the block's experts on this GPU;
- 16 routed experts of the 535B width (top-8 of 16, not 8 of 8: the load can be uneven), the
  router skewed by a ramp of selection biases (`--skew`), so the grouped GEMM's groups differ;
- the capped path (the 535B preset's rank_capacity_factor 1.25), whose counts are all-gathered;
- `expandable_segments` on (PYTORCH_CUDA_ALLOC_CONF is set below, before torch initialises
  CUDA), as the plan's 5% fragmentation reserve assumes and the trainer sets.

Parts, most valuable first; after each, everything so far is written to $OUT/block.json (a run
killed half-way leaves the parts it finished):
1. matmul: the bf16 matmul peak of this GPU (8192^3), the ceiling the MFU is taken against;
2. block: forward + backward at micro-batch 1 under `--checkpointing`; the peak allocated above
   the weights against the plan's kept + working bytes, reserved over allocated against
   1 + the plan's fragmentation reserve, the time against the plan's (the block's FLOPs at the
   plan's calibrated share of peak, of this GPU's datasheet peak); each PASS within 10%, else FAIL;
3. router: the fused Triton router against eager torch at T = 32k, E = 384, K = 8 (exactness and
   speed, forward + backward);
4. grouped_gemm: `expert_layout`'s offsets for the skewed counts against a plain reference, and
   `torch._grouped_mm` against one matmul per expert.

    python3 -m bench.gpu_block_memory                      # on the GPU (bench/gpu_all.sh)
    python -m bench.gpu_block_memory --dry                 # the CPU form: tiny shapes, a gloo group
    python -m bench.gpu_block_memory --dry --inject '{"allocated_gib": 1.0}'  # verdicts on given figures

`--inject` replaces measured figures before the verdicts (the dry mode has no memory readings):
for testing the verdict logic only; the JSON lists what was injected. No GPU had been lent when
this was written: nothing here has run on one yet.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import os

# Before torch initialises CUDA (at import it does not; the first allocation does).
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

if "--dry" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused router on the CPU

import torch  # noqa: E402

TOLERANCE = 0.10  # a measured figure within 10% of the plan's passes
INJECTABLE = ("allocated_gib", "reserved_gib", "block_s", "matmul_tflops")


def verdict(measured: float | None, planned: float, tolerance: float = TOLERANCE) -> dict:
    """One check: PASS when |measured / planned - 1| <= tolerance, FAIL otherwise, NOT MEASURED
    without a figure."""
    if measured is None or not math.isfinite(measured):
        return {"measured": None, "planned": planned, "ratio": None, "verdict": "NOT MEASURED"}
    ratio = measured / planned if planned else math.inf
    return {"measured": measured, "planned": planned, "ratio": ratio,
            "verdict": "PASS" if abs(ratio - 1) <= tolerance else "FAIL"}


def overall(checks: dict) -> str:
    """FAIL if any check failed; PASS if all passed; else NOT MEASURED (some never measured)."""
    kinds = {c["verdict"] for c in checks.values()}
    return "FAIL" if "FAIL" in kinds else "PASS" if kinds == {"PASS"} else "NOT MEASURED"


class Report:
    """The results so far, written whole to $OUT/block.json after every part."""

    def __init__(self, dest: pathlib.Path, head: dict) -> None:
        self.dest, self.data = dest, {**head, "parts": {}}

    def part(self, name: str, fn) -> dict | None:
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001  (a part that breaks must not take the others with it)
            out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            print(f"{name}: ERROR {out['error']}", flush=True)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        self.data["parts"][name] = out
        self.write()
        return out

    def write(self) -> None:
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.dest.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.dest)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, dev: torch.device, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


# -- 1. the matmul peak --------------------------------------------------------------------------


def matmul_peak(dev: torch.device, n: int, repeat: int) -> dict:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    s = median_seconds(lambda: a @ b, dev, repeat, warmup=3)
    tflops = 2 * n ** 3 / s / 1e12
    print(f"matmul: bf16 {n}^3 on random data {tflops:,.1f} TFLOP/s (median of {repeat})", flush=True)
    return {"n": n, "seconds": s, "tflops": tflops}


# -- 2. the block against the plan --------------------------------------------------------------


def block_config(dry: bool, experts: int):
    from steps.moe.config import PRESETS

    if dry:
        return dataclasses.replace(PRESETS["tiny"], n_experts=experts, top_k=4, rank_capacity_factor=1.25), 64
    return dataclasses.replace(PRESETS["535b-a23b"], n_experts=experts, router_impl="auto"), 4095


def block_flops(cfg, layer: int, context: int, mode: str) -> float:
    """Training FLOPs of block `layer` for one token (forward + backward + what `mode`
    recomputes): the plan's per-token counts (steps/scale/comms.py) for a one-layer model of
    that layer's kind."""
    from steps.scale.comms import block_flops_per_token, recompute_flops_per_token

    one = dataclasses.replace(cfg, n_layers=1, global_every=1 if cfg.is_global(layer) else 2)
    fwd, _ = block_flops_per_token(one, context)
    return 3 * fwd + recompute_flops_per_token(one, context, mode)


def planned_block(cfg, layer: int, context: int, mode: str) -> dict:
    """The plan's figures for this block on one GPU: kept + working bytes with the exchange's
    buffers (memory.kept_bytes in its ep > 1 form, e = every expert of the block here), the
    allocator's reserve, the compute time at the calibrated efficiency."""
    from steps.moe.config import PRESETS
    from steps.scale import memory as mem
    from steps.scale.mesh_plan import Setup

    t = dataclasses.replace(mem.Tokens.of(cfg, 1, context, 1), ep=64)  # the form with an exchange
    kept = mem.kept_bytes(cfg, layer, t, mode)
    working = mem.working_bytes(cfg, layer, t, mode, mem.Mesh(1, 1, 1))
    setup = Setup(model=PRESETS["535b-a23b"], batch=11_264, context=4095, gpus=792)
    return {"kept_gib": kept / 2**30, "working_gib": working / 2**30, "allocated_gib": (kept + working) / 2**30,
            "reserved_over_allocated": 1 + setup.fragmentation, "efficiency": setup.compute_efficiency,
            "flops": context * block_flops(cfg, layer, context, mode)}


def _group(dev: torch.device):
    import torch.distributed as dist

    if not dist.is_initialized():
        kw = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1, **kw)
    return dist.group.WORLD


def run_block(args, dev: torch.device, cfg, context: int) -> dict:
    from steps.moe.expert_parallel import AllToAllExperts
    from steps.moe.model import Block, rope_tables
    from steps.train.recompute import context_fn

    dtype = torch.bfloat16
    torch.manual_seed(0)
    with torch.device(dev):
        block = Block(cfg, args.layer).to(dtype)
    for p in block.parameters():  # matrices as the trainer draws them; norm gains stay 1
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=cfg.init_std)
    moe = block.moe
    E = cfg.n_experts
    moe.expert_bias_E = args.skew * torch.linspace(1, -1, E, device=dev)  # fp32, as the trainer keeps it
    moe.expert_load_E = torch.zeros(E, device=dev)
    moe.experts = AllToAllExperts(_group(dev), E)
    block.recompute = context_fn(args.checkpointing)
    cos, sin = rope_tables(context, cfg.head_dim, cfg.rope_theta, dev)

    def step() -> None:
        x = torch.randn(1, context, cfg.dim, device=dev, dtype=dtype, requires_grad=True)
        y, loss = block(x, cos, sin)
        torch.autograd.backward([y, loss], [torch.randn_like(y), torch.ones_like(loss)])
        block.zero_grad(set_to_none=True)

    cuda = dev.type == "cuda"
    step()  # warm-up: kernels, cuBLAS workspaces, NCCL's communicator
    load = moe.expert_load_E.clone()
    _sync(dev)
    allocated = reserved = None
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        step()
        torch.cuda.synchronize()
        allocated = (torch.cuda.max_memory_allocated() - base_alloc) / 2**30
        reserved = (torch.cuda.max_memory_reserved() - base_res) / 2**30
    seconds = median_seconds(step, dev, args.repeat, warmup=0)
    cpu_seconds = None
    if not cuda:  # a CPU's time says nothing about the GPU plan's: kept aside, not judged
        cpu_seconds, seconds = seconds, None
    weights = sum(p.numel() * p.element_size() for p in block.parameters()) / 2**30
    return {"layer": args.layer, "global": cfg.is_global(args.layer), "checkpointing": args.checkpointing,
            "context": context, "experts": E, "top_k": cfg.top_k, "rank_capacity_factor": cfg.rank_capacity_factor,
            "load_max_over_mean": float(load.max() / load.mean()), "load_min_over_mean": float(load.min() / load.mean()),
            "received_rows": int(moe.experts.received), "weights_gib": weights,
            "allocated_gib": allocated, "reserved_gib": reserved, "block_s": seconds, "cpu_block_s": cpu_seconds,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "expandable_segments": _expandable() if cuda else None}


def _expandable() -> bool | None:
    try:
        return bool(torch._C._accelerator_getAllocatorSettings()["expandable_segments"])  # noqa: SLF001
    except Exception:  # noqa: BLE001  (the name differs across torch versions; the setting is in alloc_conf)
        return None


def judge_block(measured: dict, planned: dict, matmul_tflops: float | None, peak_tflops: float) -> dict:
    """The three checks of the block against the plan, and the efficiencies reached."""
    res = measured.get("reserved_gib")
    alloc = measured.get("allocated_gib")
    planned_s = planned["flops"] / (planned["efficiency"] * peak_tflops * 1e12)
    checks = {
        "peak_allocated": verdict(alloc, planned["allocated_gib"]),
        "reserved_over_allocated": verdict(res / alloc if res is not None and alloc else None,
                                           planned["reserved_over_allocated"]),
        "block_time": verdict(measured.get("block_s"), planned_s),
    }
    s = measured.get("block_s")
    return {"checks": checks, "verdict": overall(checks), "planned_block_s": planned_s,
            "reached_of_datasheet_peak": planned["flops"] / s / (peak_tflops * 1e12) if s else None,
            "mfu_of_measured_matmul_peak": planned["flops"] / s / (matmul_tflops * 1e12)
            if s and matmul_tflops else None}


# -- 3. the fused router against eager -----------------------------------------------------------


def router_check(dev: torch.device, tokens: int, experts: int, k: int, skew: float, repeat: int) -> dict:
    from steps.moe.router import route_fused, route_reference, untied_logits

    gen = torch.Generator(device=dev).manual_seed(0)
    bias_E = skew * torch.linspace(1, -1, experts, device=dev)
    logits = untied_logits(tokens, experts, k, "sigmoid", bias_E, gen)

    def run(fn):
        x = logits.clone().requires_grad_(True)
        r = fn(x, bias_E, k, "sigmoid", True, 1.0)
        loss = (r.weights_TK * torch.linspace(0.5, 1.5, k, device=dev)).sum() + 1e-4 * r.lse_T.square().sum()
        loss.backward()
        return r, x.grad

    (re, ge), (rf, gf) = run(route_reference), run(route_fused)
    re, rf = type(re)(*(t.detach() for t in re)), type(rf)(*(t.detach() for t in rf))
    same_idx = bool(torch.equal(re.indices_TK, rf.indices_TK))
    same_counts = bool(torch.equal(re.counts_E, rf.counts_E))
    w_err = float((re.weights_TK - rf.weights_TK).abs().max())
    g_err = float((ge - gf).abs().max() / ge.abs().max().clamp_min(1e-30))
    eager_s = median_seconds(lambda: run(route_reference), dev, repeat, warmup=0)  # both ran once above
    fused_s = median_seconds(lambda: run(route_fused), dev, repeat, warmup=0)
    ok = same_idx and same_counts and w_err <= 1e-5 and g_err <= 1e-4
    out = {"tokens": tokens, "experts": experts, "k": k, "same_indices": same_idx, "same_counts": same_counts,
           "weights_max_abs_err": w_err, "grad_max_rel_err": g_err, "eager_ms": 1e3 * eager_s,
           "fused_ms": 1e3 * fused_s, "fused_speedup": eager_s / fused_s, "verdict": "PASS" if ok else "FAIL",
           "load_max_over_mean": float(re.counts_E.max() / re.counts_E.float().mean())}
    print(f"router: T {tokens:,} E {experts} K {k}, fused vs eager forward + backward: indices "
          f"{'equal' if same_idx else 'DIFFER'}, counts {'equal' if same_counts else 'DIFFER'}, weights within "
          f"{w_err:.1e}, gradient within {g_err:.1e} (relative); {out['eager_ms']:.2f} ms eager, "
          f"{out['fused_ms']:.2f} ms fused, {out['fused_speedup']:.1f}x: {out['verdict']}", flush=True)
    return out


# -- 4. the grouped GEMM's offsets ---------------------------------------------------------------


def grouped_gemm_check(dev: torch.device, tokens: int, experts: int, k: int, dim: int, width: int, align: int,
                       skew: float) -> dict:
    """`expert_layout` for a skewed routing against a plain-Python layout, and one grouped
    matmul against a matmul per expert group."""
    from steps.moe.model import expert_layout
    from steps.moe.router import route_reference, untied_logits

    gen = torch.Generator(device=dev).manual_seed(1)
    bias_E = 2 * skew * torch.linspace(1, -1, experts, device=dev)
    r = route_reference(untied_logits(tokens, experts, k, "sigmoid", bias_E, gen), bias_E, k, "sigmoid", True, 1.0)
    row_N, offs_E, n_rows = expert_layout(r.indices_TK, r.counts_E, align)
    counts = r.counts_E.tolist()
    ends, end = [], 0
    for c in counts:  # the reference: each group padded to a multiple of align, back to back
        end += -(-c // align) * align
        ends.append(end)
    flat = r.indices_TK.reshape(-1).tolist()
    seen, rows = [0] * experts, []
    for e in flat:  # slot order within an expert is token order
        rows.append(ends[e] - -(-counts[e] // align) * align + seen[e])
        seen[e] += 1
    offs_ok = offs_E.tolist() == ends and row_N.tolist() == rows and n_rows >= end
    x = torch.zeros(n_rows, dim, device=dev, dtype=torch.bfloat16)
    x[row_N] = torch.randn(len(flat), dim, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(experts, width, dim, device=dev, dtype=torch.bfloat16, generator=gen) / dim ** 0.5
    y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs_E)
    ref = torch.zeros_like(y)
    start = 0
    for e, stop in enumerate(ends):
        ref[start:stop] = (x[start:stop].float() @ w[e].float().T).to(ref.dtype)
        start = stop
    err = float((y.float() - ref.float())[:end].abs().max() / ref.float().abs().max().clamp_min(1e-30))
    ok = offs_ok and err <= 2e-2
    out = {"tokens": tokens, "experts": experts, "k": k, "align": align, "counts_min": min(counts),
           "counts_max": max(counts), "offsets_equal": offs_ok, "grouped_mm_max_rel_err": err,
           "verdict": "PASS" if ok else "FAIL"}
    print(f"grouped GEMM: {experts} groups of {min(counts)} to {max(counts)} rows (align {align}): offsets "
          f"{'equal to the reference' if offs_ok else 'DIFFER from the reference'}, grouped_mm within {err:.1e} of "
          f"a matmul per group: {out['verdict']}", flush=True)
    return out


# -- main ---------------------------------------------------------------------------------------


def parse_inject(text: str | None) -> dict:
    if not text:
        return {}
    src = pathlib.Path(text)
    data = json.loads(src.read_text() if not text.lstrip().startswith("{") and src.exists() else text)
    bad = sorted(set(data) - set(INJECTABLE))
    if bad:
        raise SystemExit(f"--inject: unknown figure(s) {bad}; injectable: {list(INJECTABLE)}")
    return {k: float(v) for k, v in data.items()}


def main(argv=None) -> int:
    from steps.scale import memory as mem

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="the CPU form: tiny shapes, a gloo group, no memory readings")
    ap.add_argument("--checkpointing", default="selective", choices=mem.MODES)
    ap.add_argument("--layer", type=int, default=3, help="3: a global layer; 0: a windowed one")
    ap.add_argument("--experts", type=int, default=16, help="routed experts on the GPU (top-8 of them)")
    ap.add_argument("--skew", type=float, default=None,
                    help="selection-bias ramp: +skew .. -skew over the experts (default 0.1; 0.02 with --dry)")
    ap.add_argument("--repeat", type=int, default=0, help="timed block steps (default 5; 1 with --dry)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="this GPU's datasheet dense bf16 peak (H100/H200: 989), for the plan's time")
    ap.add_argument("--inject", help="JSON (or a file of it) of measured figures to replace: " + ", ".join(INJECTABLE))
    ap.add_argument("--parts", default="matmul,block,router,grouped_gemm")
    args = ap.parse_args(argv)
    inject = parse_inject(args.inject)
    args.repeat = args.repeat or (1 if args.dry else 5)
    args.skew = args.skew if args.skew is not None else 0.02 if args.dry else 0.1
    if not args.dry and not torch.cuda.is_available():
        print("bench/gpu_block_memory.py needs a CUDA GPU (--dry is the CPU form)", file=sys.stderr)
        return 2
    dev = torch.device("cpu") if args.dry else torch.device("cuda", 0)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    parts = args.parts.split(",")
    report = Report(pathlib.Path(os.environ.get("OUT", "/tmp")) / "block.json", {
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (dry)", "torch": torch.__version__,
        "dry": args.dry, "injected": sorted(inject), "tolerance": TOLERANCE})
    cfg, context = block_config(args.dry, args.experts)
    mm = report.part("matmul", lambda: matmul_peak(dev, 128 if args.dry else 8192, 2 if args.dry else 10)) \
        if "matmul" in parts else None
    matmul_tflops = inject.get("matmul_tflops", (mm or {}).get("tflops") if not args.dry else None)
    if "block" in parts:
        def block_part() -> dict:
            measured = run_block(args, dev, cfg, context)
            for key in ("allocated_gib", "reserved_gib", "block_s"):
                if key in inject:
                    measured[key] = inject[key]
            planned = planned_block(cfg, args.layer, context, args.checkpointing)
            judged = judge_block(measured, planned, matmul_tflops, args.peak_tflops)
            c = judged["checks"]

            def fig(check, unit, scale=1.0):
                m = c[check]["measured"]
                got = "not measured" if m is None else f"{m * scale:.3f}{unit}"
                ratio = "" if c[check]["ratio"] is None else f" ({c[check]['ratio']:.2f}x)"
                return f"{got} against the plan's {c[check]['planned'] * scale:.3f}{unit}{ratio}: {c[check]['verdict']}"

            print(f"block ({args.checkpointing}, layer {args.layer}, micro-batch 1, {cfg.n_experts} experts top-"
                  f"{cfg.top_k}, a 1-rank {'NCCL' if dev.type == 'cuda' else 'gloo'} all-to-all, load "
                  f"{measured['load_min_over_mean']:.2f}x to {measured['load_max_over_mean']:.2f}x the mean):\n"
                  f"  peak allocated above the weights {fig('peak_allocated', ' GiB')}\n"
                  f"  reserved over allocated {fig('reserved_over_allocated', 'x')}\n"
                  f"  forward + backward {fig('block_time', ' ms', 1e3)} (the plan's {planned['efficiency']:.1%} "
                  f"of {args.peak_tflops:g} TFLOP/s)\n"
                  f"  block verdict: {judged['verdict']}" + (f" (injected: {', '.join(sorted(inject))})" if inject else ""),
                  flush=True)
            if judged["mfu_of_measured_matmul_peak"] is not None:
                print(f"  reached {judged['mfu_of_measured_matmul_peak']:.1%} of the measured matmul peak "
                      f"({matmul_tflops:,.0f} TFLOP/s), {judged['reached_of_datasheet_peak']:.1%} of the datasheet's",
                      flush=True)
            return {"measured": measured, "planned": planned, **judged}

        report.part("block", block_part)
    if "router" in parts:
        report.part("router", lambda: router_check(dev, 64 if args.dry else 32768, 16 if args.dry else 384,
                                                   4 if args.dry else 8, args.skew, 1 if args.dry else 20))
    if "grouped_gemm" in parts:
        report.part("grouped_gemm", lambda: grouped_gemm_check(
            dev, 64 if args.dry else 4096, cfg.n_experts, cfg.top_k, 64 if args.dry else cfg.dim,
            32 if args.dry else cfg.expert_dim, cfg.expert_align, args.skew))
    got = report.data["parts"]
    verdicts = {name: p.get("verdict", "ERROR" if "error" in p else "-") for name, p in got.items()}
    report.data["verdict"] = ("FAIL" if {"FAIL", "ERROR"} & set(verdicts.values()) else
                              "PASS" if set(verdicts.values()) <= {"PASS", "-"} else "NOT MEASURED")
    report.write()
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in verdicts.items()) + f"; overall {report.data['verdict']}")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
