"""The live voyage page: kept up to date cheaply, training curves, never failing the voyage."""

import json
import logging
import os
import sys
import time

import pytest


from kits.vizkit import run_inline, small_voyage, synthetic_plan  # noqa: E402

from executor.api import plan_steps  # noqa: E402
from executor.views.live import LivePage, open_page  # noqa: E402
from executor.runner import Outcome  # noqa: E402
from executor.views.viz.metrics import MAX_POINTS, Curves, MetricsReader  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HELLO = os.path.join(ROOT, "voyages", "hello.py")


def page_files(page):
    folder = page.store.path(page.folder)
    with open(os.path.join(folder, "voyage.json")) as f:
        data = json.load(f)
    with open(os.path.join(folder, "index.html")) as f:
        return data, f.read()


def test_a_thousand_steps_of_events_make_a_few_cheap_writes(tmp_path):
    plan = synthetic_plan(1000, str(tmp_path))
    page = LivePage(plan, "synthetic", "0123456789abcdef", min_interval=0.2).start()
    assert page.url == f"{tmp_path}/{page.folder}/index.html" and page.folder.startswith("voyages/synthetic/")
    assert page.writes == 1
    t0 = time.perf_counter()
    for d in plan.to_run():
        page(Outcome(d.name, "RUNNING", started=time.time()))
        page(Outcome(d.name, "SUCCESS", started=time.time() - 2, ended=time.time(), attempts=1))
    events = time.perf_counter() - t0
    time.sleep(0.5)
    page.close()
    assert events < 0.5  # the listener only updates memory
    assert page.writes <= 6 and page.failures == 0
    assert page.write_seconds / page.writes < 0.25
    data, html = page_files(page)
    states = [row[0] for row in data["run"]["steps"]]
    assert states.count("SUCCESS") == len(plan.to_run()) and data["run"]["finished"]
    assert len(data["plan"]["steps"]) == len(plan.decisions)
    assert '<script type="application/json" id="voyage-run">' in html and "connect-src 'self'" in html


def test_run_rows_have_attempts_durations_records_and_curves(tmp_path):
    prefix = str(tmp_path / "p")
    plan = plan_steps(small_voyage(fail=True), prefix)
    page = LivePage(plan, "small", "feedbeef", min_interval=0.05, metrics_every=0.05)
    plan2, summary = run_inline(small_voyage(fail=True), prefix, on_change=page.start())
    page.close(summary)
    data, _ = page_files(page)
    run, names = data["run"], [s["name"] for s in data["plan"]["steps"]]
    row = dict(zip(names, run["steps"]))
    assert row["model"][0] == "SUCCESS" and row["model"][1] == 1 and row["model"][3] >= row["model"][2] > 0
    assert row["join/abc"][0] == "FAILED" and "fails on purpose" in row["join/abc"][4]
    failed = run["records"][str(names.index("join/abc"))]
    assert failed["state"] == "FAILED" and "RuntimeError" in failed["attempts"][-1]["traceback"]
    curves = run["metrics"][str(names.index("model"))]
    assert curves["x"] == "step"
    assert set(curves["series"]) == {"loss", "lr", "tokens_per_s", "expert_load_max", "expert_load_min"}
    assert curves["series"]["loss"][0] == [10.0, 4.0 / 1.1] and len(curves["series"]["loss"]) == 50


def test_cached_steps_bring_their_records_and_a_finished_trainer_its_curves(tmp_path):
    from executor.plan import Selection

    prefix = str(tmp_path / "p")
    run_inline(small_voyage(), prefix)
    plan = plan_steps(small_voyage(), prefix, Selection(rerun=("lone",)))
    page = LivePage(plan, "small", "feedbeef", min_interval=2.0).start()
    before, _ = page_files(page)
    assert not any("record" in s for s in before["plan"]["steps"])  # the first write does not wait for them
    _, summary = run_inline(small_voyage(), prefix, Selection(rerun=("lone",)), on_change=page)
    page.close(summary)
    data, _ = page_files(page)
    steps = {s["name"]: s for s in data["plan"]["steps"]}
    assert steps["data/a"]["record"]["state"] == "SUCCESS" and steps["model"]["record"]["files"] == 1
    names = list(steps)
    assert str(names.index("model")) in data["run"]["metrics"]  # CACHED, but a trainer: its curves
    assert data["run"]["steps"][names.index("lone")][0] == "SUCCESS"


def test_metrics_are_read_incrementally_and_thinned(tmp_path):
    from executor.storage.store import Store

    store = Store(str(tmp_path))
    folder = tmp_path / "train-0123456789"
    folder.mkdir()
    path = folder / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 3.0, "ok": true, "name": "x", "bad": NaN}\nnot json\n{"step": 2, "lo')
    reader = MetricsReader(store)
    assert reader.poll_many(["train-0123456789", "missing-0123456789"])
    assert reader.to_json("train-0123456789")["series"] == {"loss": [[1.0, 3.0]]}
    with open(path, "a") as f:
        f.write('ss": 2.5}\n')
    assert reader.poll("train-0123456789")  # the line completed since: read from where it stopped
    assert reader.to_json("train-0123456789")["series"]["loss"] == [[1.0, 3.0], [2.0, 2.5]]
    with open(path, "a") as f:
        for s in range(3, 5000):
            f.write(json.dumps({"step": s, "loss": 1.0 / s}) + "\n")
    assert reader.poll("train-0123456789")
    loss = reader.to_json("train-0123456789")["series"]["loss"]
    assert len(loss) <= MAX_POINTS + 1 and loss[0] == [1.0, 3.0] and loss[-1] == [4999.0, 1.0 / 4999]
    assert not reader.poll("train-0123456789")  # nothing new: nothing read
    path.write_text('{"step": 1, "loss": 9.0}\n')  # a fresh attempt rewrote the file
    assert reader.poll("train-0123456789")
    assert reader.to_json("train-0123456789")["series"]["loss"] == [[1.0, 9.0]]


def test_curves_keep_at_most_max_points():
    c = Curves()
    c.feed("".join(json.dumps({"loss": i}) + "\n" for i in range(20_000)).encode())
    points = c.to_json()["series"]["loss"]
    assert len(points) <= MAX_POINTS + 1 and points[0] == [1.0, 0.0] and points[-1] == [20_000.0, 19_999.0]


def test_a_failing_page_write_warns_and_the_voyage_goes_on(tmp_path, caplog):
    prefix = tmp_path / "p"
    prefix.mkdir()
    (prefix / "voyages").write_text("a file where the page's folder should be")
    plan = plan_steps(small_voyage(), str(prefix))
    page = open_page(plan, "small", "feedbeef", min_interval=0.01)
    with caplog.at_level(logging.WARNING, logger="marin.live"):
        _, summary = run_inline(small_voyage(), str(prefix), on_change=page.start())
        page.close(summary)
    assert summary.exit_code == 0 and all(o.state == "SUCCESS" for o in summary.outcomes.values())
    assert page.failures >= 1 and page.writes == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "the voyage goes on" in warnings[0]  # warned once, not per write


def test_marin_run_keeps_a_page_for_the_run(tmp_path, capsys, ray_local):
    from executor.cli import main

    prefix = tmp_path / "p"
    assert main([HELLO, "--prefix", str(prefix), "--n_files", "2"]) == 0
    out = capsys.readouterr().out
    pages = list((prefix / "voyages" / "hello").glob("*/index.html"))
    assert len(pages) == 1 and f"voyage page: {pages[0]}" in out
    data = json.loads((pages[0].parent / "voyage.json").read_text())
    assert [row[0] for row in data["run"]["steps"]] == ["SUCCESS"] * 6 and data["run"]["finished"]
    assert main([HELLO, "--prefix", str(prefix), "--n_files", "2", "--rerun", "hello/merge", "--no-live-page"]) == 0
    assert len(list((prefix / "voyages" / "hello").glob("*/index.html"))) == 1


def test_page_on_gcs_is_served_as_html_without_caching(tmp_path, gcs_emulator):
    import gcsfs

    prefix = "gs://marin-test/live-page"
    plan = plan_steps(small_voyage(), prefix)
    page = LivePage(plan, "small", "feedbeef").start()
    page.close()
    assert page.failures == 0 and page.writes == 2
    fs = gcsfs.GCSFileSystem(endpoint_url=gcs_emulator, token="anon")
    info = fs.info(page.url)
    assert info["contentType"].startswith("text/html")
    assert json.loads(fs.cat_file(page.url.rsplit("/", 1)[0] + "/voyage.json"))["run"]["finished"]
    if "cacheControl" in info:  # the emulator may not keep it
        assert "no-cache" in info["cacheControl"]


@pytest.mark.parametrize("bad", ["../up", "a b/c"])
def test_voyage_names_are_made_safe_for_paths(tmp_path, bad):
    plan = plan_steps(small_voyage(), str(tmp_path))
    page = LivePage(plan, bad, "feedbeef")
    assert page.folder.startswith("voyages/") and ".." not in page.folder and " " not in page.folder
