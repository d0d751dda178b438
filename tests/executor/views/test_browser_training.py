"""The laptop voyage's live page in headless Chromium at 1400x1800: the DAG fits
its panel with readable boxes, the expert-load heatmap is drawn (layers x logged steps, not
blank), the loss runs on from pretrain into midtrain by tokens with the reference curve over it,
and the curves show their values, with a capped run's MoE drops above them. The screenshot is checked by its pixels and kept under
`.artifacts/browser/` for a person to look at."""

import json
import os
import shutil

from executor.views.live import LivePage
from kits.browserkit import ARGS, ARTIFACTS, CHROMIUM, needs_chromium  # noqa: E402

pytestmark = needs_chromium


def test_the_laptop_voyage_page_shows_health_heatmap_and_one_curve(laptop_voyage, tmp_path):
    from playwright.sync_api import sync_playwright

    # the page of a run of the laptop voyage, over a copy of its prefix (the fixture is shared)
    prefix = tmp_path / "out"
    shutil.copytree(laptop_voyage.prefix, prefix)
    # a capped run's drops, as the trainer logs them, appended to the training steps'
    # metrics: one more row each, 2.5% of layer 1's assignments dropped
    layers = len(json.loads(next(prefix.rglob("metrics.jsonl")).read_text().splitlines()[-1])["health"]["load_max_mean"])
    for metrics in prefix.rglob("metrics.jsonl"):
        last = json.loads(metrics.read_text().splitlines()[-1])["step"]
        share = [0.025 if layer == 1 else 0.0 for layer in range(layers)]
        with open(metrics, "a") as f:
            f.write(json.dumps({"step": last + 1, "moe_dropped": 40, "moe_dropped_share": 0.025 / layers,
                                "health": {"dropped": [int(1600 * v) for v in share], "dropped_share": share}}) + "\n")
    from executor.api import plan_steps

    plan = plan_steps(laptop_voyage.module.voyage(laptop_voyage.config), str(prefix))
    page = LivePage(plan, "535b", "laptop")
    page.flush()
    page.close(laptop_voyage.summary)
    run = page.run_json()
    training = {plan.decisions[int(i)].name: c for i, c in run["metrics"].items() if "by_tokens" in c}
    assert len(training) == 2, sorted(training)  # pretrain and midtrain
    pre, mid = sorted(training.values(), key=lambda c: c["by_tokens"][0][0])
    assert pre["by_tokens"][-1][0] < mid["by_tokens"][0][0]  # midtrain carries on where pretrain stopped
    from steps.moe.config import PRESETS

    rows = laptop_voyage.pretrain_steps // 25  # a row per logged step (the voyage logs every 25)
    assert len(pre["heat"]) >= rows and len(pre["heat"][0][1]) == PRESETS["tiny"].n_layers  # a column per row
    assert pre["reference"] and "router_entropy_mean" in pre["series"]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1800})
            errors = []
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.goto("file://" + page.url)
            tab.wait_for_selector("html[data-drawn]", state="attached", timeout=60_000)
            assert errors == []
            canvas = tab.locator("#canvas").bounding_box()
            boxes = [tab.locator(f'#boxes [data-step="{i}"] rect').first.bounding_box() for i in range(len(plan.decisions))]
            # the graph fits its panel and fills a good part of it, its boxes big enough to read
            left, top = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
            right, bottom = max(b["x"] + b["width"] for b in boxes), max(b["y"] + b["height"] for b in boxes)
            assert canvas["x"] - 1 <= left and right <= canvas["x"] + canvas["width"] + 1
            assert canvas["y"] - 1 <= top and bottom <= canvas["y"] + canvas["height"] + 1
            assert min(b["height"] for b in boxes) >= 28  # a box's two lines of text, at 12 px and 10 px
            # the curves: an overview as wide as the pane, charts of a readable size with values
            overview = tab.locator("svg.overview").bounding_box()
            assert overview["width"] >= 1000 and overview["height"] >= 250
            assert tab.locator("svg.overview polyline").count() >= 3  # pretrain, midtrain, reference
            charts = tab.locator("svg.chart:not(.overview)")
            assert charts.count() >= 6 and all(charts.nth(i).bounding_box()["width"] >= 260 for i in range(6))
            assert tab.locator("svg.chart .value").count() >= 6
            drops = tab.locator("#curves .charts .drops").first
            assert "worst layer 1 at 2.50%" in drops.inner_text() and drops.bounding_box()["width"] >= 1000
            heat = tab.locator("canvas.heatmap").first.bounding_box()
            assert heat["width"] >= 1000 and heat["height"] >= 80
            os.makedirs(ARTIFACTS, exist_ok=True)
            shot = os.path.join(ARTIFACTS, "live-laptop-1400x1800.png")
            tab.screenshot(path=shot)
        finally:
            browser.close()
    # the screenshot itself: the heatmap region is not blank (some cells are coloured), and the
    # overview shows several colours (the curves), not an empty frame
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    region = img.crop((int(heat["x"]) + 70, int(heat["y"]) + 24, int(heat["x"] + heat["width"]) - 20,
                       int(heat["y"] + heat["height"]) - 24))
    colours = {px for px in region.getdata() if not (px[0] > 245 and px[1] > 245 and px[2] > 245)}
    assert len(colours) >= 5, len(colours)
    over = img.crop((int(overview["x"]), int(overview["y"]), int(overview["x"] + overview["width"]),
                     int(overview["y"] + overview["height"])))
    assert len(set(over.getdata())) >= 20
    json.dumps(run)  # the page's data is plain JSON
