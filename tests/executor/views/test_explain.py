"""`--explain NAME`: the digest tree, the leaf that changed, what it re-addresses, bad names."""

import io
import os
import sys


from kits.vizkit import replan, run_inline, small_voyage, synthetic_plan  # noqa: E402

from executor.cli import main  # noqa: E402
from executor.views.explain import explain  # noqa: E402
from executor.identity import SCHEME  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HELLO = os.path.join(ROOT, "voyages", "hello.py")


def explained(plan, name):
    out = io.StringIO()
    explain(plan, name, out)
    return out.getvalue()


def test_digest_tree_and_the_upstream_leaf_that_changed(tmp_path):
    prefix = str(tmp_path / "p")
    run_inline(small_voyage(value="A"), prefix)
    plan = replan(small_voyage(value="A2"), prefix)
    text = explained(plan, "join/abc")
    node = plan.dag["join/abc"]
    assert f"digest   {node.digest}" in text and f"scheme   {SCHEME}" in text and "join@1" in text
    tree = text[text.index("digest tree"):text.index("changes")]
    for name in ("join/abc", "join/ab", "data/a", "data/b"):
        assert f"{name}  {plan.dag[name].digest[:10]}" in tree
    assert "(shown above)" in tree  # data/b is an input of both joins: its subtree is drawn once
    old_ab = [i for i in plan.store.newest_sibling_record("join/abc").inputs if i.name == "join/ab"][0].digest
    assert f"join/abc: input join/ab re-addressed {old_ab[:10]} -> {plan.dag['join/ab'].digest[:10]}" in text
    assert 'data/a: config.value: "A" -> "A2"' in text  # the leaf, found two levels up
    assert "downstream: none" in text


def test_own_leaf_change_and_the_steps_it_re_addresses(tmp_path):
    prefix = str(tmp_path / "p")
    run_inline(small_voyage(value="A"), prefix)
    text = explained(replan(small_voyage(value="A", note="new"), prefix), "data/a")
    assert 'data/a: config.note: (absent) -> "new"' in text or 'config.note: "" -> "new"' in text
    assert "downstream: 3 step(s)" in text
    assert "join/ab, join/abc, model" in text


def test_no_earlier_output(tmp_path):
    text = explained(replan(small_voyage(), str(tmp_path / "p")), "lone")
    assert "no earlier output of lone" in text


def test_unknown_name_is_exit_2_with_the_closest_names(tmp_path, capsys):
    code = main([HELLO, "--explain", "hello/merj", "--prefix", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "no step named 'hello/merj'" in err[0] and "closest: hello/merge" in err[0]
    assert not (tmp_path / "p").exists()


def test_cli_explain_runs_nothing(tmp_path, capsys):
    code = main([HELLO, "--explain", "hello/report", "--prefix", str(tmp_path / "p"), "--n_files", "2"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("hello/report  report@1  RUN") and "hello/text/1" in out
    assert not (tmp_path / "p").exists()


def test_the_tree_stays_compact_for_a_wide_fan_in(tmp_path):
    plan = synthetic_plan(1000, str(tmp_path))
    text = explained(plan, "eval/mmlu")
    assert "... and 328 more: dedup/* x 328" in text
    assert len(text.splitlines()) < 40
