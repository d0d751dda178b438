"""The one GPU try: bench/gpu_all.sh's CPU dry form, its budget and order, the
block check's verdicts on figures injected from outside, the wheels folder's check, and the
fallback for a collective name the device's torch 2.11 lacks. No GPU here: these check the
script and its logic, never a GPU result."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name: str):
    return importlib.import_module(f"bench.{name}")


@pytest.fixture(scope="module")
def blockmod():
    return _load("gpu_block_memory")


def test_verdicts_pass_within_ten_percent_and_fail_outside(blockmod):
    v = blockmod.verdict
    assert v(1.099, 1.0)["verdict"] == "PASS" and v(0.901, 1.0)["verdict"] == "PASS"
    assert v(1.11, 1.0)["verdict"] == "FAIL" and v(0.89, 1.0)["verdict"] == "FAIL"
    assert v(None, 1.0)["verdict"] == "NOT MEASURED" and v(float("nan"), 1.0)["verdict"] == "NOT MEASURED"
    assert v(2.0, 0.0)["verdict"] == "FAIL"  # a plan of nothing is never met
    ok, bad, none = ({"verdict": x} for x in ("PASS", "FAIL", "NOT MEASURED"))
    assert blockmod.overall({"a": ok, "b": ok}) == "PASS"
    assert blockmod.overall({"a": ok, "b": none}) == "NOT MEASURED"
    assert blockmod.overall({"a": none, "b": bad}) == "FAIL"
    # the three block checks on given figures: memory at the plan, reserve off, time at the plan
    planned = {"allocated_gib": 10.0, "reserved_over_allocated": 1.05, "efficiency": 0.4, "flops": 4e14}
    planned_s = 4e14 / (0.4 * 989e12)
    got = blockmod.judge_block({"allocated_gib": 10.5, "reserved_gib": 13.0, "block_s": planned_s * 1.05},
                               planned, matmul_tflops=790.0, peak_tflops=989.0)
    c = got["checks"]
    assert c["peak_allocated"]["verdict"] == "PASS" and c["block_time"]["verdict"] == "PASS"
    assert c["reserved_over_allocated"]["verdict"] == "FAIL"  # 1.24x against 1.05x
    assert got["verdict"] == "FAIL"
    assert got["mfu_of_measured_matmul_peak"] == pytest.approx(4e14 / (planned_s * 1.05) / 790e12)


def test_the_plan_figure_of_the_block_counts_the_exchange(blockmod):
    """The block runs a real all-to-all, so the plan's form with an exchange is the one compared:
    its kept bytes hold the tokens received (N D bf16) and their router weights (N fp32), which
    ep = 1 would drop (the combine's output is not kept: the weights are applied before it)."""
    from steps.scale import memory as mem

    cfg, context = blockmod.block_config(False, 16)
    assert (cfg.dim, cfg.expert_dim, cfg.top_k, cfg.n_experts, context) == (6144, 1536, 8, 16, 4095)
    assert cfg.rank_capacity_factor == 1.25  # the capped path, whose counts are all-gathered
    p = blockmod.planned_block(cfg, 3, context, "selective")
    local = mem.kept_bytes(cfg, 3, mem.Tokens.of(cfg, 1, context, 1), "selective")
    N = context * cfg.top_k
    assert p["kept_gib"] * 2**30 - local == 2 * N * cfg.dim + 4 * N + 4 * cfg.n_experts
    # the block's FLOPs: a global layer's attention over the whole context, more than a windowed one's
    assert blockmod.block_flops(cfg, 3, context, "selective") > blockmod.block_flops(cfg, 0, context, "selective")


def _dry(tmp_path, parts: str, inject: dict | None = None, budget: int = 480) -> tuple[str, pathlib.Path]:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_PARTS": parts,
           "GPU_BUDGET_S": str(budget), "PYTHONPATH": str(ROOT)}
    if inject:
        env["GPU_INJECT"] = json.dumps(inject)
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_all.sh"), "--dry"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout, out


def test_dry_block_check_judges_injected_figures(tmp_path, blockmod):
    """The script's block part end to end on the CPU (tiny shapes, a 1-rank gloo all-to-all, the
    fused router under the interpreter), with memory figures injected: the verdicts follow them."""
    cfg, context = blockmod.block_config(True, 16)
    planned = blockmod.planned_block(cfg, 3, context, "selective")
    alloc = planned["allocated_gib"] * 1.04  # within 10%
    inject = {"allocated_gib": alloc, "reserved_gib": alloc * 1.30}  # reserved 1.3x, the plan's 1.05x
    stdout, out = _dry(tmp_path, "block", inject)
    summary = [json.loads(x) for x in (out / "summary.jsonl").read_text().splitlines()]
    assert [(s["part"], s["status"]) for s in summary] == [("block", "ok")]
    got = json.loads((out / "block.json").read_text())
    assert got["dry"] and got["injected"] == ["allocated_gib", "reserved_gib"]
    block = got["parts"]["block"]
    c = block["checks"]
    assert c["peak_allocated"]["verdict"] == "PASS" and c["peak_allocated"]["ratio"] == pytest.approx(1.04)
    assert c["reserved_over_allocated"]["verdict"] == "FAIL"
    assert c["block_time"]["verdict"] == "NOT MEASURED"  # a CPU's time is not judged against the GPU plan
    assert block["measured"]["cpu_block_s"] > 0 and block["verdict"] == "FAIL" and got["verdict"] == "FAIL"
    # the exchange ran: every slot of the tiny block was received, the load uneven (top-4 of 16)
    m = block["measured"]
    assert m["received_rows"] == context * cfg.top_k and m["load_max_over_mean"] > m["load_min_over_mean"]
    assert got["parts"]["router"]["verdict"] == "PASS" and got["parts"]["router"]["same_indices"]
    assert got["parts"]["grouped_gemm"]["verdict"] == "PASS" and got["parts"]["grouped_gemm"]["offsets_equal"]
    assert "block verdict: FAIL (injected: allocated_gib, reserved_gib)" in stdout
    assert re.search(r"block check: FAIL \| matmul -, block FAIL, router PASS, grouped_gemm PASS", stdout)


def test_a_spent_budget_skips_parts_and_says_so(tmp_path):
    stdout, out = _dry(tmp_path, "env,block,train,router", budget=10)
    summary = [json.loads(x) for x in (out / "summary.jsonl").read_text().splitlines()]
    assert [s["part"] for s in summary] == ["env", "block", "train", "router"]
    assert all(s["status"] == "skipped" and "left" in s["why"] for s in summary)
    assert "block.json: none" in stdout


def test_the_gpu_run_fits_one_command_block_first():
    """The device form: the block check first, the parts' limits adding up well under the
    budget, the budget under the 600 s a command may take."""
    text = (ROOT / "bench" / "gpu_all.sh").read_text()
    gpu = text.split("\nelse\n", 1)[1].split("\nfi\n", 1)[0]
    parts = re.findall(r"want (\w+) && part \1 (\d+) ", gpu)
    assert [p for p, _ in parts] == ["env", "block", "train", "router"]
    budget = int(re.search(r"BUDGET=\$\{GPU_BUDGET_S:-(\d+)\}", text).group(1))
    assert sum(int(s) for _, s in parts) < budget <= 480 < 600
    assert "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}" in text
    head = (ROOT / "bench" / "gpu_block_memory.py").read_text().split("import torch", 1)[0]
    assert 'os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")' in head


@pytest.mark.slow_tier
def test_whole_dry_run(tmp_path):
    """Every part of the script at tiny shapes on the CPU (about a minute on two cores)."""
    stdout, out = _dry(tmp_path, "env,block,train,router")
    summary = [json.loads(x) for x in (out / "summary.jsonl").read_text().splitlines()]
    assert [(s["part"], s["status"]) for s in summary] == [(p, "ok") for p in ("env", "block", "train", "router")]
    assert sorted(p.name for p in out.iterdir()) == ["block.json", "block.txt", "env.txt", "router.txt",
                                                    "summary.jsonl", "train.txt"]  # at most 8 files come back
    assert "block check: NOT MEASURED" in stdout  # no memory readings on a CPU, nothing injected


# -- the wheels folder -----------------------------------------------------------------------


def test_wheels_check_finds_each_problem(tmp_path):
    wheels = _load("gpu_wheels")
    folder = tmp_path / "whl"
    folder.mkdir()
    want = {"zstandard": "0.25.0", "pydantic-core": "2.50.5", "dill": "0.4.1"}
    for name in ("zstandard-0.25.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                 "pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl",  # the wrong Python
                 "dill-0.4.0-py3-none-any.whl", "dill-0.4.1-py3-none-any.whl",  # two versions
                 "numpy-2.0.0-cp312-cp312-win_amd64.whl"):  # not wanted
        (folder / name).write_bytes(b"")
    problems = wheels.check(folder, want)
    text = "\n".join(problems)
    assert "pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl: its tags do not install" in text
    assert "dill: 2 wheels" in text and "dill-0.4.0-py3-none-any.whl: version 0.4.0, installed here 0.4.1" in text
    assert "numpy-2.0.0-cp312-cp312-win_amd64.whl: not needed" in text
    assert not any(p.startswith("zstandard") for p in problems)
    assert wheels.check(tmp_path / "absent", {"dill": "0.4.1"}) == [f"dill==0.4.1: no wheel in {tmp_path / 'absent'}"]
    assert wheels.installs_on_device("annotated_types-0.8.0-py3-none-any.whl")
    assert not wheels.installs_on_device("zstandard-0.25.0-cp312-cp312-macosx_11_0_arm64.whl")


@pytest.mark.slow_tier
def test_wheels_needed_are_what_the_device_lacks():
    """The scan of what the GPU scripts import (a fresh interpreter): zstandard and pydantic's
    stack travel, torch and numpy (on the device) do not."""
    wheels = _load("gpu_wheels")
    want = wheels.needed(wheels.device_packages())
    assert {"zstandard", "pydantic", "pydantic-core", "annotated-types", "typing-inspection"} <= set(want)
    assert not {"torch", "numpy", "triton", "fsspec", "marin-voyage"} & set(want)


# -- torch 2.11 ------------------------------------------------------------------------------


def test_capped_dispatch_without_all_gather_single(monkeypatch):
    """The device's torch 2.11 very likely lacks `_functional_collectives.all_gather_single`
    (torch 2.13's name): with it hidden, the capped path falls back to `all_gather_tensor` and
    gives the same outputs, gradients and counts (a 1-rank gloo group in this process)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    from steps.moe.config import PRESETS
    from steps.moe.expert_parallel import AllToAllExperts
    from steps.moe.model import MoE

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = dataclasses.replace(PRESETS["tiny"], rank_capacity_factor=1.25)

        def run():
            torch.manual_seed(0)
            moe = MoE(cfg)
            for p in moe.parameters():
                torch.nn.init.normal_(p, std=0.1)
            moe.experts = AllToAllExperts(dist.group.WORLD, cfg.n_experts)
            x = torch.randn(2, 16, cfg.dim, generator=torch.Generator().manual_seed(1), requires_grad=True)
            y, _ = moe(x)
            y.square().sum().backward()
            return y.detach(), x.grad, moe.experts.received, int(moe.routed_slots)

        newer = run()
        assert hasattr(fc, "all_gather_single")  # torch here is 2.13
        monkeypatch.delattr(fc, "all_gather_single")
        older = run()
        assert torch.equal(newer[0], older[0]) and torch.equal(newer[1], older[1])
        assert newer[2:] == older[2:] == (2 * 16 * cfg.top_k, 2 * 16 * cfg.top_k)
    finally:
        dist.destroy_process_group()
