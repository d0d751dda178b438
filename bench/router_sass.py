"""The fused router's kernels as an H200 would run them, read without a GPU: compile both for
sm_90 with the specialisation the JIT gives them at launch, disassemble with the cuobjdump that
ships in the Triton wheel, and count what one token costs.

    python -m bench.router_sass                       # T = 32k, E in {64, 128, 384}, K = 8
    python -m bench.router_sass --experts 384 --warps 1 2 4 --score-func softmax
    python -m bench.router_sass --check               # what tests/steps/moe asserts

For each kernel it prints registers, spilled bytes, shared memory, the instructions of one pass
of the token loop (the forward is a persistent loop; the backward is one tile a program), how
many of those are shuffles and barriers, and two lower bounds on the time at T tokens:

- issue: every warp instruction issued once, on 132 SMs x 4 schedulers at 1.98 GHz (one warp
  instruction a scheduler a cycle, the H200's boost clock as seen on the lent machine);
- memory: the least bytes the kernel must move (steps.moe.router.least_traffic) at the 4.3 TB/s of a
  device-to-device copy measured on the same machine kind (read + write).

Neither is a measurement: stalls, latency and the tail are not in them. They rank designs and
say which bound a kernel is near; bench/router.py --device cuda measures.
"""

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":  # kernels defined under the interpreter cannot compile
    os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from steps.moe import router_kernel as rk  # noqa: E402
from steps.moe.router import SCORE_FUNCS, least_traffic  # noqa: E402

H200 = dict(sms=132, schedulers=4, clock_hz=1.98e9, copy_bytes_per_s=4.3e12, regs_per_sm=65536)
FWD_ARGS = ["logits_ptr", "bias_ptr", "weights_ptr", "indices_ptr", "lse_ptr", "counts_ptr", "sums_ptr"]
BWD_ARGS = ["logits_ptr", "lse_ptr", "indices_ptr", "dweights_ptr", "dlse_ptr", "dsums_ptr", "dlogits_ptr"]


def compile_sm90(kernel, runtime: dict, constexprs: dict, num_warps: int):
    """Compile as the JIT would at launch: pointers 16-byte aligned and integers that are
    multiples of 16 marked divisible by 16 (that is what lets the loads be 16 bytes wide)."""
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        value = runtime[name]
        if isinstance(value, str):
            signature[name] = value
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, int):
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    src = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def machine_code(compiled) -> dict:
    """Resource use and instruction counts of a compiled kernel, the token loop apart."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    code = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    # The token loop: the widest backward branch.
    loops = [(int(t.group(1), 16), addr) for addr, ins in code
             if "BRA" in ins and (t := re.search(r"0x([0-9a-f]+)", ins)) and int(t.group(1), 16) < addr]
    lo, hi = max(loops, key=lambda span: span[1] - span[0]) if loops else (0, -1)

    def opcode(ins: str) -> str:
        return re.match(r"(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", ins).group(1)

    body = collections.Counter(opcode(ins) for addr, ins in code if lo <= addr <= hi)
    every = collections.Counter(opcode(ins) for _, ins in code)
    return dict(
        registers=int(re.search(r"REG:(\d+)", res).group(1)),
        spilled=int(re.search(r"LOCAL:(\d+)", res).group(1)),
        shared=int(re.search(r"SHARED:(\d+)", res).group(1)),
        total=len(code), loop=sum(body.values()), loop_shfl=body["SHFL"], loop_bar=body["BAR"],
        shfl=every["SHFL"], bar=every["BAR"],
    )


def analyse(T: int, E: int, K: int, score_func: str, block_t: int, warps: int) -> dict:
    cw = rk.chunk_width(E)
    shape = dict(E=E, K=K, NC=triton.next_power_of_2(E) // cw, CW=cw, BT=block_t,
                 SCORE=SCORE_FUNCS[score_func], RENORM=True)
    n_tiles = triton.cdiv(T, block_t)
    fwd_rt = dict({a: "*i32" if "indices" in a or "counts" in a else "*fp32" for a in FWD_ARGS},
                  T=T, n_tiles=n_tiles, scale=1.0, eps=1e-20)
    bwd_rt = dict({a: "*i32" if "indices" in a else "*fp32" for a in BWD_ARGS}, T=T, scale=1.0, eps=1e-20)
    fwd = machine_code(compile_sm90(rk._router_fwd_kernel, fwd_rt, shape, warps))
    bwd = machine_code(compile_sm90(rk._router_bwd_kernel, bwd_rt,
                                    dict(shape, KP=triton.next_power_of_2(K)), warps))
    rate = H200["sms"] * H200["schedulers"] * H200["clock_hz"]
    # resident warps a SM: at most 64, at most 32 programs, and as many as the registers allow
    warps_per_sm = lambda regs: min(64, 32 * warps, H200["regs_per_sm"] // (max(regs, 1) * 32) // warps * warps)  # noqa: E731
    programs = min(n_tiles, H200["sms"] * rk.programs_per_sm(warps))
    fwd["warp_instructions"] = n_tiles * warps * fwd["loop"] + programs * warps * (fwd["total"] - fwd["loop"])
    bwd["warp_instructions"] = n_tiles * warps * bwd["total"]
    fwd_bytes, bwd_bytes = least_traffic(T, E, K)
    for d, n_bytes in ((fwd, fwd_bytes), (bwd, bwd_bytes)):
        d["issue_us"] = d["warp_instructions"] / rate * 1e6
        d["memory_us"] = n_bytes / H200["copy_bytes_per_s"] * 1e6
        d["warps_per_sm"] = warps_per_sm(d["registers"])
    return dict(T=T, E=E, K=K, score_func=score_func, block_t=block_t, warps=warps, fwd=fwd, bwd=bwd,
                bytes=fwd_bytes + bwd_bytes)


def report(r: dict) -> str:
    lines = []
    for name in ("fwd", "bwd"):
        d = r[name]
        per_token = d["loop"] if name == "fwd" else d["total"]
        lines.append(
            f"{r['E']:>4} {r['score_func']:>7} {r['block_t']:>3} {r['warps']:>3} {name:>4} {d['registers']:>5} "
            f"{d['spilled']:>5} {d['warps_per_sm']:>7} {per_token * r['warps'] / r['block_t']:>10.0f} "
            f"{(d['loop_shfl'] if name == 'fwd' else d['shfl']) * r['warps'] / r['block_t']:>6.0f} "
            f"{d['loop_bar'] if name == 'fwd' else d['bar']:>4} {d['issue_us']:>9.1f} {d['memory_us']:>9.1f}")
    floor = max(r["fwd"]["issue_us"], r["fwd"]["memory_us"]) + max(r["bwd"]["issue_us"], r["bwd"]["memory_us"])
    gbps = r["bytes"] / floor / 1e3
    lines.append(f"{'':>17} fwd+bwd floor {floor:.1f} us: at most {gbps:,.0f} GB/s, "
                 f"{100 * gbps / (H200['copy_bytes_per_s'] / 1e9):.0f}% of copy")
    return "\n".join(lines)


def problems_of(r: dict) -> list[str]:
    """What tests/steps/moe/test_router_sass.py holds the default kernels to."""
    out = []
    where = f"E={r['E']} {r['score_func']}"
    for name in ("fwd", "bwd"):
        d = r[name]
        if d["spilled"]:
            out.append(f"{where} {name}: spills {d['spilled']} bytes to local memory")
        if d["warps_per_sm"] < 16:
            out.append(f"{where} {name}: {d['registers']} registers leave {d['warps_per_sm']} warps a SM (< 16)")
    # Each row reduction is a 5-step shuffle: 2 a round, the lse's max and sum, the weights' sum.
    tokens = r["block_t"]
    if r["fwd"]["loop_shfl"] > 5 * (2 * r["K"] + 3) * tokens:
        out.append(f"{where} fwd: {r['fwd']['loop_shfl']} shuffles in the token loop: a row "
                   "reduction crosses warps or repeats")
    # A few barriers come from layout conversions of the [BT, CW] slot tensors (Triton 3.6);
    # a row reduction through shared memory would bring 2 a round.
    if r["fwd"]["loop_bar"] > 4 * tokens:
        out.append(f"{where} fwd: {r['fwd']['loop_bar']} barriers in the token loop")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--experts", type=int, nargs="*", default=[64, 128, 384])
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--score-func", choices=["softmax", "sigmoid", "both"], default="both")
    p.add_argument("--warps", type=int, nargs="*", help="warps a program (default: the kernels' own)")
    p.add_argument("--check", action="store_true", help="exit 1 on spills, fewer than 16 warps a "
                   "SM, or row reductions through shared memory, for the default tiles")
    args = p.parse_args(argv)
    funcs = ["sigmoid", "softmax"] if args.score_func == "both" else [args.score_func]
    print(f"Triton {triton.__version__}, sm_90; T = {args.tokens}, K = {args.k}; "
          f"lower bounds for an H200 (see the docstring)\n")
    print(f"{'E':>4} {'score':>7} {'BT':>3} {'w':>3} {'':>4} {'regs':>5} {'spill':>5} {'warps/SM':>7} "
          f"{'instr/tok':>10} {'shfl':>6} {'bar':>4} {'issue us':>9} {'memory us':>9}")
    problems = []
    for E in args.experts:
        for sf in funcs:
            for warps in args.warps or [rk.tile_config(args.tokens, E)[1]]:
                block_t = rk.tile_config(args.tokens, E)[0] if not args.warps else warps
                r = analyse(args.tokens, E, args.k, sf, block_t, warps)
                print(report(r), flush=True)
                if not args.warps:
                    problems += problems_of(r)
    if args.check:
        print("\n" + ("\n".join(problems) if problems else "check passed"))
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
