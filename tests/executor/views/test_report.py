"""The terminal plan and summary: grouped by state with counts, readable at 10 and at 1,000 steps."""

import io
import os
import sys


from kits.vizkit import replan, run_inline, small_voyage, synthetic_plan  # noqa: E402

from executor.views import report  # noqa: E402
from executor.runner import Outcome, RunSummary  # noqa: E402


def printed(plan, **kwargs):
    out = io.StringIO()
    report.print_plan(plan, out, **kwargs)
    return out.getvalue()


def test_ten_steps_one_line_each_with_path_resources_and_reason(tmp_path):
    prefix = str(tmp_path / "p")
    run_inline(small_voyage(), prefix)
    plan = replan(small_voyage(value="A2"), prefix)
    text = printed(plan)
    lines = text.splitlines()
    assert lines[0] == f"plan of 6 steps under {prefix}: RUN 4  CACHED 2"
    assert "RUN 4  no output yet" in lines and "CACHED 2  output exists" in lines
    a = next(line for line in lines if line.startswith("data/a "))
    assert "1 cpu" in a and plan.store.url(plan.dag["data/a"].dirname) in a and 'config.value: "A" -> "A2"' in a
    ab = next(line for line in lines if line.startswith("join/ab "))
    assert "input data/a re-addressed" in ab
    assert all(line == line.rstrip() for line in lines)  # no padding left by the table
    assert text.index("RUN 4") < text.index("CACHED 2")  # what will run first


def test_a_thousand_steps_fit_on_a_screen(tmp_path):
    prefix = str(tmp_path / "v")
    plan = synthetic_plan(1000, prefix)
    text = printed(plan)
    lines = text.splitlines()
    assert lines[0] == f"plan of 1,000 steps under {prefix}: RUN 329  STALE 33  RETRY 7  CACHED 630  SKIPPED 1"
    assert len(lines) < 70
    dedup = next(line for line in lines if line.startswith("dedup/* "))
    assert "x 324" in dedup and f"{prefix}/dedup/*" in dedup and "config.threshold: 0.8 -> 0.85" in dedup
    cached = next(line for line in lines if line.startswith("raw/* "))
    assert "x 331" in cached
    assert any(line.startswith("pretrain ") and "4 x (1 cpu, 8 gpu)" in line for line in lines)
    # 33 STALE steps are under the threshold: each is listed, with both digests in its reason
    assert sum(line.startswith("tokenized/") and "output changed" in line for line in lines) == 33


def test_grouping_coarsens_until_the_rows_fit(tmp_path):
    from executor.plan import Decision, Plan

    plan = synthetic_plan(100, "/tmp/x")
    many = [Decision(d.node, "RUN", "r", will_run=True) for d in plan.decisions]
    for k, d in enumerate(many):  # 100 distinct prefixes a/k/leaf: by parent they would be 100 rows
        d.node.step.name = f"a/{k}/leaf"
    text = printed(Plan(plan.dag, plan.store, many))
    assert "a/*" in text and len(text.splitlines()) < 10


def test_unplaceable_steps_are_flagged(tmp_path):
    plan = replan(small_voyage(), str(tmp_path / "p"))
    text = printed(plan, unplaceable={"model": "needs 8 GPU, the largest node has 0"})
    line = next(line for line in text.splitlines() if line.startswith("model "))
    assert "CANNOT BE PLACED: needs 8 GPU" in line
    assert "1 step(s) cannot be placed" in text


def test_summary_lists_failures_with_their_record_and_groups_successes(tmp_path):
    prefix = str(tmp_path / "p")
    plan, summary = run_inline(small_voyage(fail=True), prefix)
    out = io.StringIO()
    report.print_summary(summary, plan, out, page="file:///page/index.html")
    text = out.getvalue()
    assert "FAILED 1" in text and "SUCCESS 5" in text
    assert "RuntimeError: this step fails on purpose" in text
    status = plan.store.read_status(plan.dag["join/abc"].dirname)  # the failed attempt's own record
    assert f"record: {plan.store.url(status.data_dir(plan.dag['join/abc'].dirname))}/.step.json" in text
    assert "voyage page: file:///page/index.html" in text

    big = synthetic_plan(1000, "/tmp/x")
    outcomes = {d.name: Outcome(d.name, "SUCCESS", started=0.0, ended=1.0) for d in big.decisions}
    out = io.StringIO()
    report.print_summary(RunSummary(outcomes=outcomes, seconds=12.0), big, out)
    lines = out.getvalue().splitlines()
    assert len(lines) < 50 and any("tokenized/* x 331" in line and "331.0s" in line for line in lines)


def _tables(plan, unplaceable):
    tables = []
    for state in report.STATES:
        group = [d for d in plan.decisions if d.state == state]
        if group:
            tables.append((state, len(group), report._plan_rows(plan, state, group, unplaceable)))
    return tables


def _through_rich(plan, unplaceable=None):
    """The plan as rich draws it on a non-terminal (what a pipe got before the plain layout)."""
    out = io.StringIO()
    report._rich_plan(report.console_for(out), plan, _tables(plan, unplaceable or {}), unplaceable or {},
                      relative=False)
    return out.getvalue()


def test_a_piped_plan_is_laid_out_as_rich_lays_it_out(tmp_path):
    prefix = str(tmp_path / "p")
    run_inline(small_voyage(), prefix)
    plans = [(replan(small_voyage(value="A2"), prefix), None),
             (replan(small_voyage(), prefix), {"model": "needs 8 GPU, the largest node has 0"}),
             (synthetic_plan(1000, str(tmp_path / "v")), None)]
    big = synthetic_plan(100, str(tmp_path / "w"))
    plans.append((big, {d.name: "needs 1 TPU" for d in big.decisions[::3]}))
    for plan, unplaceable in plans:
        assert report._plain_plan(plan, _tables(plan, unplaceable or {}), unplaceable or {}) is not None
        assert printed(plan, unplaceable=unplaceable) == _through_rich(plan, unplaceable)


def test_a_plan_rich_would_lay_out_otherwise_still_goes_through_rich(tmp_path):
    from executor.plan import Plan

    plan = replan(small_voyage(value="A2"), str(tmp_path / "p"))
    for reason in ("a wide character: 模型 -> 模型2", "a line\nbreak", "a\ttab", "long " * 250):
        d = plan.decisions[0]
        d.reason = reason
        text = printed(Plan(plan.dag, plan.store, plan.decisions))
        assert text == _through_rich(plan)
        assert report._plain_plan(plan, _tables(plan, {}), {}) is None


def test_where_rich_is_told_the_output_is_a_terminal_rich_still_draws_it(tmp_path, monkeypatch):
    """FORCE_COLOR (or TTY_COMPATIBLE) makes rich treat a pipe as a terminal: paths relative to the
    prefix, as before the plain layout existed."""
    plan = replan(small_voyage(), str(tmp_path / "p"))
    monkeypatch.setenv("FORCE_COLOR", "1")
    text = printed(plan)
    assert f"{plan.dag['data/a'].dirname}" in text and plan.store.url(plan.dag["data/a"].dirname) not in text
    monkeypatch.delenv("FORCE_COLOR")
    assert plan.store.url(plan.dag["data/a"].dirname) in printed(plan)


def test_a_plan_exactly_as_wide_as_a_pipe_line_and_one_wider(tmp_path):
    """At the width where rich starts folding the reason column, the plain layout hands over."""
    from executor.plan import Plan

    plan = replan(small_voyage(value="A2"), str(tmp_path / "p"))
    first = plan.decisions[0]
    rows = next(rows for _, _, rows in _tables(plan, {}) if any(r.step == first.name for r in rows))
    others = sum(max(len(getattr(r, f)) for r in rows) for f in ("step", "count", "resources", "path"))
    for over in (-1, 0, 1):  # the line's width: the columns, 2 spaces between each, the reason last
        first.reason = "r" * (report.PIPE_WIDTH - others - 8 + over)
        plain = report._plain_plan(plan, _tables(plan, {}), {})
        assert (plain is None) == (over > 0)
        assert printed(Plan(plan.dag, plan.store, plan.decisions)) == _through_rich(plan)
