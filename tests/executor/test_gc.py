"""Issue 21 item 6: `marin-run VOYAGE... --gc` collects by reachability (executor.gc, executor.sweep).

Small voyages are written to files and run in this process through the real runner and worker
(vizkit's inline backend, no Ray); `--gc` goes through the real `marin-run`. A run in progress is
a real step paused on a file inside a thread, holding its real lease.
"""

import json
import os
import textwrap
import threading
import time

import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vizkit import run_inline  # noqa: E402

from executor.cli import main  # noqa: E402
from executor.lease import Leases, Owner  # noqa: E402
from executor.plan import Selection  # noqa: E402
from executor.store import Store  # noqa: E402
from executor.voyage import build_steps, load  # noqa: E402

VOYAGE = """
import os
import time
from dataclasses import dataclass

from executor import InputPath, Step, output_of, run_only, step_type


@dataclass(frozen=True)
class Cfg:
    text: str = "a"
    size: int = 1000
    pin: str = ""
    fail: str = ""  # a file: while it exists, gc/src and gc/train fail
    hold: str = ""  # a file: while it exists, gc/use waits


@dataclass(frozen=True)
class Blob:
    text: str
    size: int = 10
    fail: str = run_only(default="")


@step_type(version="1")
def gc_blob(config: Blob, ctx):
    with ctx.open("part-0.bin", "wb") as f:
        f.write(b"x" * config.size)
    if config.fail and os.path.exists(config.fail):
        raise RuntimeError("fails on purpose")
    with ctx.open("blob.bin", "wb") as f:
        f.write((config.text * config.size)[:config.size].encode())


@dataclass(frozen=True)
class Use:
    src: InputPath
    hold: str = run_only(default="")


@step_type(version="1")
def gc_use(config: Use, ctx):
    while config.hold and os.path.exists(config.hold):  # a run in progress, before it reads its input
        time.sleep(0.02)
    with ctx.open_input(config.src, "blob.bin", "rb") as f:
        data = f.read()
    with ctx.open("use.bin", "wb") as f:
        f.write(data + data)


@dataclass(frozen=True)
class Train:
    src: InputPath
    fail: str = run_only(default="")


@step_type(version="1", resumable=True)
def gc_train(config: Train, ctx):
    start = 0
    if ctx.exists("ckpt.txt"):
        with ctx.open("ckpt.txt", "r") as f:
            start = int(f.read())
    with ctx.open("ckpt.txt", "w") as f:
        f.write(str(start + 1))
    if config.fail and os.path.exists(config.fail):
        with ctx.fs.open(ctx.output + "/.tmp-0123abcd-ckpt.txt", "w") as f:  # a write a kill left
            f.write("half")
        raise RuntimeError("fails on purpose")
    with ctx.open("model.txt", "w") as f:
        f.write(f"trained from {start}")


def voyage(config: Cfg):
    src = Step("gc/src", gc_blob, Blob(config.text, config.size, fail=config.fail))
    return [src, Step("gc/use", gc_use, Use(output_of(src), hold=config.hold)),
            Step("gc/train", gc_train, Train(output_of(src), fail=config.fail))]


def pins(config: Cfg):
    return [config.pin] if config.pin else []
"""

OTHER = """
from dataclasses import dataclass

from executor import Step, step_type


@dataclass(frozen=True)
class Note:
    text: str = "n"


@step_type(version="1")
def gc_note(config: Note, ctx):
    with ctx.open("note.txt", "w") as f:
        f.write(config.text * 500)


def voyage(config: Note):
    return [Step("other/note", gc_note, Note(config.text))]
"""


@pytest.fixture
def voyage_file(tmp_path):
    path = tmp_path / "gcv.py"
    path.write_text(VOYAGE)
    return str(path)


def run(voyage_path, prefix, selection=None, **cfg):
    vf = load(voyage_path)
    return run_inline(build_steps(vf, vf.config_class(**cfg)), prefix, selection)


def gc(capsys, voyage_path, prefix, *args):
    code = main([voyage_path, "--prefix", prefix, "--gc", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def files(root):
    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, fs in os.walk(root) for f in fs}


def folders(root, step):
    parent, _, leaf = step.rpartition("/")
    where = os.path.join(root, parent)
    return sorted(e for e in os.listdir(where) if e.startswith(leaf + "-")) if os.path.isdir(where) else []


def test_stale_versions_go_current_stays_and_without_yes_nothing_is_deleted(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    old, _ = run(voyage_file, prefix, text="a")
    new, _ = run(voyage_file, prefix, text="b")
    before = files(prefix)
    stale = {p: s for p, s in before.items()
             if any(p.startswith(old[n].node.dirname + "/") for n in ("gc/src", "gc/use", "gc/train"))}

    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b")
    assert code == 0, err
    assert files(prefix) == before  # a dry listing: nothing deleted
    assert "nothing deleted: run again with --yes" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("gc/")]
    assert {(r[0], " ".join(r[1:3])) for r in rows} == {("gc/src", "old version"), ("gc/use", "old version"),
                                                        ("gc/train", "old version")}
    assert f"({sum(stale.values()):,} bytes)" in out  # the bytes of exactly the old folders
    assert "kept: reached outputs: 3," in out

    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert f"deleted 3 items, {len(stale)} files" in out
    after = files(prefix)
    assert after == {p: s for p, s in before.items() if p not in stale}
    for name in ("gc/src", "gc/use", "gc/train"):
        assert folders(prefix, name) == [new[name].node.dirname.rpartition("/")[2]]
    plan, _ = run(voyage_file, prefix, text="b")
    assert {d.state for d in plan.decisions} == {"CACHED"}
    code, out, _ = gc(capsys, voyage_file, prefix, "--text", "b")
    assert "nothing to delete" in out and "to collect: 0 items" in out


def test_pinned_outputs_and_what_they_were_made_from_stay(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    old, _ = run(voyage_file, prefix, text="a")
    run(voyage_file, prefix, text="c")
    run(voyage_file, prefix, text="b")
    use_a = old["gc/use"].node.dirname
    with open(os.path.join(prefix, "pins.txt"), "w") as f:
        f.write(f"# the run we published\n{use_a}   # kept with its input\n")
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert "pinned: 2," in out  # gc/use of "a" and the gc/src it read
    assert os.path.isdir(os.path.join(prefix, use_a))
    assert os.path.isdir(os.path.join(prefix, old["gc/src"].node.dirname))
    assert not os.path.exists(os.path.join(prefix, old["gc/train"].node.dirname))
    assert len(folders(prefix, "gc/src")) == 2 and len(folders(prefix, "gc/train")) == 1  # "c" went
    assert os.path.exists(os.path.join(prefix, "pins.txt"))

    # A step name pins every version of it, here through the voyage's pins(config).
    run(voyage_file, prefix, text="d")
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--pin", "gc/train", "--yes")
    assert code == 0, err
    assert len(folders(prefix, "gc/train")) == 2 and len(folders(prefix, "gc/src")) == 3  # d's src: read by train

    # A pin that names nothing is one line, exit 2, and nothing is deleted.
    with open(os.path.join(prefix, "pins.txt"), "a") as f:
        f.write("gc/nosuch\n")
    before = files(prefix)
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 2 and "pins.txt:3: pin 'gc/nosuch' names no output folder and no step" in err
    assert files(prefix) == before


def dirnames(voyage_path, **cfg):
    from executor.dag import build_dag

    vf = load(voyage_path)
    return {n.name: n.dirname for n in build_dag(build_steps(vf, vf.config_class(**cfg)))}


def test_a_run_in_progress_and_what_it_reads_are_untouched(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    run(voyage_file, prefix, text="a")
    a, c = dirnames(voyage_file, text="a"), dirnames(voyage_file, text="c")
    hold = tmp_path / "hold"
    hold.write_text("")
    result = {}
    thread = threading.Thread(target=lambda: result.update(run=run(voyage_file, prefix, text="c", hold=str(hold))))
    thread.start()
    try:
        status = os.path.join(prefix, c["gc/use"], ".status")
        deadline = time.time() + 30
        while not (os.path.exists(status) and json.load(open(status))["state"] == "RUNNING" and
                   os.path.exists(os.path.join(prefix, c["gc/use"], json.load(open(status))["dir"], ".step.json"))):
            assert time.time() < deadline and thread.is_alive(), "gc/use never started"
            time.sleep(0.02)
        before = files(prefix)
        code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
        assert code == 0, err
        # gc/use of "c" runs (a live lease); the gc/src it reads stays with it, though no voyage reaches it.
        assert "in use (a live lease, or read by one): 2," in out
        after = files(prefix)
        for kept in (c["gc/use"], c["gc/src"]):
            assert {p: s for p, s in before.items() if p.startswith(kept + "/")} == \
                {p: s for p, s in after.items() if p.startswith(kept + "/")}
        assert not any(p.startswith((a["gc/src"] + "/", a["gc/use"] + "/", a["gc/train"] + "/")) for p in after)
    finally:
        hold.unlink()
        thread.join(30)
    plan, summary = result["run"]
    assert summary.exit_code == 0 and summary.outcomes["gc/use"].state == "SUCCESS"
