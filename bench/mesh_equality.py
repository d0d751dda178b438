"""The gloo equality table: twenty steps of the tiny preset (16 sequences a step) on
one process and on several meshes of gloo processes, compared in loss, gradient norm and every
weight after the last step, not in the loss alone (AdamW's scale invariance can hide a wrong
gradient divisor behind the loss). The same runs as tests/steps/train/test_train_mesh.py, which
holds them to tolerances; this prints the figures.

    python -m bench.mesh_equality [--root /tmp/mesh-equality]
    python -m bench.mesh_equality --only router-side   # the router-weight table alone

The router-weight table: the router weights applied on the expert side after w2 (the default,
MoEConfig.router_weights_on_experts) against the older formulation (after the combine), both on
ep=2 (2 processes, the real all-to-all), and the new one under selective and full checkpointing
against itself without.
"""

from __future__ import annotations

if not __package__:  # run as `python bench/NAME.py`: the repository root in place of bench/
    import pathlib, sys; sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])  # noqa: E401,E702

import argparse
import json
import os
import pathlib

from bench import kit  # noqa: E402

ROOT = kit.ROOT

MESHES = {  # name: (ParallelConfig fields, workers, micro-batch)
    "ep=4 (dp_shard 4)": (dict(ep=4), 4, 0),
    "HSDP 2 x 2, ep=2": (dict(dp_replicate=2, dp_shard=2, ep=2), 4, 2),
    "HSDP 2 x 2, ep=2, AdamW sharded over replicas": (dict(dp_replicate=2, dp_shard=2, ep=2, offload="replicas"), 4, 2),
    "dp_replicate 2 x 1, AdamW sharded over replicas": (dict(dp_replicate=2, dp_shard=1, offload="replicas"), 2, 0),
}


# bf16: the distributed optimizer (bf16 working weights, fp32 master slices) against
# plain bf16 HSDP on the same mesh (fp32 weights whole on each replica), and both against one fp32
# process.
BF16 = {  # name: (ParallelConfig fields, workers, micro-batch)
    "dp_replicate 2 x 1": (dict(dp_replicate=2, dp_shard=1), 2, 2),
    "HSDP 2 x 2, ep=2": (dict(dp_replicate=2, dp_shard=2, ep=2), 4, 2),
}


ROUTER_SIDE = {  # name: (ParallelConfig fields, model overrides), each on 2 processes, ep=2
    "weights after the combine (older formulation)": (dict(ep=2), {"router_weights_on_experts": False}),
    "weights after w2 (the default)": (dict(ep=2), {}),
    "weights after w2, selective checkpointing": (dict(ep=2, checkpointing="selective"), {}),
    "weights after w2, full checkpointing": (dict(ep=2, checkpointing="full"), {}),
}


def router_side(mix: str, root: pathlib.Path) -> None:
    """Each run of ROUTER_SIDE against the older formulation and against the default."""
    import dataclasses

    from kits.meshkit import config, run_mesh
    from steps.train.config import ModelSpec, ParallelConfig

    outs = {}
    for i, (name, (fields, overrides)) in enumerate(ROUTER_SIDE.items()):
        cfg = dataclasses.replace(config(mix, ParallelConfig(**fields)), model=ModelSpec("tiny", overrides=overrides))
        outs[name] = run_mesh(cfg, str(root / f"side{i}"), 2)
    old, new = outs["weights after the combine (older formulation)"], outs["weights after w2 (the default)"]
    print("\n| ep=2, 2 processes, 20 steps | vs weights after the combine: loss / grad norm / weights | "
          "vs weights after w2 without checkpointing: loss / grad norm / weights |")
    print("|---|---|---|")
    for name, out in list(outs.items())[1:]:
        print(f"| {name} | {' / '.join(f'{x:.1e}' for x in _diff(out, old))} | "
              f"{' / '.join(f'{x:.1e}' for x in _diff(out, new))} |", flush=True)


def _diff(got_out: str, ref_out: str) -> tuple[float, float, float]:
    import torch

    ref, ref_w = _rows(ref_out), torch.load(f"{ref_out}/dumps/final.pt")
    got, got_w = _rows(got_out), torch.load(f"{got_out}/dumps/final.pt")
    loss = max(abs(got[s]["loss"] - ref[s]["loss"]) / ref[s]["loss"] for s in ref)
    norm = max(abs(got[s]["grad_norm"] - ref[s]["grad_norm"]) / ref[s]["grad_norm"] for s in ref)
    weights = max(float((got_w[k] - ref_w[k]).norm() / ref_w[k].norm()) for k in ref_w)
    return loss, norm, weights


def _rows(out: str) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, open(f"{out}/metrics.jsonl"))}


def main() -> None:
    import torch
    from kits.meshkit import config, run_mesh
    from kits.trainkit import build_tokens, make_mixture

    from steps.train.config import ParallelConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/tmp/mesh-equality")
    ap.add_argument("--only", choices=("router-side",), help="run one table alone")
    args = ap.parse_args()
    root = pathlib.Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    tokens = build_tokens(root / "data")
    mix = make_mixture(tokens, root / "mix", sequences=320, stages=((1.0, {"kjv": 1.0}),))
    if args.only == "router-side":
        router_side(mix, root)
        return
    one = run_mesh(config(mix, ParallelConfig()), str(root / "one"), 1)
    ref, ref_w = _rows(one), torch.load(f"{one}/dumps/final.pt")
    print("| mesh | processes | loss (max rel. diff, 20 steps) | grad norm (max rel. diff) | weights after 20 steps "
          "(max over tensors of |diff| / |w|) |")
    print("|---|---|---|---|---|")
    for i, (name, (fields, workers, micro)) in enumerate(MESHES.items()):
        out = run_mesh(config(mix, ParallelConfig(**fields), microbatch=micro), str(root / f"mesh{i}"), workers)
        got, got_w = _rows(out), torch.load(f"{out}/dumps/final.pt")
        loss = max(abs(got[s]["loss"] - ref[s]["loss"]) / ref[s]["loss"] for s in ref)
        norm = max(abs(got[s]["grad_norm"] - ref[s]["grad_norm"]) / ref[s]["grad_norm"] for s in ref)
        weights = max(float((got_w[k] - ref_w[k]).norm() / ref_w[k].norm()) for k in ref_w)
        print(f"| {name} | {workers} | {loss:.1e} | {norm:.1e} | {weights:.1e} |", flush=True)
    print("\n| bf16 mesh, 2 micro-batches a rank | processes | distributed optimizer vs plain bf16 HSDP: loss / grad "
          "norm / weights | plain bf16 HSDP vs one fp32 process: loss / grad norm / weights |")
    print("|---|---|---|---|")
    for i, (name, (fields, workers, micro)) in enumerate(BF16.items()):
        runs = [run_mesh(config(mix, ParallelConfig(**fields, **extra), microbatch=micro, precision="bf16"),
                         str(root / f"bf16-{i}-{j}"), workers) for j, extra in enumerate(({}, {"offload": "replicas"}))]
        mine, plain = _diff(runs[1], runs[0]), _diff(runs[0], one)
        print(f"| {name} | {workers} | {' / '.join(f'{x:.1e}' for x in mine)} | "
              f"{' / '.join(f'{x:.1e}' for x in plain)} |", flush=True)
    router_side(mix, root)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
