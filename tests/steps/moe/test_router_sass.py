"""The router kernels compiled for sm_90 (no GPU needed): what an H200 would run keeps its shape."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_router_kernels_compile_for_sm90_without_spills_or_cross_warp_reductions():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "router_sass.py"), "--check",
                           "--experts", "64", "384"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "check passed" in proc.stdout
    # Both kernels, both score functions, both expert counts, each with its bounds.
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[4:5] in (["fwd"], ["bwd"])]
    assert len(rows) == 8
    for row in rows:
        spilled, issue_us, memory_us = int(row[6]), float(row[-2]), float(row[-1])
        assert spilled == 0 and issue_us > 0 and memory_us > 0
