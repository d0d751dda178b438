"""Check and time the MoE router: the fused Triton op against unfused eager torch and against
torch.compile of the same reference, forward alone and forward + backward.

    python -m bench.router --device cuda          # one H200: T 8k/32k/64k x E 64/128/384, K = 8
    python -m bench.router --device cpu --small   # reduced, TRITON_INTERPRET=1 (run by the tests)

Bandwidth is effective: the bytes the router must move at the least (read the fp32 logits, write
the outputs; in the backward read the logits again and write their gradient), divided by the
time, for every implementation alike, so an implementation that moves more bytes shows fewer GB/s.
It is set against the bandwidth of a device-to-device copy measured in the same run.
On CUDA, times are medians from triton.testing.do_bench, which clears the L2 cache before each
call. Under the interpreter the times say nothing about a GPU; the CPU form checks that the
script, the checks and the three implementations run.

Targets, on the H200 at T = 32k, E = 384, K = 8: fused forward + backward at least 5x
faster than unfused eager, and at least 40% of the measured copy bandwidth.
"""

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702
import argparse
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small", action="store_true", help="reduced shapes (the CPU form)")
    p.add_argument("--tokens", type=int, nargs="*", help="token counts (default by --small)")
    p.add_argument("--experts", type=int, nargs="*", help="expert counts (default by --small)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--score-func", choices=["softmax", "sigmoid"], default="sigmoid")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile of the reference")
    p.add_argument("--compile-static", action="store_true",
                   help="compile one graph per token count instead of one per expert count")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=None,
                   help="also time other tile shapes and grid sizes of the fused kernels at the "
                        "largest E (default: on for the full cuda form)")
    args = p.parse_args(argv)
    if args.tokens is None:
        args.tokens = [32, 96] if args.small else [8192, 32768, 65536]
    if args.experts is None:
        args.experts = [16, 64] if args.small else [64, 128, 384]
    if args.sweep is None:
        args.sweep = args.device == "cuda" and not args.small
    return args


ARGS = parse_args()
if ARGS.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported, so the kernels interpret

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

from bench import kit  # noqa: E402
from steps.moe import router_kernel  # noqa: E402
from steps.moe.router import RENORM_EPS, SCORE_FUNCS, least_traffic, route_fused, route_reference, untied_logits  # noqa: E402


def timer(device: str):
    """A function fn -> median milliseconds."""
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")

    def cpu_time(fn) -> float:
        return kit.timed(fn, repeats=2, warmup=1).wall_median * 1e3

    return cpu_time


def copy_gbps(device: str, time_ms) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    n_bytes = (1 << 30) if device == "cuda" else (16 << 20)
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * n_bytes / ms / 1e6


def saved_bytes(fn, logits) -> int:
    """Bytes autograd keeps for the backward of one forward, counted once per storage."""
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(logits)
    del out
    return sum(storages.values())


def check(name: str, got, want, dlogits_got, dlogits_want) -> list[str]:
    """Differences that break the contract: indices must match exactly, the rest to fp32 tolerance."""
    problems = []
    if not torch.equal(got[1], want[1]):
        bad = (got[1] != want[1]).any(-1).sum().item()
        problems.append(f"{name}: indices differ on {bad} tokens")
    if not torch.equal(got[2], want[2]):
        problems.append(f"{name}: counts differ")
    for label, g, w, atol in [("weights", got[0], want[0], 1e-5), ("lse", got[3], want[3], 1e-4),
                              ("score sums", got[4], want[4], 1e-5 * got[3].numel()),
                              ("dlogits", dlogits_got, dlogits_want, 1e-5)]:
        if not torch.allclose(g, w, rtol=1e-4, atol=atol):
            problems.append(f"{name}: {label} off by {(g - w).abs().max().item():.3g}")
    return problems


def main(args: argparse.Namespace) -> int:
    device, K, sf = args.device, args.k, args.score_func
    time_ms = timer(device)
    gen = torch.Generator(device=device).manual_seed(0)
    copy = copy_gbps(device, time_ms)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU, Triton interpreter"
    print(f"device: {name}; copy bandwidth {copy:,.0f} GB/s (read + write)")
    print(f"K = {K}, score function {sf}, renormalized weights\n")

    impls = {"fused": route_fused, "eager": route_reference}
    if not args.no_compile:
        torch._dynamo.config.recompile_limit = 64
        backend = "inductor" if device == "cuda" else "aot_eager"  # no C++ toolchain needed on CPU
        impls["compiled"] = torch.compile(route_reference, backend=backend,
                                          dynamic=False if args.compile_static else None)
        print(f"torch.compile backend {backend}, "
              f"{'static shapes' if args.compile_static else 'token count dynamic'}")

    header = (f"{'T':>6} {'E':>4} {'impl':>9} {'fwd ms':>9} {'GB/s':>7} {'fwd+bwd ms':>11} "
              f"{'GB/s':>7} {'%copy':>6} {'x eager':>8} {'saved MB':>9}")
    print(header)
    problems: list[str] = []
    results: dict[tuple[int, int, str], tuple[float, float]] = {}
    for E in args.experts:
        for T in args.tokens:
            bias_E = torch.randn(E, generator=gen, device=device) * 0.05
            logits_TE = untied_logits(T, E, K, sf, bias_E, gen).requires_grad_()
            if "compiled" in impls and not args.compile_static:
                torch._dynamo.mark_dynamic(logits_TE, 0)
            dw_TK = torch.randn(T, K, generator=gen, device=device)
            dlse_T = torch.randn(T, generator=gen, device=device)
            dsums_E = torch.randn(E, generator=gen, device=device)

            def forward(impl, x):
                return impls[impl](x, bias_E, K, sf, True, 1.0)

            def forward_backward(impl):
                out = forward(impl, logits_TE)
                return torch.autograd.grad([out[0], out[3], out[4]], logits_TE, [dw_TK, dlse_T, dsums_E])[0]

            want = forward("eager", logits_TE)
            dwant = forward_backward("eager")
            fwd_b, bwd_b = least_traffic(T, E, K)
            eager_ms = None
            for impl in ["eager", *[i for i in impls if i != "eager"]]:
                if impl != "eager":
                    problems += check(f"{impl} T={T} E={E}", forward(impl, logits_TE), want,
                                      forward_backward(impl), dwant)
                f_ms = time_ms(lambda: forward(impl, logits_TE))
                fb_ms = time_ms(lambda: forward_backward(impl))
                eager_ms = fb_ms if impl == "eager" else eager_ms
                results[(T, E, impl)] = (f_ms, fb_ms)
                fb_gbps = (fwd_b + bwd_b) / fb_ms / 1e6
                saved = saved_bytes(lambda x: forward(impl, x), logits_TE) / 1e6
                print(f"{T:>6} {E:>4} {impl:>9} {f_ms:>9.3f} {fwd_b / f_ms / 1e6:>7.1f} {fb_ms:>11.3f} "
                      f"{fb_gbps:>7.1f} {100 * fb_gbps / copy:>5.1f}% {eager_ms / fb_ms:>7.2f}x {saved:>9.2f}")

    if args.sweep:
        sweep(max(args.experts), 32768 if 32768 in args.tokens else max(args.tokens), K, sf, gen,
              time_ms, copy)
    T_t = 32768 if 32768 in args.tokens else max(args.tokens)
    E_t = 384 if 384 in args.experts else max(args.experts)
    f_fb = results[(T_t, E_t, "fused")][1]
    speedup = results[(T_t, E_t, "eager")][1] / f_fb
    frac = sum(least_traffic(T_t, E_t, K)) / f_fb / 1e6 / copy
    print(f"\ntargets at T={T_t}, E={E_t}: fused fwd+bwd {speedup:.2f}x eager (target >= 5x), "
          f"{100 * frac:.1f}% of copy bandwidth (target >= 40%)")
    if device == "cuda":
        print("verdict: " + ("targets met" if speedup >= 5 and frac >= 0.4 else "targets MISSED"))
    else:
        print("verdict: not measurable here (Triton interpreter on the CPU); run --device cuda on an H200")
    if problems:
        print("\nCHECKS FAILED:\n  " + "\n  ".join(problems))
        return 1
    if "compiled" in impls:
        from torch._dynamo.utils import counters

        print(f"torch.compile made {counters['stats']['unique_graphs']} graphs")
    print("\nall checks passed")
    return 0


def sweep(E: int, T: int, K: int, sf: str, gen, time_ms, copy: float) -> None:
    """Time the fused kernels directly over nearby tile shapes and grid sizes, to set
    router_kernel.tile_config and max_programs from measurements on new hardware."""
    device = torch.device(ARGS.device)
    bias_E = torch.randn(E, generator=gen, device=device) * 0.05
    logits_TE = untied_logits(T, E, K, sf, bias_E, gen)
    dw_TK = torch.randn(T, K, generator=gen, device=device)
    dlse_T, dsums_E = torch.zeros(T, device=device), torch.zeros(E, device=device)
    bt0, w0 = router_kernel.tile_config(T, E, device)
    p0 = router_kernel.max_programs(device, w0)

    def run_ms(bt: int, warps: int, programs: int) -> float:
        def run():
            w, idx, _, lse, _ = router_kernel.router_forward(
                logits_TE, bias_E, K, SCORE_FUNCS[sf], True, 1.0, RENORM_EPS, block_t=bt, num_warps=warps,
                programs=programs)
            router_kernel.router_backward(logits_TE, lse, idx, dw_TK, dlse_T, dsums_E, SCORE_FUNCS[sf], True, 1.0,
                                          RENORM_EPS,
                                          block_t=bt, num_warps=warps)
        return time_ms(run)

    # One token a warp (the default, 1 x 1), several warps a program, several tokens a warp.
    tiles = sorted({(bt0, w0), (2, 2), (4, 4), (2, 1), (4, 1)})
    rows = sorted((run_ms(bt, w, router_kernel.max_programs(device, w)), bt, w) for bt, w in tiles)
    best_ms, bt, w = rows[0]
    pw = router_kernel.max_programs(device, w)
    grids = sorted((run_ms(bt, w, pw * m // 4), pw * m // 4) for m in (1, 2, 4, 8))
    default_ms = next(ms for ms, b, ww in rows if (b, ww) == (bt0, w0))
    gbps = sum(least_traffic(T, E, K)) / min(best_ms, grids[0][0]) / 1e6
    print(f"\nsweep of the fused fwd+bwd at T={T}, E={E}: default BT={bt0} warps={w0} programs={p0}: "
          f"{default_ms:.3f} ms; best BT={bt} warps={w} programs={grids[0][1]}: "
          f"{min(best_ms, grids[0][0]):.3f} ms ({100 * gbps / copy:.1f}% of copy)")
    for ms, b, ww in rows:
        print(f"  BT={b:<4} warps={ww:<2} programs={router_kernel.max_programs(device, ww):<5} {ms:.3f} ms")
    for ms, p in grids:
        print(f"  BT={bt:<4} warps={w:<2} programs={p:<5} {ms:.3f} ms")


if __name__ == "__main__":
    sys.exit(main(ARGS))
