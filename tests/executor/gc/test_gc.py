"""`marin-run VOYAGE... --gc` collects by reachability (executor.gc.collect, executor.gc.sweep).

Small voyages are written to files and run in this process through the real runner and worker
(vizkit's inline backend, no Ray); `--gc` goes through the real `marin-run`. A run in progress is
a real step paused on a file inside a thread, holding its real lease.
"""

import json
import os
import threading
import time

import sys

import pytest


from kits.vizkit import run_inline  # noqa: E402

from executor.cli import main  # noqa: E402
from executor.gc.collect import OLD  # noqa: E402
from executor.storage.lease import Leases, Owner  # noqa: E402
from executor.plan import Selection  # noqa: E402
from executor.storage.store import Store  # noqa: E402
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
    fail: str = ""  # a file: while it exists, gc/train fails
    fail_src: str = ""  # a file: while it exists, gc/src fails
    loud: bool = False  # changes nothing (a bool flag, for the command line)
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
        with ctx.fs.open(ctx.fs_path("ckpt.txt").replace("ckpt.txt", ".tmp-0123abcd-ckpt.txt"), "w") as f:
            f.write("half")
        raise RuntimeError("fails on purpose")
    with ctx.open("model.txt", "w") as f:
        f.write(f"trained from {start}")


def voyage(config: Cfg):
    src = Step("gc/src", gc_blob, Blob(config.text, config.size, fail=config.fail_src))
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
    if "--gc-grace" not in args:  # outputs made a moment ago: no grace unless a test asks for it
        args = (*args, "--gc-grace", "0")
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
    # the same voyage under other overrides: not "old version", and the configs named
    label = "not reached by the named configs"
    assert {(r[0], " ".join(r[1:7])) for r in rows} == {("gc/src", label), ("gc/use", label), ("gc/train", label)}
    assert f"1 voyage ({os.path.basename(voyage_file)} --text b)" in out.splitlines()[0], out
    assert f"({sum(stale.values()):,} bytes)" in out  # the bytes of exactly the old folders
    assert "kept: reached outputs: 3," in out

    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert f"deleted 3 items, {len(stale)} files" in out
    after = files(prefix)
    logged = {p for p in after if p not in before}  # the logbook's entry of this --gc --yes, and its page
    assert {p for p in logged if not p.endswith('index.html')} and all(p.startswith('voyages/') for p in logged)
    assert {p: s for p, s in after.items() if p not in logged} == {p: s for p, s in before.items() if p not in stale}
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

    # A pinned output whose record cannot be read: what it was made from is unknown, so nothing goes.
    record = os.path.join(prefix, use_a, status_of(prefix, use_a)["dir"], ".step.json")
    saved = open(record).read()
    with open(record, "w") as f:
        f.write("{not json")
    before = files(prefix)
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 2 and f"pinned output {os.path.join(prefix, use_a)} has no readable record" in err
    assert files(prefix) == before
    with open(record, "w") as f:
        f.write(saved)

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


def attempt_dirs(prefix, dirname):
    where = os.path.join(prefix, dirname, ".attempts")
    return sorted(os.listdir(where)) if os.path.isdir(where) else []


def status_of(prefix, dirname):
    with open(os.path.join(prefix, dirname, ".status")) as f:
        return json.load(f)


def test_an_abandoned_attempt_goes_the_served_one_stays(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    run(voyage_file, prefix, text="b")
    src = dirnames(voyage_file, text="b")["gc/src"]
    plan, _ = run(voyage_file, prefix, Selection(rerun=("gc/src",)), text="b")
    first, second = attempt_dirs(prefix, src)
    assert status_of(prefix, src)["dir"] == f".attempts/{second}"
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert "abandoned attempt" in out and "deleted 1 items" in out
    assert attempt_dirs(prefix, src) == [second]

    # A failed rerun: the served attempt stays; the failed one's files go but its record (the error,
    # the history the next attempt carries on) stays.
    (tmp_path / "fail").write_text("")
    _, summary = run(voyage_file, prefix, Selection(rerun=("gc/src",)), text="b", fail_src=str(tmp_path / "fail"))
    assert summary.exit_code == 1
    failed = status_of(prefix, src)["dir"]
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert "failed attempt's files" in out
    assert os.listdir(os.path.join(prefix, src, failed)) == [".step.json"]
    assert os.path.exists(os.path.join(prefix, src, ".attempts", second, "blob.bin"))
    plan, _ = run(voyage_file, prefix, text="b")
    assert plan["gc/src"].state == "CACHED" and "still served" in plan["gc/src"].reason
    (tmp_path / "fail").unlink()
    plan, summary = run(voyage_file, prefix, Selection(rerun=("gc/src",)), text="b")
    assert summary.exit_code == 0
    record = json.load(open(os.path.join(prefix, src, status_of(prefix, src)["dir"], ".step.json")))
    assert any(a["error"] and "fails on purpose" in a["error"] for a in record["attempts"])


def test_the_attempt_a_resumable_step_resumes_is_kept(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    (tmp_path / "fail").write_text("")
    _, summary = run(voyage_file, prefix, text="b", fail=str(tmp_path / "fail"))
    assert summary.outcomes["gc/train"].state == "FAILED"
    train = dirnames(voyage_file, text="b")["gc/train"]
    lineage = status_of(prefix, train)["dir"]
    assert sorted(os.listdir(os.path.join(prefix, train, lineage))) == [".step.json", ".tmp-0123abcd-ckpt.txt",
                                                                         "ckpt.txt"]
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert "gc/train" in out and "temporaries" in out
    assert sorted(os.listdir(os.path.join(prefix, train, lineage))) == [".step.json", "ckpt.txt"]
    (tmp_path / "fail").unlink()
    _, summary = run(voyage_file, prefix, text="b")
    assert summary.exit_code == 0 and status_of(prefix, train)["dir"] == lineage  # resumed there
    with open(os.path.join(prefix, train, lineage, "model.txt")) as f:
        assert f.read() == "trained from 1"


def test_several_voyages_each_with_its_own_overrides(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    other = tmp_path / "other.py"
    other.write_text(OTHER)
    run(voyage_file, prefix, text="b")
    run(str(other), prefix, text="m")
    run(str(other), prefix, text="n")
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b")
    assert code == 0, err
    assert [line.split()[:5] for line in out.splitlines() if line.startswith("other/")] == \
        [["other/note", "not", "in", "these", "voyages"]]
    assert "note: 2 output folders of steps no named voyage has: name every voyage" in out
    code, _, err = gc(capsys, voyage_file, prefix, "--text", "b", tmp_path / "nosuch.py")
    assert code == 2 and "nosuch.py' not found" in err
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--loud", other, "--text", "m", "--yes")
    assert code == 0, err
    assert "2 voyages (gcv.py --text b --loud; other.py --text m), 4 steps reached" in out and "deleted 1 items" in out
    assert folders(prefix, "other/note") == [dirnames(str(other), text="m")["other/note"].rpartition("/")[2]]
    assert len(folders(prefix, "gc/src")) == 1


@pytest.mark.parametrize("args, words", [
    (["--yes"], "--yes only confirms --gc"),
    (["--gc", "--rerun", "gc/src"], "--gc does not combine with --rerun"),
    (["--gc", "--yes", "--dry-run"], "--gc does not combine with --dry-run"),
])
def test_bad_gc_flags_are_one_line_exit_2(tmp_path, capsys, voyage_file, args, words):
    prefix = str(tmp_path / "p")
    code = main([voyage_file, "--prefix", prefix, *args])
    _, err = capsys.readouterr()
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(prefix)


def test_symlinks_leaving_the_prefix_are_refused_and_never_followed(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    run(voyage_file, prefix, text="a")
    run(voyage_file, prefix, text="b")
    a = dirnames(voyage_file, text="a")
    outside = tmp_path / "outside"
    (outside / "x-0123456789").mkdir(parents=True)
    (outside / "x-0123456789" / ".status").write_text("{}")
    (outside / "precious.bin").write_bytes(b"p" * 10_000)
    os.symlink(outside / "precious.bin", os.path.join(prefix, a["gc/use"], "link.bin"))
    os.symlink(outside, os.path.join(prefix, "elsewhere"))  # a folder link: never entered
    inner = os.path.join(prefix, a["gc/train"], "latest")
    os.symlink(os.path.join(prefix, a["gc/train"], ".attempts"), inner)  # inside the prefix: fine
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert f"{a['gc/use']}/link.bin -> {outside / 'precious.bin'}: a symlink that leaves the prefix" in out
    assert "elsewhere" in out and "precious" not in out.split("refused")[0]
    assert os.path.isdir(os.path.join(prefix, a["gc/use"]))  # refused: left alone
    assert not os.path.exists(os.path.join(prefix, a["gc/train"]))  # its inside link went with it
    assert not os.path.exists(os.path.join(prefix, a["gc/src"]))
    assert (outside / "precious.bin").read_bytes() == b"p" * 10_000
    assert (outside / "x-0123456789" / ".status").exists()


def test_stray_temporaries_outside_outputs_go_once_old(tmp_path, capsys, voyage_file):
    prefix = str(tmp_path / "p")
    run(voyage_file, prefix, text="b")
    os.makedirs(os.path.join(prefix, "voyages", "v"))
    old, fresh, page = (os.path.join(prefix, "voyages", "v", n) for n in (".tmp-aa-index.html", ".tmp-bb-index.html",
                                                                          "index.html"))
    probe = os.path.join(prefix, ".marin-probe-0123")
    for path in (old, fresh, page, probe):
        with open(path, "w") as f:
            f.write("x" * 100)
    for path in (old, probe):
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    assert "(outside any output)" in out and "deleted 2 items, 2 files" in out
    assert not os.path.exists(old) and not os.path.exists(probe)
    assert os.path.exists(fresh) and os.path.exists(page)


def test_on_gcs(gcs_emulator, tmp_path, capsys, voyage_file):
    prefix = f"gs://marin-test/gc-{time.time_ns()}"
    store = Store(prefix)
    run(voyage_file, prefix, text="a")
    run(voyage_file, prefix, text="b")
    run(voyage_file, prefix, Selection(rerun=("gc/src",)), text="b")
    a, b = dirnames(voyage_file, text="a"), dirnames(voyage_file, text="b")
    # A run in progress elsewhere: another executor's live lease on the old gc/use.
    mine, _ = Leases(store, ttl=60, owner=Owner("elsewhere", 1, "run-elsewhere")).try_acquire(a["gc/use"])
    assert mine is not None

    def objects():
        store.fs.invalidate_cache()
        return {p[len(store.root) + 1:]: int(i["size"]) for p, i in store.fs.find(store.root, detail=True).items()}

    before = objects()
    served = status_of_gcs(store, b["gc/src"])["dir"]
    abandoned = [p for p in before if p.startswith(b["gc/src"] + "/.attempts/") and served not in p]
    going = [p for p in before if p.startswith(a["gc/train"] + "/")] + abandoned
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b")
    assert code == 0, err
    assert objects() == before
    assert f"({sum(before[p] for p in going):,} bytes)" in out
    code, out, err = gc(capsys, voyage_file, prefix, "--text", "b", "--yes")
    assert code == 0, err
    after = objects()
    assert set(before) - set(after) == set(going)
    assert status_of_gcs(store, b["gc/src"])["dir"] == served
    plan, _ = run(voyage_file, prefix, text="b")
    assert {d.state for d in plan.decisions} == {"CACHED"}


def status_of_gcs(store, dirname):
    return json.loads(store.fs.cat_file(store.path(dirname, ".status")))


def test_what_changed_after_the_listing_is_skipped_by_the_sweep(tmp_path, voyage_file):
    from executor.gc import collect as collector
    from executor.dag import build_dag
    from executor.gc.sweep import sweep

    prefix = str(tmp_path / "p")
    run(voyage_file, prefix, text="a")
    run(voyage_file, prefix, text="b")
    run(voyage_file, prefix, Selection(rerun=("gc/src",)), text="b")
    a, b = dirnames(voyage_file, text="a"), dirnames(voyage_file, text="b")
    store = Store(prefix)
    vf = load(voyage_file)
    report = collector.collect(store, collector.reached_of([build_dag(build_steps(vf, vf.config_class(text="b")))]),
                               grace=0)
    assert {(i.output, i.kind) for i in report.items} == {(a["gc/src"], OLD), (a["gc/use"], OLD),
                                                          (a["gc/train"], OLD),
                                                          (b["gc/src"], "abandoned attempt")}
    # After the listing: another executor starts on the old gc/use, and gc/src is rerun again.
    Leases(store, ttl=60, owner=Owner("elsewhere", 1, "run-elsewhere")).try_acquire(a["gc/use"])
    run(voyage_file, prefix, Selection(rerun=("gc/src",)), text="b")
    before = files(prefix)
    outcome = sweep(store, report)
    # The old gc/use, in use now, keeps the gc/src it reads.
    assert sorted(s.split(": ")[1] for s in outcome.skipped) == \
        ["in use since it was listed", "in use since it was listed", "its .status changed since it was listed"]
    assert {i.output for i in outcome.deleted} == {a["gc/train"]}
    for kept in (a["gc/use"], a["gc/src"], b["gc/src"]):
        assert {p for p in before if p.startswith(kept + "/")} <= set(files(prefix))


def test_a_lease_taken_after_the_last_look_is_skipped_as_busy(tmp_path, voyage_file, monkeypatch):
    """The window after the sweep's second read of the leases: its own try for each lease decides."""
    from executor.gc import collect as collector
    from executor.gc import sweep as sweeper
    from executor.dag import build_dag

    prefix = str(tmp_path / "p")
    run(voyage_file, prefix, text="a")
    a = dirnames(voyage_file, text="a")
    store = Store(prefix)
    vf = load(voyage_file)
    report = collector.collect(store, collector.reached_of([build_dag(build_steps(vf, vf.config_class(text="b")))]),
                               grace=0)
    monkeypatch.setattr(sweeper, "busy_now", lambda *args, **kw: {})  # the lease is taken just after it
    Leases(store, ttl=60, owner=Owner("elsewhere", 1, "run-elsewhere")).try_acquire(a["gc/train"])
    outcome = sweeper.sweep(store, report)
    assert [s.split(": ")[1].split(" (")[0] for s in outcome.skipped] == ["busy now"]
    assert os.path.exists(os.path.join(prefix, a["gc/train"], ".status"))
    assert {i.output for i in outcome.deleted} == {a["gc/src"], a["gc/use"]}


WANDB = """
from dataclasses import dataclass

from executor import Step, step_type
from steps.train.config import TrackerConfig
from steps.train.pretrain import LOGS
from steps.train.tracking import WandbTracker


@dataclass(frozen=True)
class Cfg:
    lr: float = 0.1


@step_type(version="1", resumable=True, logs=LOGS)
def gc_wandb_train(config: Cfg, ctx):
    # what a trainer does with W&B (steps/train/tracking.py): offline, its files under the output
    tracker = WandbTracker(TrackerConfig(kind="wandb", mode="offline"), ctx.name, ctx.digest, ctx.output,
                           {"lr": config.lr})
    tracker.log({"step": 1, "loss": 3.0}, 1)
    tracker.finish()
    with ctx.open("model.bin", "wb") as f:
        f.write(str(config.lr).encode() * 100)


def voyage(config: Cfg):
    return [Step("gc/wandb", gc_wandb_train, config)]
"""


def test_a_training_output_with_wandb_links_goes_and_a_grace_keeps_what_was_just_committed(tmp_path, capsys):
    """W&B (offline, really run) leaves `wandb/<run>/logs/debug-core.log` pointing into its cache,
    out of the prefix: W&B's own link, so an old version of a training output is still listed and
    deleted (the link removed, its target left). An output committed moments ago waits out the
    grace period."""
    path = tmp_path / "wb.py"
    path.write_text(WANDB)
    prefix = str(tmp_path / "p")
    run(str(path), prefix, lr=0.1)
    old = dirnames(str(path), lr=0.1)["gc/wandb"]
    links = [os.path.join(d, f) for d, ds, fs in os.walk(os.path.join(prefix, old)) for f in fs + ds
             if os.path.islink(os.path.join(d, f))]
    core = [p for p in links if p.endswith("logs/debug-core.log")]
    assert core, links  # W&B wrote its link
    target = os.path.realpath(core[0])
    assert not target.startswith(os.path.realpath(prefix)) and os.path.exists(target)
    run(str(path), prefix, lr=0.2)  # a new version: the first is old
    # committed moments ago: kept by the default grace, listed once it is over
    code, out, err = gc(capsys, str(path), prefix, "--lr", "0.2", "--gc-grace", "300", "--yes")
    assert code == 0 and "committed less than 300s ago" in out and "nothing to delete" not in err, out
    assert os.path.isdir(os.path.join(prefix, old)) and "refused" not in out
    code, out, err = gc(capsys, str(path), prefix, "--lr", "0.2", "--yes")
    assert code == 0, err
    assert OLD in out and "refused" not in out and "a symlink that leaves" not in out, out
    assert not os.path.exists(os.path.join(prefix, old))
    assert os.path.exists(target)  # W&B's own log in its cache: only the link went
    assert len(folders(prefix, "gc/wandb")) == 1
    # a link that is not W&B's, out of the prefix, still refuses its folder
    new = dirnames(str(path), lr=0.2)["gc/wandb"]
    os.symlink(target, os.path.join(prefix, new, "stolen.log"))
    code, out, err = gc(capsys, str(path), prefix, "--lr", "0.3", "--yes")
    assert f"{new}/stolen.log -> {target}: a symlink that leaves the prefix" in out, out
    assert os.path.isdir(os.path.join(prefix, new)) and os.path.exists(target)


@pytest.mark.parametrize("args, words", [
    (["--gc", "--gc-grace", "-1"], "must be 0 or more seconds"),
    (["--gc", "--gc-grace", "soon"], "is not a number of seconds"),
    (["--gc-grace", "5"], "--gc-grace only applies to --gc"),
])
def test_bad_gc_grace_is_one_line_exit_2(tmp_path, capsys, voyage_file, args, words):
    prefix = str(tmp_path / "p")
    code = main([voyage_file, "--prefix", prefix, *args])
    _, err = capsys.readouterr()
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
