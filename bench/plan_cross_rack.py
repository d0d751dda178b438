"""The cross-rack plan's figures, closed form (torch-free, a second): the 535B step with the optimizer
state on the host against the same step with it sharded across the racks' replicas, beside the
anchor, at the same calibration; peak memory against routing skew with and without the rank
capacity; the loss's memory chunked and unchunked.

    python -m bench.plan_cross_rack
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import dataclasses

from steps.moe.config import PRESETS  # noqa: E402
from steps.scale import memory as mem  # noqa: E402
from steps.scale.anchor import ANCHOR  # noqa: E402
from steps.scale.hardware import GIB  # noqa: E402
from steps.scale.mesh_plan import Choice, Mesh, Setup, estimate, pick  # noqa: E402

BIG = PRESETS["535b-a23b"]
FULL = Setup(model=BIG, batch=11_264, context=4095, gpus=792)
EP64 = Mesh(11, 64, 64)


def plans() -> None:
    chosen, _ = pick(FULL)
    hosted = Choice(EP64, 1, "selective", "moments")  # the choice before the distributed optimizer
    rows = [(f"the search's choice ({chosen.choice.offload})", chosen),
            ("the same mesh, Adam moments on the host (the choice before)", estimate(FULL, hosted)),
            ("the same mesh, Adam on the GPU", estimate(FULL, dataclasses.replace(hosted, offload="none")))]
    print(f"calibrated efficiency while computing: {FULL.compute_efficiency:.1%}; target {FULL.memory_target_gib:g} GiB")
    print("| plan | peak GiB | verdict | host GiB | cross-rack exposed s | host C2C exposed s | step s |")
    print("|---|---|---|---|---|---|---|")
    for name, p in rows:
        net = sum(c.exposed for c in p.time.collectives if c.link == "network")
        host = sum(c.exposed for c in p.time.collectives if c.link == "host")
        print(f"| {name}: {p.choice.describe()} | {p.peak / GIB:.2f} | {p.verdict()} | {p.host / GIB:.1f} | "
              f"{net:.2f} | {host:.2f} | {p.time.total:.2f} |")
    print(f"| anchor (published) | {ANCHOR.peak_gib} | | on the host | | | {ANCHOR.step_s} |")
    print("\nthe choice's state a GPU (GiB):")
    for row in chosen.rows[:4]:
        print(f"  {row.name:34s} {row.bytes / GIB:6.2f}  {row.note}")
    for c in chosen.time.collectives:
        if c.link == "network":
            print(f"  {c.name:40s} {c.bytes / 1e9:6.1f} GB  {c.seconds:.2f} s, exposed {c.exposed:.2f} s ({c.overlap})")


def skew() -> None:
    choice = pick(FULL)[0].choice
    print(f"\nskew, on the search's choice: {choice.describe()}")
    free = dataclasses.replace(FULL, model=dataclasses.replace(BIG, rank_capacity_factor=0.0))
    print("\n| busiest rank's rows over the mean | peak GiB, unbounded (dropless) | peak GiB, capacity 1.25x | "
          "busiest rank's assignments dropped at 1.25x |")
    print("|---|---|---|---|")
    capped = estimate(FULL, choice).peak / GIB
    for s in (1.0, 1.25, 1.5, 1.8, 2.0, 2.5, 3.0):
        peak = estimate(dataclasses.replace(free, load_peak=s), choice).peak / GIB
        flag = "" if peak <= FULL.memory_target_gib else " (above the target)"
        print(f"| {s:g}x | {peak:.2f}{flag} | {capped:.2f} | {max(0.0, 1 - 1.25 / s):.1%} |")


def loss_memory() -> None:
    print("\n| micro-batch | loss + head, unchunked (torch's cross-entropy over [T, V]) GB | fused, chunks of 8,192 "
          "rows GB |")
    print("|---|---|---|")
    for mb in (1, 2, 4):
        T, V, D = mb * 4095, BIG.vocab_size, BIG.dim
        unchunked = max(12 * T * V + 4 * T * D, 2 * V * D + 2 * T * V + 6 * T * D)  # the formula before the chunked loss
        print(f"| {mb} | {unchunked / 1e9:.2f} | {mem.head_bytes(BIG, mb, 4095) / 1e9:.2f} |")


if __name__ == "__main__":
    plans()
    skew()
    loss_memory()
