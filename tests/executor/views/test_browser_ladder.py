"""The live page's ladder panel in headless Chromium (docs/ladder.md "Reading the page"): after a
ladder run, the rung table, loss against compute on log axes with the law, its band and the
target's star, the leave-future-out table, the target's curve against the predicted one, and the
PENDING -> HIT/MISS badge. The ladder is tests/kits/ladderkit.py's synthetic one, run by
the real runner and worker (its rungs' results drawn from a known law; the real fit, predict and
check steps). Needs Debian's `chromium` and `playwright`, as tests/executor/views/test_browser.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from executor.views.live import LivePage  # noqa: E402
from kits import ladderkit  # noqa: E402
from kits.vizkit import replan  # noqa: E402
from kits.browserkit import needs_chromium  # noqa: E402
from test_browser import Opened, browser  # noqa: E402,F401  (the module's browser fixture)

pytestmark = needs_chromium


def run_with_page(steps, prefix):
    plan = replan(steps, prefix)
    page = LivePage(plan, "ladder", "feedbeef", min_interval=0.05, metrics_every=0.05)
    _, summary = ladderkit.run_inline(steps, prefix, on_change=page.start())
    page.close(summary)
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    return page.store.path(page.folder, "index.html")


def test_the_ladder_panel_pending_then_hit(browser, tmp_path):
    prefix = str(tmp_path / "p")
    parts = ladderkit.ladder()
    # sealed, the target trained, not yet checked: PENDING
    path = run_with_page([*parts["evals"], parts["fit"], parts["predict"], parts["train"], parts["eval"]], prefix)
    o = Opened(browser, path)
    assert o.page.is_visible("#ladder")
    assert o.page.inner_text("#ladder-badge") == "PENDING"
    assert "sealed: target predicted" in o.page.inner_text("#ladder .sealed")
    rows = o.page.locator("#ladder-rungs tr").all_inner_texts()
    assert len(rows) == 5 and rows[1].split()[0] == "r0" and rows[4].split()[0] == "r3"  # a header and 4 rungs
    chart = o.page.locator("#ladder svg.lawchart")
    assert chart.locator("circle.rung").count() == 4 and chart.locator("circle.seed").count() == 8
    assert chart.locator("polygon.star").count() == 1 and chart.locator("line.bandbar").count() == 1
    assert chart.locator("polyline.fitline").count() == 1
    lfo = o.page.locator("#ladder-lfo tr").all_inner_texts()
    assert len(lfo) == 2 and lfo[1].split()[:2] == ["3", "r3"]  # fit on r0-r2, predict r3
    target = o.page.locator("#ladder svg.targetchart")
    assert target.locator("polyline.predline").count() == 1 and target.locator("polyline.series").count() == 1
    assert "above the law at 2.6e12 FLOPs" in o.page.inner_text("#ladder .lawref")
    o.shot("ladder-pending.png")
    o.check_clean(path)
    # the check runs: HIT, with the verdict line, and the landed point on both charts
    path = run_with_page(ladderkit.all_steps(parts), prefix)
    o = Opened(browser, path)
    assert o.page.inner_text("#ladder-badge") == "HIT"
    line = o.page.inner_text("#ladder .verdict")
    assert line.startswith("HIT: predicted ") and "; landed " in line
    assert o.page.locator("#ladder svg circle.landed").count() == 2
    o.shot("ladder-hit.png")
    o.check_clean(path)


def test_a_miss_shows_its_badge(browser, tmp_path):
    prefix = str(tmp_path / "p")
    far = ladderkit.law(ladderkit.TARGET_COMPUTE) * 1.08
    path = run_with_page(ladderkit.all_steps(ladderkit.ladder(landed=far)), prefix)
    o = Opened(browser, path)
    assert o.page.inner_text("#ladder-badge") == "MISS"
    assert o.page.inner_text("#ladder .verdict").startswith("MISS: ")
    o.check_clean(path)
