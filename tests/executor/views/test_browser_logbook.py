"""The `voyages/` folder as a static site: the laptop voyage's prefix served by
`python -m http.server`'s handler, its logbook index and the run pages it links opened in headless
Chromium; every link followed answers 200, none is absolute or names a path of this machine, and
the page shows the run with its loss curves."""

import os
import shutil
from urllib.parse import urljoin, urlparse

import pytest

from kits.browserkit import ARGS, ARTIFACTS, CHROMIUM, ROOT, needs_chromium, serve  # noqa: E402

pytestmark = needs_chromium


@pytest.fixture
def served(laptop_voyage):
    """The prefix over http (read only: the fixture's prefix is shared)."""
    server, url = serve(laptop_voyage.prefix)
    yield url
    server.shutdown()
    server.server_close()


def test_the_logbook_index_and_run_pages_link_only_what_the_site_serves(laptop_voyage, served):
    from playwright.sync_api import sync_playwright

    lv = laptop_voyage
    local = [p for p in {lv.prefix, lv.ran_at, lv.root, os.path.dirname(lv.prefix)} if len(p) > 1]
    index = urljoin(served, "voyages/535b/index.html")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 1400})
            errors, missing = [], []
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
            assert tab.goto(index).status == 200
            assert tab.locator("section.entry").count() >= 1
            assert tab.locator("#loss-chart polyline").count() >= 2  # pretrain and midtrain of the run
            assert tab.locator("a", has_text="model card").count() >= 1 and tab.locator("a", has_text="run page").count()
            os.makedirs(ARTIFACTS, exist_ok=True)
            tab.screenshot(path=os.path.join(ARTIFACTS, "logbook-laptop.png"), full_page=True)
            pages, followed = [index], set()
            run_pages = []
            while pages:
                url = pages.pop()
                if url != tab.url:
                    assert tab.goto(url).status == 200
                    if url.endswith("/index.html") and url != index:
                        tab.wait_for_selector("html[data-drawn]", state="attached", timeout=60_000)
                html = tab.content()
                assert not [p for p in local if p in html], url  # no path of this machine
                hrefs = tab.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
                assert hrefs or url != index
                for href in hrefs:
                    if href.startswith("#"):
                        continue
                    assert "://" not in href and not href.startswith(("/", "file:")), (url, href)
                    target = urljoin(url, href)
                    assert urlparse(target).netloc == urlparse(served).netloc and target.startswith(served), href
                    if target in followed:
                        continue
                    followed.add(target)
                    answer = tab.request.get(target)
                    assert answer.status == 200, (url, href, answer.status)
                    if url == index and target.endswith("/index.html"):
                        run_pages.append(target)
                        pages.append(target)
            assert run_pages  # the run's live page, linked from the index
            assert any(t.endswith("/.step.json") for t in followed)
            # what the browser asked for by itself: the run pages name no icon (the index does)
            assert {urlparse(u).path for u in missing} <= {"/favicon.ico"}, missing
            assert [e for e in errors if not e.startswith("Failed to load resource")] == [], errors
        finally:
            browser.close()


def _follow(tab, start, served, local):
    """Every link of `start`, followed: each answers 200, none absolute or local."""
    html = tab.content()
    assert not [p for p in local if p in html]
    hrefs = tab.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    for href in hrefs:
        assert "://" not in href and not href.startswith(("/", "file:")), href
        target = urljoin(start, href)
        assert target.startswith(served), href
        assert tab.request.get(target).status == 200, href
    return hrefs


def test_three_runs_of_a_small_voyage_in_the_log_and_on_the_index_page(tmp_path, capsys):
    """Run plainly; then with a config change and a step that fails on purpose; then fixed, with a
    note: `--log` lists the three with the config difference, the failure class and the note, and
    the index page shows them in headless Chromium, every link served."""
    from kits.logkit import VOYAGE, run_and_log
    from playwright.sync_api import sync_playwright

    from executor import cli

    prefix = str(tmp_path / "out")
    run_and_log(prefix)
    run_and_log(prefix, value="B", fail=True)
    run_and_log(prefix, value="B", note="abc fixed: it no longer fails on purpose")
    assert cli.main([VOYAGE, "--prefix", prefix, "--log"]) == 0
    third, second, first = capsys.readouterr().out.strip().splitlines()
    assert "ran 6" in first and "config" not in first
    assert "failed: join/abc (" in second and "config: value A -> B; fail false -> true" in second
    assert "note: abc fixed" in third and "config: fail true -> false" in third and "ran 1" in third
    server, served = serve(prefix)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                tab = browser.new_page(viewport={"width": 1200, "height": 1400})
                errors = []
                tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                tab.on("response", lambda r: errors.append(r.url) if r.status >= 400 else None)
                index = urljoin(served, "voyages/logbook_voyage/index.html")
                assert tab.goto(index).status == 200
                assert tab.locator("section.entry").count() == 3
                assert tab.locator(".failure .class").count() == 1 and "abc fixed" in tab.locator(".note").inner_text()
                assert tab.locator("table.diff").count() == 2 and tab.locator("#loss-chart polyline").count() == 2
                hrefs = _follow(tab, index, served, [str(tmp_path)])
                assert any(h.endswith(".step.json") for h in hrefs) and any(h.endswith("/") for h in hrefs)
                os.makedirs(ARTIFACTS, exist_ok=True)
                tab.screenshot(path=os.path.join(ARTIFACTS, "logbook-three-runs.png"), full_page=True)
                assert errors == []
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow_tier
def test_the_laptop_voyage_three_times_in_the_log_and_on_its_page(laptop_voyage, laptop_copy, tmp_path, capsys,
                                                                   monkeypatch, ray_local):
    """The laptop voyage (the session's run, then plainly with a check step added), then with a
    config change (the card's title) and the check failing on purpose, then fixed, with a note: `--log` lists the three with the config difference,
    the failure class and the note; the page shows them in headless Chromium, every link served."""
    from playwright.sync_api import sync_playwright

    from executor import cli

    monkeypatch.setenv("MARIN_LOGBOOK_ROOT", laptop_voyage.root)
    monkeypatch.chdir(laptop_voyage.root)  # the bundled corpus is named by repository-relative paths
    voyage = str(tmp_path / "535b.py")
    shutil.copy(os.path.join(ROOT, "tests", "kits", "laptop_logbook.py"), voyage)
    args = [voyage, *laptop_voyage.args, "--prefix", laptop_copy]
    assert cli.main(args) == 0  # plainly: the check step is new; the rest is the session's run, cached
    assert cli.main([*args, "--title", "tried a title", "--fail_check"]) == 1
    assert cli.main([*args, "--title", "a better title", "--note", "the check passes again: it was the flag"]) == 0
    capsys.readouterr()
    assert cli.main([voyage, "--prefix", laptop_copy, "--log"]) == 0
    third, second, first, session = capsys.readouterr().out.strip().splitlines()
    assert "ran 16" in session and "ran 1, cached 16" in first and "config" not in first  # the session's has none
    assert "failed: check/laptop (" in second and "ran 1, cached 15, failed 1" in second  # the card ran
    assert "title -> tried a title" in second and "fail_check false -> true" in second
    assert "note: the check passes again" in third and "fail_check true -> false" in third
    assert "title tried a title -> a better title" in third and "ran 1, cached 16" in third
    server, served = serve(laptop_copy)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                tab = browser.new_page(viewport={"width": 1200, "height": 1400})
                index = urljoin(served, "voyages/535b/index.html")
                assert tab.goto(index).status == 200
                assert tab.locator("section.entry").count() == 4 and tab.locator(".failure .class").count() == 1
                assert "RuntimeError" in tab.locator(".failure pre").inner_text()
                _follow(tab, index, served, [laptop_copy, laptop_voyage.ran_at, str(tmp_path)])
                os.makedirs(ARTIFACTS, exist_ok=True)
                tab.screenshot(path=os.path.join(ARTIFACTS, "logbook-laptop-three-runs.png"), full_page=True)
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
