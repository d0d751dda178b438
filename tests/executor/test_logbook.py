"""The voyage's logbook (executor.logbook, executor.views.logbook, `marin-run --log/--note/--path`):
an entry per run with what ran, failed and why, the config difference and the note; appends from
two executors at once lose nothing, on a local folder and on GCS; the index page's links are
relative and lead to files that exist."""

import json
import os
import re
import subprocess
import sys
import time
import uuid
from html.parser import HTMLParser
from urllib.parse import unquote

from kits.logkit import NAME, ROOT, VOYAGE, run_and_log
from kits.vizkit import run_inline

from executor import cli, logbook
from executor.storage.store import Store
from executor.views.logbook import line

def test_an_entry_says_what_ran_failed_and_why_and_the_config_difference(tmp_path):
    prefix = str(tmp_path / "out")
    run_and_log(prefix)
    run_and_log(prefix, fail=True, value="B", note="trying B; abc fails on purpose")
    store = Store(prefix)
    newest, first = logbook.entries(store, NAME)
    assert first["kind"] == "run" and "config_diff" not in first  # nothing before it
    assert first["counts"] == {"ran": 6} and newest["counts"] == {"ran": 3, "failed": 1, "cached": 2}
    assert newest["previous"] == first["_name"]
    assert {d["path"]: (d["before"], d["after"]) for d in newest["config_diff"]} == {
        "value": ("A", "B"), "fail": (False, True)}
    assert newest["note"] == "trying B; abc fails on purpose"
    steps = newest["steps"]
    assert steps["join/abc"]["state"] == "failed"
    assert steps["join/abc"]["failure"]  # the class executor.failures gave it
    stack = steps["join/abc"]["stack"]
    assert 'File "tests/kits/vizkit.py"' in stack and ROOT not in stack  # no folder of this machine
    assert steps["data/b"]["state"] == "cached" and steps["data/a"]["state"] == "ran"
    for name in ("data/a", "join/abc", "model"):
        where = steps[name]["attempt_dir"]
        assert where.startswith(steps[name]["dir"] + "/.attempts/") and os.path.isdir(os.path.join(prefix, where))
        assert os.path.isfile(os.path.join(prefix, steps[name]["record"]))
    curve = steps["model"]["loss"]
    assert len(curve) == 50 and curve[0] == [10.0, round(4.0 / 1.1, 5)]
    assert who_and_when(newest)
    text = line(newest)
    assert "failed: join/abc (" in text and "value A -> B" in text and "note: trying B" in text


def who_and_when(entry):
    return re.fullmatch(r"\S+@\S+", entry["who"]) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["when"]) \
        and ("commit" in entry["git"] and "dirty" in entry["git"])


APPEND = r"""
import sys, time
from executor import logbook
from executor.storage.store import Store
from executor.views.logbook import write_index
prefix, start, n, who = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = Store(prefix)
while time.time() < start:
    time.sleep(0.001)
for i in range(n):
    logbook.write_entry(store, "race", logbook.new_entry("note", "race", note=f"{who} {i}"))
write_index(store, "race")
"""


def _append_at_once(prefix, n=8):
    """Two executors (processes) append `n` entries each, starting at the same instant."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", APPEND, prefix, str(start), str(n), who], env=env)
             for who in ("one", "two")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    found = logbook.entries(Store(prefix), "race")
    notes = sorted(e["note"] for e in found)
    assert notes == sorted(f"{w} {i}" for w in ("one", "two") for i in range(n))  # none lost
    assert [e["_name"] for e in found] == sorted((e["_name"] for e in found), reverse=True)
    assert [e["time"] for e in found] == sorted((e["time"] for e in found), reverse=True)  # names sort by time


def test_two_executors_append_at_once_on_a_local_folder_and_lose_none(tmp_path):
    _append_at_once(str(tmp_path / "out"))


def test_two_executors_append_at_once_on_gcs_and_lose_none(gcs_emulator):
    prefix = f"gs://marin-test/logbook-{uuid.uuid4().hex[:8]}"
    _append_at_once(prefix)
    import gcsfs

    fs = gcsfs.GCSFileSystem(endpoint_url=gcs_emulator, token="anon")
    page = fs.cat_file(f"{prefix[5:]}/voyages/race/index.html").decode()
    assert page.count('<section class="entry">') >= 8  # written by the last of each writer


def _cli(*args, capsys):
    code = cli.main([VOYAGE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_log_note_and_path_on_the_command_line(tmp_path, capsys):
    prefix = str(tmp_path / "out")
    code, out, err = _cli("--prefix", prefix, "--log", capsys=capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "is empty" in err
    for bad, words in ((["--note", "why", "--dry-run"], "--note does not combine with --dry-run"),
                       (["--note", "  "], "--note: empty"),
                       (["--log", "--rerun", "model"], "--log does not combine with --rerun"),
                       (["--path", "model", "a", "b"], "--path takes a step and at most one file"),
                       (["--format", "markdown"], "--format: only with --diff")):
        code, out, err = _cli("--prefix", prefix, *bad, capsys=capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, (bad, err)
    assert not os.path.exists(os.path.join(prefix, "voyages"))  # bad input writes nothing

    code, out, err = _cli("--prefix", prefix, "--path", "model", capsys=capsys)
    assert code == 2 and "model has no committed output" in err

    run_and_log(prefix)  # what `marin-run VOYAGE` would have run
    code, out, err = _cli("--prefix", prefix, "--note", "kept A: the B run diverged", capsys=capsys)
    assert code == 0 and "nothing to run" in out and "note written" in out, err  # a decision with no run
    code, out, err = _cli("--prefix", prefix, "--log", capsys=capsys)
    rows = out.strip().splitlines()
    assert code == 0 and len(rows) == 2
    assert " note " in rows[0] and "note: kept A: the B run diverged" in rows[0]
    assert " run " in rows[1] and "ran 6" in rows[1]
    code, out, _ = _cli("--prefix", prefix, "--log", "--json", capsys=capsys)
    whole = json.loads(out)
    assert [e["kind"] for e in whole] == ["note", "run"] and whole[0]["config"] == {"value": "A", "fail": False}
    assert whole[0]["config_diff"] == [] and whole[0]["steps"]["model"]["state"] == "cached"

    code, out, err = _cli("--prefix", prefix, "--path", "model", "metrics.jsonl", capsys=capsys)
    served = out.strip()
    assert code == 0 and "/.attempts/0001-" in served and os.path.isfile(served)
    assert served == os.path.join(prefix, whole[1]["steps"]["model"]["attempt_dir"], "metrics.jsonl")
    code, out, err = _cli("--prefix", prefix, "--path", "model", capsys=capsys)
    assert code == 0 and os.path.isdir(out.strip())
    for bad, words in ((["model", "nope.txt"], "has no 'nope.txt'"), (["modle"], "no step named 'modle'"),
                       (["model", "../x"], "not a path inside")):
        code, out, err = _cli("--prefix", prefix, "--path", *bad, capsys=capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("href", "src") and value:
                self.links.append(value)


def test_the_index_page_links_only_relative_paths_that_exist(tmp_path):
    prefix = str(tmp_path / "out")
    run_and_log(prefix)
    run_and_log(prefix, fail=True, value="B", note="<b>not bold</b>")
    page = open(os.path.join(prefix, "voyages", NAME, "index.html")).read()
    assert "&lt;b&gt;not bold&lt;/b&gt;" in page and "<b>not bold</b>" not in page
    assert str(tmp_path) not in page and "file:" not in page
    parser = _Links()
    parser.feed(page)
    assert parser.links
    assert "data:," in parser.links  # the icon, inline: the page asks the site for nothing else
    for href in (h for h in parser.links if h != "data:,"):
        assert not href.startswith(("/", "http:", "https:", "file:")) and "://" not in href, href
        target = os.path.normpath(os.path.join(prefix, "voyages", NAME, unquote(href)))
        assert target.startswith(prefix) and os.path.exists(target), href
    assert 'id="loss-chart"' in page and page.count("<polyline") == 2  # both runs' trainers


def test_an_alias_points_at_the_committed_attempt_and_follows_a_rerun(tmp_path):
    """A step type with alias=True: `{prefix}/{name}` is the committed attempt, also after the
    prefix moves; a rerun's commit moves it; the executor never reads it (a broken alias changes
    no plan)."""
    from executor import Step, step_type
    from executor.plan import Selection
    from kits.vizkit import Make, replan

    @step_type(version="1", name="logbook_aliased", alias=True)
    def aliased(config: Make, ctx) -> None:
        with ctx.open("hf/value.txt", "w") as f:
            f.write(config.value)

    steps = [Step("export/tiny", aliased, Make("v"))]
    prefix = str(tmp_path / "out")
    plan, summary = run_inline(steps, prefix)
    link = os.path.join(prefix, "export", "tiny")
    assert os.path.islink(link) and not os.path.isabs(os.readlink(link))
    first = os.readlink(link)
    assert first.startswith(plan["export/tiny"].node.dirname.rpartition("/")[2] + "/.attempts/0001-")
    assert open(os.path.join(link, "hf", "value.txt")).read() == "v"
    moved = str(tmp_path / "moved")
    os.rename(prefix, moved)
    assert open(os.path.join(moved, "export", "tiny", "hf", "value.txt")).read() == "v"
    plan, summary = run_inline(steps, moved, Selection(rerun=("export/tiny",)))
    second = os.readlink(os.path.join(moved, "export", "tiny"))
    assert second != first and second.rpartition("/")[2].startswith("0002-")
    os.remove(os.path.join(moved, "export", "tiny"))
    os.symlink("nowhere", os.path.join(moved, "export", "tiny"))
    assert replan(steps, moved)["export/tiny"].state.value == "CACHED"


def test_gc_yes_writes_an_entry_with_the_bytes_it_deleted(tmp_path, capsys):
    prefix = str(tmp_path / "out")
    run_and_log(prefix)
    run_and_log(prefix, value="B")  # data/a, join/ab, join/abc and model of value A are now unreached
    assert cli.main([VOYAGE, "--prefix", prefix, "--value", "B", "--gc", "--gc-grace", "0"]) == 0  # a listing: no entry
    assert len(logbook.entries(Store(prefix), NAME)) == 2
    assert cli.main([VOYAGE, "--prefix", prefix, "--value", "B", "--gc", "--gc-grace", "0", "--yes", "--note",
                     "old A outputs"]) == 0
    out = capsys.readouterr().out
    deleted = int(re.search(r"\(([\d,]+) bytes\)", out).group(1).replace(",", ""))
    newest = logbook.entries(Store(prefix), NAME)[0]
    assert newest["kind"] == "gc" and newest["note"] == "old A outputs"
    assert newest["gc"]["bytes"] == deleted > 0 and newest["gc"]["items"] >= 4
    assert f"gc deleted {deleted:,} bytes" in line(newest)


def test_on_an_object_store_the_alias_is_a_pointer_to_the_attempt(gcs_emulator):
    from executor.storage.alias import POINTER, write_alias

    prefix = f"gs://marin-test/alias-{uuid.uuid4().hex[:8]}"
    store = Store(prefix)
    write_alias(store, "export/tiny", "export/tiny-0123456789", ".attempts/0001-abcdef01")
    write_alias(store, "export/tiny", "export/tiny-0123456789", ".attempts/0002-abcdef02")  # the next commit
    pointer = store.fs.cat_file(store.path("export/tiny", POINTER)).decode()
    assert pointer == f"{prefix}/export/tiny-0123456789/.attempts/0002-abcdef02\n"


def test_a_step_s_headline_and_links_reach_the_entry_and_the_page_only_when_safe(tmp_path):
    """The steps see the voyage's name; the entry copies a step's `headline` (not one over
    HEADLINE_BYTES) and only the http(s) links of its results; the page links the W&B run."""
    from executor import Step
    from executor.views.logbook import index_html
    from kits.logkit import Linked, linked

    prefix = str(tmp_path / "p")
    plan, summary = run_inline([Step("small", linked, Linked()), Step("big", linked, Linked(headline_bytes=3000))],
                               prefix, voyage=NAME)
    assert summary.exit_code == 0
    logbook.record_run(plan, summary, NAME)
    [entry] = logbook.entries(Store(prefix), NAME)
    small, big = entry["steps"]["small"], entry["steps"]["big"]
    assert small["headline"] == {"kind": "demo", "text": "v" * 40} and "headline" not in big
    assert small["links"] == big["links"] == {"W&B run": "https://wandb.ai/team/marin-voyage/runs/marin-0123"}
    assert f"small: {'v' * 40}" in line(entry) and "big:" not in line(entry)
    page = index_html(NAME, [entry])
    assert page.count('href="https://wandb.ai/team/marin-voyage/runs/marin-0123"') == 2
    assert "file://" not in page and "javascript:" not in page and "/tmp/out" not in page
    record = json.load(open(os.path.join(prefix, small["record"])))
    assert record["results"]["voyage"] == NAME
    plan2, s2 = run_inline([Step("small", linked, Linked(headline_bytes=41))], prefix)  # no voyage: none seen
    assert s2.exit_code == 0
    record = json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan2["small"].node.dirname), ".step.json")))
    assert record["results"]["voyage"] == ""
