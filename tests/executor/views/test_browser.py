"""The HTML pages in headless Chromium: they render every step, a click shows its config, a
`<script>` in a config stays text, no console errors and no network. Screenshots are kept under
`.artifacts/browser/` (git-ignored) for a person to look at.

Needs Debian's `chromium` (CI installs it with apt) and the `playwright` package, which drives it
over the DevTools protocol; `playwright install` (a browser download) is never needed.
"""

import json
import os
import time
from dataclasses import dataclass

import pytest

from executor import step_type


from kits.vizkit import Selection, replan, run_inline, small_voyage, synthetic_plan  # noqa: E402

from executor.views.live import LivePage  # noqa: E402
from executor.runner import Outcome  # noqa: E402
from executor.views.viz import write_viz  # noqa: E402

from kits.browserkit import ARGS, ARTIFACTS, CHROMIUM, needs_chromium, serve  # noqa: E402

EVIL = "</script><script>alert('x')</script>"

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Opened:
    """A page loaded from a file, with what it logged, asked for and popped up."""

    def __init__(self, browser, path_or_url):
        self.page = browser.new_page(viewport={"width": 1400, "height": 850})
        self.errors, self.requests, self.dialogs = [], [], []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        url = path_or_url if "://" in str(path_or_url) else "file://" + os.path.abspath(path_or_url)
        self.page.goto(url)
        # selectors, not wait_for_function: the page's CSP forbids the eval that would need
        self.page.wait_for_selector("html[data-drawn]", state="attached", timeout=60_000)

    def info(self):
        return self.page.evaluate("window.voyagePage")

    def click_step(self, plan, name):
        if self.page.is_visible("#details"):  # close the details and see the whole plan again
            self.page.click("#details .close")
            self.page.click("#fit")
        index = [d.name for d in plan.decisions].index(name)
        self.page.locator(f'#boxes [data-step="{index}"]').click()
        self.page.wait_for_selector("#details:not([hidden])")
        return self.page.inner_text("#details")

    def shot(self, name):
        os.makedirs(ARTIFACTS, exist_ok=True)
        self.page.screenshot(path=os.path.join(ARTIFACTS, name))

    def check_clean(self, path):
        assert self.errors == [], self.errors
        assert self.dialogs == []
        assert [u for u in self.requests if not u.startswith("file://")] == []
        assert self.requests == ["file://" + os.path.abspath(path)]  # the page itself, nothing else
        self.page.close()


def test_plan_page_draws_every_step_and_shows_a_config_on_click(browser, tmp_path):
    salt, prefix = tmp_path / "salt", str(tmp_path / "p")
    salt.write_text("1")
    run_inline(small_voyage(salt_file=str(salt), fail=True, note=EVIL), prefix)  # join/abc fails
    salt.write_text("2")
    run_inline(small_voyage(salt_file=str(salt), fail=True, note=EVIL), prefix, Selection(rerun=("data/a",)))
    plan = replan(small_voyage(salt_file=str(salt), fail=True, note=EVIL), prefix)
    assert plan["join/ab"].state == "STALE" and plan["join/abc"].state == "RETRY"
    path = tmp_path / "plan.html"
    write_viz(plan, str(path), title="small")
    o = Opened(browser, path)
    info = o.info()
    assert info["steps"] == info["drawn"] == len(plan.decisions) == 6
    assert o.page.locator("#boxes [data-step]").count() == 6
    assert o.page.locator("#legend .chip").all_inner_texts() == ["STALE 1", "RETRY 1", "CACHED 4"]

    details = o.click_step(plan, "data/a")
    assert plan.dag["data/a"].digest in details and "make@1" in details and "1 cpu" in details
    assert EVIL in o.page.inner_text("#details pre.config")  # shown as text ...
    assert o.page.evaluate("document.scripts.length") == 3  # ... and never parsed: data, dagre, page
    assert '"output_digest"' in o.page.inner_text("#details pre.record")

    details = o.click_step(plan, "join/ab")
    s = plan["join/ab"].stale_inputs[0]
    assert "changed inputs" in details.lower() and s.recorded[:16] in details and s.current[:16] in details
    assert o.page.locator("#links path.stale").count() == 1
    o.shot("plan-stale.png")

    details = o.click_step(plan, "join/abc")
    assert "RETRY" in details and "RuntimeError: this step fails on purpose" in details
    o.check_clean(path)


def test_a_thousand_steps_in_groups_search_pan_and_zoom(browser, tmp_path):
    plan = synthetic_plan(1000, str(tmp_path / "p"))
    path = tmp_path / "plan.html"
    write_viz(plan, str(path), title="synthetic")
    o = Opened(browser, path)
    info = o.info()
    assert info["steps"] == info["drawn"] == 1000 and info["boxes"] == 10
    assert o.page.locator("#boxes .group").count() == 3
    o.shot("plan-1000.png")

    o.page.fill("#search", "dedup/7")
    assert o.page.inner_text("#found") == "11 found"  # dedup/7 and dedup/70 .. dedup/79
    o.page.press("#search", "Enter")
    assert o.page.inner_text("#details h2") == "dedup/7"
    o.page.locator('#legend [data-state="RETRY"]').click()  # show only these
    assert o.page.get_attribute("#dag", "data-only") == "RETRY"

    o.page.click("#fit")
    fitted = o.page.get_attribute("#viewport", "transform")
    o.page.mouse.move(400, 400)
    o.page.mouse.wheel(0, -600)
    zoomed = o.page.get_attribute("#viewport", "transform")
    assert zoomed != fitted and _scale(zoomed) > _scale(fitted)
    o.page.mouse.down()
    o.page.mouse.move(200, 300, steps=5)
    o.page.mouse.up()
    assert o.page.get_attribute("#viewport", "transform") != zoomed
    o.page.click("#fit")
    assert o.page.get_attribute("#viewport", "transform") == fitted
    o.check_clean(path)


def test_live_page_shows_states_durations_and_training_curves(browser, tmp_path):
    prefix = str(tmp_path / "p")
    plan = replan(small_voyage(fail=True), prefix)
    page = LivePage(plan, "small", "feedbeef", min_interval=0.05)
    _, summary = run_inline(small_voyage(fail=True), prefix, on_change=page.start())
    page.close(summary)
    path = page.store.path(page.folder, "index.html")
    o = Opened(browser, path)
    assert o.info()["drawn"] == 6
    assert o.page.locator("#legend .chip").all_inner_texts() == ["FAILED 1", "SUCCESS 5"]
    assert "finished" in o.page.inner_text("#summary")
    assert o.page.is_visible("#curves")
    titles = o.page.locator("#curves svg.chart .ctitle").all_text_contents()
    assert titles == ["loss", "lr", "tokens_per_s", "expert_load"]
    assert o.page.locator("#curves svg.chart polyline").count() == 5  # expert load: max and min
    details = o.click_step(plan, "model")
    assert "SUCCESS" in details and "attempts" in details and "training curves" in details.lower()
    o.shot("live.png")
    o.check_clean(path)


def test_a_published_live_page_follows_the_run(browser, tmp_path):
    """Served over http (as a public bucket serves it), the page re-reads voyage.json as the run goes."""
    prefix = str(tmp_path / "p")
    plan = replan(small_voyage(), prefix)
    page = LivePage(plan, "small", "feedbeef", min_interval=0.05, metrics_every=0.05, poll_every=0.2).start()
    server, base = serve(prefix)
    try:
        url = f"{base}{page.folder}/index.html"
        o = Opened(browser, url)
        assert o.page.locator("#legend .chip").all_inner_texts() == ["PENDING 6"]
        started = time.time()
        page(Outcome("model", "RUNNING", started=started))
        model_dir = os.path.join(prefix, plan.dag["model"].dirname)
        os.makedirs(model_dir)
        with open(os.path.join(model_dir, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps({"step": s, "loss": 5.0 / s, "lr": 1e-4}) + "\n" for s in range(1, 30))
        o.page.wait_for_selector("#legend .chip.s-RUNNING", timeout=10_000)
        o.page.wait_for_selector("#curves svg.chart", timeout=10_000)
        assert "running" in o.page.inner_text("#summary")
        o.shot("live-running.png")
        for d in plan.decisions:
            page(Outcome(d.name, "SUCCESS", started=started, ended=time.time(), attempts=1))
        page.close()
        o.page.wait_for_selector("#legend .chip.s-SUCCESS", timeout=10_000)
        assert "finished" in o.page.inner_text("#summary")
        assert o.page.locator("#legend .chip").all_inner_texts() == ["SUCCESS 6"]
        assert o.errors == [] and all(u.startswith(f"http://127.0.0.1:{server.server_port}/") for u in o.requests)
        assert any(u.endswith("/voyage.json") for u in o.requests)
        o.page.close()
    finally:
        server.shutdown()


def _scale(transform: str) -> float:
    return float(transform.rsplit("scale(", 1)[1].rstrip(")"))


def _marked(o, plan, cls):
    names = [d.name for d in plan.decisions]
    found = o.page.eval_on_selector_all(f"#boxes .{cls}[data-step]", "els => els.map(e => +e.dataset.step)")
    return sorted(names[i] for i in found)


def test_selecting_a_step_highlights_its_lineage_both_ways_with_licences(browser, tmp_path):
    """In the plan drawing and the live page, a selected step marks everything it was
    built from (`up`) and everything built from it (`down`), transitively, and the details name
    the licences reaching it, a source's own licence and a step's policy."""
    from tests.executor.test_lineage import voyage as licensed_voyage

    prefix = str(tmp_path / "p")
    plan = replan(small_voyage(), prefix)
    path = tmp_path / "plan.html"
    write_viz(plan, str(path), title="small")
    o = Opened(browser, path)
    o.click_step(plan, "join/ab")
    assert _marked(o, plan, "sel") == ["join/ab"]
    assert _marked(o, plan, "up") == ["data/a", "data/b"]
    assert _marked(o, plan, "down") == ["join/abc", "model"]
    assert "2 upstream (blue), 2 downstream (green)" in o.page.inner_text("#details")
    o.click_step(plan, "data/b")  # the marks move with the selection
    assert _marked(o, plan, "up") == [] and _marked(o, plan, "down") == ["join/ab", "join/abc", "model"]
    o.check_clean(path)

    steps = licensed_voyage()
    live_plan = replan(steps, str(tmp_path / "q"))
    page = LivePage(live_plan, "licensed", "feedbeef", min_interval=0.05)
    _, summary = run_inline(steps, str(tmp_path / "q"), on_change=page.start())
    page.close(summary)
    live = page.store.path(page.folder, "index.html")
    o = Opened(browser, live)
    details = o.click_step(live_plan, "train")
    assert "licences\nCC-BY-SA-4.0, NVIDIA data agreement" in details
    assert _marked(o, live_plan, "up") == ["mix", "raw/web", "raw/wiki"]
    assert _marked(o, live_plan, "down") == ["release"]
    details = o.click_step(live_plan, "raw/web")
    assert "source licence\nNVIDIA data agreement <https://example.org/nvidia>" in details
    details = o.click_step(live_plan, "wiki-model")
    assert "policy\nopen licences only" in details and '"licenses": [' in details  # the record's provenance
    o.shot("live-lineage.png")
    o.check_clean(live)


REWIND_ROWS = 12  # logged rows (every 5 steps): a rewind at step 32 back to step-20's checkpoint


@dataclass(frozen=True)
class Rewinding:
    marker: str  # a folder: its files say which attempts already failed


@step_type(version="1", resumable=True, logs=("metrics.jsonl",))
def rewinding(config: Rewinding, ctx) -> None:
    """Fails once as a hang and once non-finite (as the trainer's watchdog and guard classify
    them), then writes the metrics.jsonl the trainer writes around a spike rewind: step-20's
    checkpoint restored at step 32, the tokens counted again from step 20's, and the row logged
    across the rewind with negative throughput (the tokens it went back, over its seconds)."""
    from executor import Hang, NonFinite

    for name, error in (("hang", Hang("no optimizer step finished within 6s")),
                        ("nan", NonFinite("loss is nan at step 7"))):
        if not os.path.exists(os.path.join(config.marker, name)):
            open(os.path.join(config.marker, name), "w").close()
            raise error
    rows, tokens, per_step = [], 0, 512
    for step in range(5, 5 * REWIND_ROWS + 1, 5):
        before = tokens
        tokens = step * per_step if step <= 30 else (20 + step - 32) * per_step  # back to step 20's after 32
        row = {"step": step, "loss": 6.0 - step / 30, "tokens": tokens, "lr": 0.01,
               "tokens_per_s": (tokens - before) / 0.5, "mfu": (tokens - before) / 1e5}
        if step == 35:
            row["events"] = [{"step": 32, "kind": "rewind", "to_step": 20, "skipped": [20, 32], "loss": 9.1}]
        rows.append(json.dumps(row))
    with ctx.open("metrics.jsonl", "w") as f:
        f.write("\n".join(rows) + "\n")


def test_the_page_after_a_rewind_and_failed_attempts(browser, tmp_path):
    """The page after a rewind: the rewound stretch is shaded (by step on each chart, by tokens on the
    overview, where the curve is cut rather than drawn back), no rate below zero, and the class of
    every failed attempt on the step's node, in its details and in the run's list."""
    from executor import RetryPolicy, Step
    from executor.failures import Budget
    from executor.runner import Runner
    from executor.testing import InlineBackend

    prefix, marker = str(tmp_path / "p"), tmp_path / "marker"
    marker.mkdir()
    retry = RetryPolicy(budgets={"hang": Budget(1, 0.0), "non_finite": Budget(1, 0.0)})
    steps = [Step("pretrain/tiny", rewinding, Rewinding(str(marker)), retry=retry)]
    plan = replan(steps, prefix)
    page = LivePage(plan, "rewind", "0ddba11", min_interval=0.05)
    summary = Runner(plan, InlineBackend(), poll=0.01, on_change=page.start()).run()
    page.close(summary)
    assert summary.outcomes["pretrain/tiny"].state == "SUCCESS" and summary.outcomes["pretrain/tiny"].attempts == 3
    run = page.run_json()
    assert [f[:3] for f in run["failed_attempts"]] == [[0, 1, "hang"], [0, 2, "non_finite"]]
    m = run["metrics"]["0"]
    assert m["rewound"] == [[20.0, 32.0, 20 * 512.0, 30 * 512.0]]
    assert min(y for _, y in m["series"]["tokens_per_s"]) >= 0 and min(y for _, y in m["series"]["mfu"]) >= 0
    assert len(m["series"]["tokens_per_s"]) == REWIND_ROWS - 1  # the row across the rewind is left out

    path = page.store.path(page.folder, "index.html")
    o = Opened(browser, path)
    # shaded: once on the overview (by tokens), once on each chart by step
    charts = o.page.locator("#curves svg.chart").count()
    assert o.page.locator("#curves svg.chart rect.rewound").count() == charts
    title = o.page.locator("#curves svg.overview rect.rewound title").text_content()
    assert "pretrain/tiny steps 20–32" in title
    # the loss by tokens is cut where it runs back, not drawn back over itself
    assert o.page.locator("#curves svg.overview polyline.series").count() == 2
    # no rate below zero on its axis
    for name in ("tokens_per_s", "mfu"):
        chart = o.page.locator("#curves svg.chart", has=o.page.locator(f"text.ctitle:text-is('{name}')"))
        ticks = [t for t in chart.locator("text.tick[text-anchor=end]:not(.value)").all_text_contents()
                 if not t.endswith(" step")]  # the y axis's (the x axis ends in one too)
        assert ticks and all(float(t.replace(",", "")) >= 0 for t in ticks), (name, ticks)
    # the classes of its failed attempts: on its node, in the run's list, in its details
    assert "failed: hang, non_finite" in o.page.locator('#boxes [data-step="0"]').first.text_content()
    listed = o.page.locator("#failed li.failed-attempt").all_inner_texts()
    assert len(listed) == 2 and "attempt 1 hang" in listed[0] and "attempt 2 non_finite" in listed[1], listed
    assert "Hang: no optimizer step" in listed[0]
    details = o.click_step(plan, "pretrain/tiny")
    assert "failed attempts" in details and "1: hang" in details and "2: non_finite" in details
    o.shot("rewind.png")
    o.check_clean(path)
