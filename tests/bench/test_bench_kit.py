"""The bench package: every script imports as bench.NAME, bench.kit's `timed` counts what it is
asked to and `emit` appends exactly one JSON line per call (none for a figure that is not JSON),
and bench.report turns those lines into a table or refuses bad input with one line and exit 2."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from bench import kit, report

ROOT = pathlib.Path(__file__).resolve().parents[2]
# router_sass needs triton's CUDA backend at import; router parses its arguments at import (its
# --device must set TRITON_INTERPRET before triton loads), so it is checked through --help instead.
GPU_ONLY = {"router_sass"}
ARGS_AT_IMPORT = {"router"}
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


@pytest.fixture
def environ_kept():
    """Some scripts set variables at import (router_sass: TRITON_INTERPRET=0, data_minhash: one
    OpenMP thread); the tests after this one must not inherit them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_bench_script_imports_as_a_module(name, environ_kept):
    if name in ARGS_AT_IMPORT:
        out = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], cwd=ROOT, capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
        return
    if name in GPU_ONLY:
        pytest.importorskip("triton.backends.nvidia")
    module = importlib.import_module(f"bench.{name}")
    assert module.__name__ == f"bench.{name}"


def test_a_script_shows_help_both_ways():
    """`python -m bench.NAME` from the root, and `python bench/NAME.py` (the root in place of bench/,
    so that bench/gc.py does not shadow the stdlib's gc)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    for cmd in ([sys.executable, "-m", "bench.report", "--help"], [sys.executable, "bench/report.py", "--help"]):
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        assert out.returncode == 0 and "usage:" in out.stdout, (cmd, out.stderr)


def test_timed_counts_warmups_and_repeats_and_reports_wall_and_cpu():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.01)
        return len(calls)

    t = kit.timed(fn, repeats=3, warmup=2)
    assert len(calls) == 5 and t.value == 5 and len(t.wall) == len(t.cpu) == 3
    assert t.wall_min >= 0.009 and t.wall_min <= t.wall_median
    assert t.cpu_median < t.wall_median  # a sleep is wall time, not CPU time
    figures = t.figures("x_")
    assert set(figures) == {"x_wall_min_s", "x_wall_median_s", "x_cpu_min_s", "x_cpu_median_s"}
    for bad in ({"repeats": 0}, {"warmup": -1}):
        with pytest.raises(ValueError):
            kit.timed(fn, **bad)


def test_emit_appends_one_json_line_per_call_and_nothing_for_a_bad_figure(tmp_path, monkeypatch, capsys):
    out = tmp_path / "deep" / "r.jsonl"
    monkeypatch.setenv("BENCH_OUT", str(out))
    kit.emit("chain 1k", script="plan", steps=1000, total_s=0.047)
    kit.emit("chain 10k", script="plan", steps=10000, total_s=0.366)
    assert "chain 1k  steps=1,000  total_s=0.047" in capsys.readouterr().out
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["bench"], r["name"], r["steps"]) for r in rows] == [("plan", "chain 1k", 1000),
                                                                   ("plan", "chain 10k", 10000)]
    with pytest.raises(TypeError):
        kit.emit("bad", script="plan", figure=object())
    with pytest.raises(ValueError, match="host"):
        kit.emit("bad", script="plan", host="elsewhere")
    assert len(out.read_text().splitlines()) == 2
    monkeypatch.delenv("BENCH_OUT")
    assert kit.results_path("plan") == ROOT / "bench" / "results" / "plan.jsonl"


def test_report_makes_a_table_from_the_lines_and_keeps_the_latest(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.jsonl"
    monkeypatch.setenv("BENCH_OUT", str(out))
    kit.emit("a", script="s", quiet=True, ms=1.5, n=1000)
    kit.emit("b", script="s", quiet=True, ms=2.0, note="x|y")
    kit.emit("a", script="s", quiet=True, ms=1.25, n=2000)
    assert report.main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| name | ms | n | note |", "|---|---:|---:|---|"]
    assert lines[2:] == ["| a | 1.5 | 1,000 |  |", "| b | 2 |  | x\\|y |", "| a | 1.25 | 2,000 |  |"]
    assert report.main([str(out), "--latest", "--columns", "name,n"]) == 0
    assert capsys.readouterr().out.splitlines()[2:] == ["| a | 2,000 |", "| b |  |"]


def test_report_refuses_bad_input_with_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "a", "x": 1}\nnot json\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nameless = tmp_path / "nameless.jsonl"
    nameless.write_text("[1, 2]\n")
    for args, says in (([str(bad)], "bad.jsonl:2: not a JSON line"),
                       ([str(tmp_path / "none.jsonl")], "no such results file"),
                       ([str(empty)], "no rows"), ([str(nameless)], "nameless.jsonl:1: not an emitted row")):
        assert report.main(args) == 2
        err = capsys.readouterr()
        assert err.out == "" and says in err.err and len(err.err.strip().splitlines()) == 1, err
