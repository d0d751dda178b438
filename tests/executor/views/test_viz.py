"""`--viz FILE.{dot,svg,mmd,html}`: formats, grouping at scale, STALE marking, bad input, escaping."""

import json
import os
import re
import shutil
import sys

import pytest


from kits.vizkit import Selection, replan, run_inline, small_voyage, synthetic_plan  # noqa: E402

from executor.cli import main  # noqa: E402
from executor.views.viz import graph, render, write_viz  # noqa: E402
from executor.views.viz.graph import GROUP_MIN, LAYOUT_MAX, group_boxes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HELLO = os.path.join(ROOT, "voyages", "hello.py")


def page_data(html_text: str, block: str = "voyage-data") -> dict:
    found = re.search(rf'<script type="application/json" id="{block}">(.*?)</script>', html_text, re.S)
    assert found, block
    return json.loads(found.group(1))


@pytest.fixture
def stale_plan(tmp_path):
    """small_voyage after `--rerun data/a` changed a's output: join/ab is STALE."""
    salt = tmp_path / "salt"
    salt.write_text("1")
    prefix = str(tmp_path / "p")
    run_inline(small_voyage(salt_file=str(salt)), prefix)
    salt.write_text("2")
    run_inline(small_voyage(salt_file=str(salt)), prefix, Selection(rerun=("data/a",)))
    return replan(small_voyage(salt_file=str(salt)), prefix)


@pytest.mark.parametrize("ext", [".dot", ".mmd", ".html", ".svg"])
def test_cli_draws_each_format_and_runs_nothing(tmp_path, capsys, ext):
    if ext == ".svg" and shutil.which("dot") is None:
        pytest.skip("graphviz `dot` is not installed")
    prefix, target = tmp_path / "prefix", tmp_path / f"plan{ext}"
    code = main([HELLO, "--viz", str(target), "--prefix", str(prefix), "--n_files", "3"])
    out = capsys.readouterr().out
    assert code == 0 and f"drew 8 steps to {target}" in out
    assert not prefix.exists()
    text = target.read_text()
    for i in range(3):
        assert f"hello/count/{i}" in text
    assert {"dot": "digraph", "mmd": "flowchart LR", "html": "<!doctype html>", "svg": "<svg"}[ext[1:]] in text


def test_html_is_one_file_with_no_network(tmp_path):
    target = tmp_path / "plan.html"
    assert main([HELLO, "--viz", str(target), "--prefix", str(tmp_path / "p")]) == 0
    text = target.read_text()
    assert "Content-Security-Policy" in text and "default-src 'none'" in text and "connect-src" not in text
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\((?!#)", text, re.I)  # url(#arrow) is in-page
    assert "Copyright (c) 2012-2014 Chris Pettitt" in text  # the vendored layout library, with its licence
    assert len(page_data(text)["steps"]) == 10  # hello's default 4 files: 4 text, 4 count, merge, report


def test_unknown_extension_is_exit_2_with_one_line(tmp_path, capsys):
    code = main([HELLO, "--viz", str(tmp_path / "plan.png"), "--prefix", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "unknown format '.png'" in err[0] and ".html" in err[0] and ".mmd" in err[0]
    assert not (tmp_path / "plan.png").exists()


def test_svg_without_graphviz_is_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    import executor.views.viz.text as text

    monkeypatch.setattr(text.shutil, "which", lambda name: None)
    code = main([HELLO, "--viz", str(tmp_path / "plan.svg"), "--prefix", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "graphviz" in err[0] and "apt-get install graphviz" in err[0]


def test_stale_steps_are_marked_with_the_input_and_both_digests(stale_plan):
    d = stale_plan["join/ab"]
    assert d.state == "STALE" and len(d.stale_inputs) == 1
    s = d.stale_inputs[0]
    assert s.name == "data/a" and len(s.recorded) == 64 and s.recorded != s.current
    dot = render(stale_plan, ".dot").decode()
    assert f"input data/a: {s.recorded[:10]} → {s.current[:10]}" in dot
    assert re.search(r'b\d+ \[label="join/ab\\n[^]]*style="rounded,filled,dashed"', dot)
    assert "output changed" in dot and "legend_STALE" in dot
    mmd = render(stale_plan, ".mmd").decode()
    assert f"input data/a: {s.recorded[:10]} → {s.current[:10]}" in mmd and ":::STALE" in mmd and "-.->" in mmd
    data = page_data(render(stale_plan, ".html").decode())
    step = next(x for x in data["steps"] if x["name"] == "join/ab")
    assert step["stale"] == [{"input": "data/a", "recorded": s.recorded, "current": s.current}]
    assert step["record"]["output_digest"] and step["record"]["attempts"][0]["state"] == "SUCCESS"
    assert any(link[3] for link in data["links"])  # the link from the changed input is marked


def test_large_fanouts_are_grouped_but_every_step_is_kept(tmp_path):
    plan = synthetic_plan(1000, str(tmp_path))
    drawing = graph.draw(plan, records=False)
    assert len(drawing.boxes) < 20
    members = sorted(m for b in drawing.boxes for m in b.members)
    assert members == list(range(len(plan.decisions)))
    labels = {b.label: len(b.members) for b in drawing.boxes if b.is_group}
    assert labels == {"raw/*": 331, "tokenized/*": 331, "dedup/*": 331}
    dot = render(plan, ".dot").decode()
    assert "tokenized/*  (331 steps)" in dot and "STALE 33 · CACHED 298" in dot


def test_small_sibling_sets_are_not_grouped():
    names = [f"a/{i}" for i in range(GROUP_MIN - 1)]
    assert all(not b.is_group for b in group_boxes(names, [[] for _ in names]))
    names = [f"a/{i}" for i in range(GROUP_MIN)]
    assert [b.label for b in group_boxes(names, [[] for _ in names])] == ["a/*"]


@pytest.mark.parametrize("shape", ["chain", "flat"])
def test_layout_boxes_stay_bounded_at_10000_steps(shape):
    n = 10_000
    if shape == "chain":
        names, deps = [f"chain/s{i}" for i in range(n)], [[i - 1] if i else [] for i in range(n)]
    else:  # top-level names, no shared prefix, random-ish fan-in
        names, deps = [f"s{i}" for i in range(n)], [[(i * 7919) % i] if i else [] for i in range(n)]
    boxes = group_boxes(names, deps)
    assert len(boxes) <= LAYOUT_MAX
    assert sorted(m for b in boxes for m in b.members) == list(range(n))


def test_a_script_in_a_config_stays_text(tmp_path):
    evil = "</script><script>alert('x')</script><!--"
    prefix = str(tmp_path / "p")
    run_inline(small_voyage(note="ok"), prefix)
    plan = replan(small_voyage(note=evil), prefix)  # the reason quotes the new value too
    assert "<script>" in plan["data/a"].reason
    text = render(plan, ".html").decode()
    assert "<script>alert" not in text and "<!--" not in text
    step = next(s for s in page_data(text)["steps"] if s["name"] == "data/a")
    assert step["config"]["note"] == evil and "<script>" in step["reason"]
    mmd = render(plan, ".mmd").decode()
    assert "<script>" not in mmd and "#lt;script#gt;" in mmd
    if shutil.which("dot"):
        svg = render(plan, ".svg").decode()
        assert "<script>alert" not in svg and "&lt;script&gt;" in svg


def test_write_viz_to_an_fsspec_url(tmp_path):
    plan = replan(small_voyage(), str(tmp_path / "p"))
    assert write_viz(plan, "memory://drawings/plan.mmd") == ".mmd"
    import fsspec

    with fsspec.open("memory://drawings/plan.mmd", "r") as f:
        assert f.read().startswith('---\ntitle: "plan: 6 steps under ')
