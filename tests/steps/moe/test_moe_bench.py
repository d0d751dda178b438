"""bench/router.py in its reduced CPU form: the script, its checks and all three implementations run."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_router_bench_cpu_small():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "bench.router", "--device", "cpu", "--small"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "all checks passed" in out
    for impl in ("fused", "eager", "compiled"):
        assert f" {impl} " in out
    assert "copy bandwidth" in out and "targets at T=96, E=64" in out
