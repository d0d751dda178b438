""""A cache you can trust": each hole reproduced as a new user met it, with a small
voyage through the real `marin-run` on the session's embedded Ray.

Items 5 (fingerprint) and 8 (identity edge cases) are in test_fingerprint.py and
test_identity.py; the CLI's bad inputs (item 9) in test_cli.py.
"""

import json
import os
import shutil
import sys
import time

import pytest

from kits.trustkit import cli, files_under, folder, one_error_line, read, status, write_voyage  # noqa: E402


@pytest.fixture
def voyage_dir(tmp_path_factory):
    """One folder for every voyage file of this module: see trustkit's docstring."""
    return tmp_path_factory.getbasetemp() / "trust-voyage"


@pytest.fixture(autouse=True)
def ray_here(ray_local):
    yield


XEC = """
def voyage():
    x = Step("x", write, Text("X"))
    e = Step("e", write, Text("E"))
    return [Step("c", join, Pair(output_of(x, "out.txt"), output_of(e, "out.txt")))]
"""


def _voyage(voyage_dir, body):
    os.makedirs(voyage_dir, exist_ok=True)
    return write_voyage(voyage_dir, body)


# -- item 1: an input with no output never counts as up to date ----------------------------------

def test_item1_rerun_downstream_never_runs_a_consumer_on_an_input_without_output(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, XEC), tmp_path / "p"
    assert cli([v, "--prefix", prefix, "--no-live-page"], capsys)[0] == 0
    shutil.rmtree(folder(prefix, "e"))  # e's output is gone
    code, out, err = cli([v, "--prefix", prefix, "--no-live-page", "--rerun", "x", "--downstream"], capsys)
    assert code == 0, out + err
    assert read(prefix, "c", "joined.txt") == "X+E"  # never "X+<missing>"
    assert None not in status(prefix, "c")["inputs"].values()
    code, out, _ = cli([v, "--prefix", prefix, "--dry-run"], capsys)
    assert code == 0 and "CACHED 3" in out.splitlines()[0], out


def test_item1_a_recorded_input_of_none_never_counts_as_up_to_date(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, XEC), tmp_path / "p"
    assert cli([v, "--prefix", prefix, "--no-live-page"], capsys)[0] == 0
    # what the old executor left after running c while e had no output
    e_digest = os.path.basename(folder(prefix, "e")).rpartition("-")[2]
    path = os.path.join(folder(prefix, "c"), ".status")
    st = json.loads(open(path).read())
    st["inputs"] = {k: (None if k == "e" or k.startswith(e_digest) else v) for k, v in st["inputs"].items()}
    open(path, "w").write(json.dumps(st))
    code, out, _ = cli([v, "--prefix", prefix, "--dry-run"], capsys)
    assert code == 0 and "RUN 1" in out.splitlines()[0] and "CACHED 2" in out.splitlines()[0], out
    line = next(line for line in out.splitlines() if line.startswith("c "))
    assert "input e" in line and "no output" in line, line
    code, out, _ = cli([v, "--prefix", prefix, "--no-live-page"], capsys)
    assert code == 0 and read(prefix, "c", "joined.txt") == "X+E"
    assert None not in status(prefix, "c")["inputs"].values()


def test_item1_an_input_whose_output_vanished_after_planning_blocks_its_consumer(voyage_dir, tmp_path, capsys):
    from executor.api import plan_steps, run_plan
    from executor.plan import Selection
    from executor.voyage import build_steps, load

    v, prefix = _voyage(voyage_dir, XEC), str(tmp_path / "p")
    assert cli([v, "--prefix", prefix, "--no-live-page"], capsys)[0] == 0
    vf = load(v)
    plan = plan_steps(build_steps(vf, None), prefix, Selection(rerun=("c",)))
    assert plan["e"].state == "CACHED"
    shutil.rmtree(folder(prefix, "e"))  # deleted between the plan and the run
    summary = run_plan(plan, pickle_by_value=[vf.module])
    c = summary.outcomes["c"]
    assert c.state == "BLOCKED" and "input e has no output" in c.reason, c
    assert read(prefix, "c", "joined.txt") == "X+E" and status(prefix, "c")["state"] == "SUCCESS"  # untouched


# -- item 2: --rerun X --downstream on a fresh prefix ----------------------------------------------

def test_item2_rerun_downstream_on_a_fresh_prefix_runs_what_is_downstream(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, XEC), tmp_path / "p"
    code, out, err = cli([v, "--prefix", prefix, "--no-live-page", "--rerun", "x", "--downstream"], capsys)
    assert code == 0, out + err
    assert "needed only by cached steps" not in out
    assert read(prefix, "c", "joined.txt") == "X+E"


# -- item 3: inputs keyed by name, not digest --------------------------------------------------------

SAME_RECIPE = """
@step_type(version="1")
def same_recipe(config: Text, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(config.text + " from " + ctx.name)  # the same recipe, other bytes under another name

def voyage():
    a = Step("a", same_recipe, Text("same"))
    b = Step("b", same_recipe, Text("same"))
    return [Step("c", join, Pair(output_of(a, "out.txt"), output_of(b, "out.txt")))]
"""


def test_item3_two_inputs_with_one_digest_are_two_inputs(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, SAME_RECIPE), tmp_path / "p"
    assert cli([v, "--prefix", prefix, "--no-live-page"], capsys)[0] == 0
    assert sorted(status(prefix, "c")["inputs"]) == ["a", "b"]
    code, out, _ = cli([v, "--prefix", prefix, "--dry-run"], capsys)
    assert "CACHED 3" in out.splitlines()[0], out
    code, out, _ = cli([v, "--prefix", prefix, "--no-live-page", "--downstream"], capsys)
    code, out, _ = cli([v, "--prefix", prefix, "--dry-run"], capsys)
    assert "CACHED 3" in out.splitlines()[0], out


# -- item 4: references in sets, named tuples, dict keys ---------------------------------------------

NAMED_TUPLE = """
class Both(NamedTuple):
    left: InputPath
    right: InputPath

@dataclass(frozen=True)
class Wrapped:
    both: Both

@step_type(version="1")
def check_both(config: Wrapped, ctx):
    assert type(config.both).__name__ == "Both", type(config.both)
    assert all(isinstance(u, str) for u in config.both), config.both
    with ctx.open("out.txt", "w") as f:
        f.write(config.both.left.rpartition("/")[2])

def voyage():
    x = Step("x", write, Text("X"))
    return [Step("nt", check_both, Wrapped(Both(output_of(x, "out.txt"), output_of(x))))]
"""


def test_item4_a_named_tuple_of_references_reaches_the_step_as_that_named_tuple(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, NAMED_TUPLE), tmp_path / "p"
    code, out, err = cli([v, "--prefix", prefix, "--no-live-page"], capsys)
    assert code == 0, out + err
    assert read(prefix, "nt", "out.txt") == "out.txt"


@pytest.mark.parametrize("field, value, where", [
    ("parts: frozenset", "frozenset({output_of(x)})", "config.parts"),
    ("table: dict", "{output_of(x, 'out.txt'): 1}", "config.table"),
    ("deep: tuple", "({'k': {output_of(x)}},)", "config.deep[0]['k']"),
])
def test_item4_a_reference_without_a_place_is_refused_when_the_dag_is_built(voyage_dir, tmp_path, capsys, field,
                                                                            value, where):
    v = _voyage(voyage_dir, f"""
@dataclass(frozen=True)
class Holder:
    {field}

@step_type(version="1")
def hold_refs(config: Holder, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(repr(config))

def voyage():
    x = Step("x", write, Text("X"))
    return [Step("h", hold_refs, Holder({value}))]
""")
    prefix = tmp_path / "p"
    code, _, err = cli([v, "--prefix", prefix, "--no-live-page"], capsys)
    line = one_error_line(err)
    assert code == 2 and "step 'h'" in line and where in line and "output_of" in line, line
    assert files_under(prefix) == []


# -- item 6: --rerun of a resumable step starts clean -------------------------------------------------

RESUMABLE = """
@dataclass(frozen=True)
class Salted:
    salt_file: str = run_only(default="")

@step_type(version="1", resumable=True)
def resume_shards(config: Salted, ctx):
    salt = open(config.salt_file).read()
    for i in range(2):
        if not ctx.exists(f"shard-{i}"):  # the ledger: a committed shard is skipped on resume
            with ctx.open(f"shard-{i}", "w") as f:
                f.write(salt)

@dataclass(frozen=True)
class VConfig:
    salt_file: str = ""

def voyage(config: VConfig):
    return [Step("s", resume_shards, Salted(config.salt_file))]
"""


def test_item6_rerun_of_a_resumable_step_starts_clean(voyage_dir, tmp_path, capsys):
    v, prefix, salt = _voyage(voyage_dir, RESUMABLE), tmp_path / "p", tmp_path / "salt"
    salt.write_text("one")
    args = [v, "--prefix", prefix, "--no-live-page", "--salt_file", salt]
    assert cli(args, capsys)[0] == 0
    salt.write_text("two")
    code, out, err = cli(args + ["--rerun", "s"], capsys)
    assert code == 0, out + err
    assert read(prefix, "s", "shard-0") == read(prefix, "s", "shard-1") == "two"


RESUMABLE_CONSUMER = """
@dataclass(frozen=True)
class Salty:
    salt_file: str = run_only(default="")

@step_type(version="1")
def salted_source(config: Salty, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(open(config.salt_file).read())

@dataclass(frozen=True)
class Copy:
    src: InputPath

@step_type(version="1", resumable=True)
def resume_copy(config: Copy, ctx):
    for i in range(2):
        if not ctx.exists(f"shard-{i}"):  # the ledger: a committed shard is skipped on resume
            with ctx.open(f"shard-{i}", "w") as f, fsspec.open(config.src, "r") as src:
                f.write(src.read())

@dataclass(frozen=True)
class VConfig:
    salt_file: str = ""

def voyage(config: VConfig):
    x = Step("x", salted_source, Salty(config.salt_file))
    return [Step("r", resume_copy, Copy(output_of(x, "out.txt")))]
"""


def test_item6_a_resumable_step_whose_inputs_changed_starts_clean(voyage_dir, tmp_path, capsys):
    v, prefix, salt = _voyage(voyage_dir, RESUMABLE_CONSUMER), tmp_path / "p", tmp_path / "salt"
    salt.write_text("one")
    args = [v, "--prefix", prefix, "--no-live-page", "--salt_file", salt]
    assert cli(args, capsys)[0] == 0
    salt.write_text("two")
    code, out, err = cli(args + ["--rerun", "x", "--downstream"], capsys)
    assert code == 0, out + err
    assert read(prefix, "r", "shard-0") == read(prefix, "r", "shard-1") == "two"


RESUMABLE_FAILING = """
import os

@dataclass(frozen=True)
class Once:
    marker: str = run_only(default="")

@step_type(version="1", resumable=True)
def fail_once(config: Once, ctx):
    if not ctx.exists("shard-0"):
        with ctx.open("shard-0", "w") as f:
            f.write("made by the first code")
    if not os.path.exists(config.marker):  # the first attempt dies after its first shard
        open(config.marker, "w").close()
        raise RuntimeError("killed")

@dataclass(frozen=True)
class VConfig:
    marker: str = ""

def voyage(config: VConfig):
    return [Step("f", fail_once, Once(config.marker))]
"""


def test_item6_a_resumable_step_whose_code_changed_starts_clean(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, RESUMABLE_FAILING), tmp_path / "p"
    args = [v, "--prefix", prefix, "--no-live-page", "--marker", tmp_path / "marker"]
    assert cli(args, capsys)[0] == 1  # the first attempt leaves shard-0 and fails
    with open(v) as f:
        text = f.read()
    with open(v, "w") as f:
        f.write(text.replace("made by the first code", "made by the fixed code"))
    code, out, err = cli(args, capsys)
    assert code == 0 and "RETRY" in out, out + err
    assert read(prefix, "f", "shard-0") == "made by the fixed code"


# -- item 11: logs are not artifacts --------------------------------------------------------------------

LOGS = """
@step_type(version="1", logs=("logs/**", "timing.json"))
def log_train(config: Text, ctx):
    with ctx.open("model.txt", "w") as f:
        f.write(config.text)
    with ctx.open("logs/run/events.log", "w") as f:
        f.write(f"started {time.time()}")
    with ctx.open("timing.json", "w") as f:
        f.write(str(time.perf_counter()))

@step_type(version="1")
def log_eval(config: Text, ctx):
    with ctx.open("score.txt", "w") as f:
        f.write(open(config.text).read()[::-1])

def voyage():
    t = Step("t", log_train, Text("weights"))
    return [Step("ev", log_eval, Text(output_of(t, "model.txt")))]
"""


def test_item11_an_identical_rerun_with_new_logs_cuts_off_downstream(voyage_dir, tmp_path, capsys):
    v, prefix = _voyage(voyage_dir, LOGS), tmp_path / "p"
    assert cli([v, "--prefix", prefix, "--no-live-page"], capsys)[0] == 0
    before = status(prefix, "t")["output_digest"]
    code, out, err = cli([v, "--prefix", prefix, "--no-live-page", "--rerun", "t", "--downstream"], capsys)
    assert code == 0, out + err
    assert status(prefix, "t")["output_digest"] == before
    assert "early cutoff" in out and "STALE" not in out.split("voyage finished")[1]
    record = json.loads(read(prefix, "t", ".step.json"))
    logs = sorted(e["path"] for e in record["manifest"] if e.get("log"))
    assert logs == ["logs/run/events.log", "timing.json"]  # kept, listed, not digested


# -- item 12: a consumer reading an input while another executor reruns it ----------------------------

WHILE_RERUN = """
import os

@dataclass(frozen=True)
class Salty:
    salt_file: str = run_only(default="")

@step_type(version="1")
def salty(config: Salty, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(open(config.salt_file).read())

@dataclass(frozen=True)
class SlowRead:
    src: InputPath
    reading: str = run_only(default="")  # touched once the input was read
    go: str = run_only(default="")  # waited for before the step returns

@step_type(version="1")
def slow_read(config: SlowRead, ctx):
    with fsspec.open(config.src, "r") as f:
        text = f.read()
    open(config.reading, "w").close()
    deadline = time.time() + 30
    while not os.path.exists(config.go) and time.time() < deadline:
        time.sleep(0.05)
    with ctx.open("copy.txt", "w") as f:
        f.write(text)

@dataclass(frozen=True)
class Files:
    salt: str = ""
    reading: str = ""
    go: str = ""

def voyage(config: Files):
    x = Step("x", salty, Salty(config.salt))
    return [Step("c", slow_read, SlowRead(output_of(x, "out.txt"), config.reading, config.go))]
"""


def _files_voyage(voyage_dir, tmp_path):
    from executor.voyage import build_steps, load

    vf = load(_voyage(voyage_dir, WHILE_RERUN))
    files = {k: str(tmp_path / k) for k in ("salt", "reading", "go")}
    open(files["salt"], "w").write("one")
    return vf, files, build_steps(vf, vf.config_class(**files))


def test_item12_a_consumer_whose_input_is_rerun_while_it_reads_never_succeeds(voyage_dir, tmp_path):
    import threading

    from executor.api import run_steps
    from executor.plan import Selection

    vf, files, steps = _files_voyage(voyage_dir, tmp_path)
    prefix = str(tmp_path / "p")
    first: list = []
    reader = threading.Thread(target=lambda: first.append(run_steps(steps, prefix, pickle_by_value=[vf.module])))
    reader.start()
    try:
        deadline = time.time() + 60
        while not os.path.exists(files["reading"]):
            assert time.time() < deadline, "c never started"
            time.sleep(0.05)
        open(files["salt"], "w").write("two")  # another executor reruns x with other bytes
        _, other = run_steps(steps, prefix, Selection(rerun=("x",)), pickle_by_value=[vf.module])
        assert other.outcomes["x"].state == "SUCCESS"
    finally:
        open(files["go"], "w").close()
        reader.join(60)
    _, summary = first[0]
    c = summary.outcomes["c"]
    assert c.state == "FAILED" and "input x changed while c read it" in c.error, c
    assert status(prefix, "c")["state"] != "SUCCESS"


def test_item12_a_consumer_whose_input_is_being_rerun_when_it_starts_is_blocked(voyage_dir, tmp_path):
    from executor.api import plan_steps, run_plan, run_steps
    from executor.plan import Selection
    from executor.storage.store import Status, Store

    vf, files, steps = _files_voyage(voyage_dir, tmp_path)
    open(files["go"], "w").close()
    prefix = str(tmp_path / "p")
    assert run_steps(steps, prefix, pickle_by_value=[vf.module])[1].exit_code == 0
    plan = plan_steps(steps, prefix, Selection(rerun=("c",)))
    x = plan.dag["x"]
    # after this plan, another executor takes x over to rerun it, and nothing of x is committed
    # (a folder written before attempts kept the committed output served)
    Store(prefix).write_status(x.dirname, Status(state="RUNNING", digest=x.digest, attempt=2, token=9))
    summary = run_plan(plan, pickle_by_value=[vf.module])
    c = summary.outcomes["c"]
    assert c.state == "BLOCKED" and "input x has no output" in c.reason, c
    assert status(prefix, "c")["state"] == "SUCCESS" and read(prefix, "c", "copy.txt") == "one"  # untouched


# -- item 5: a changed default or helper is never CACHED silently -------------------------------------

DEFAULTS = """
def scale(n):
    return n * 2

@dataclass(frozen=True)
class Knob:
    n: int = 1

@step_type(version="1")
def drift_knob(config: Knob, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(str(scale(config.n)))

def voyage():
    return [Step("k", drift_knob, Knob())]
"""


@pytest.mark.parametrize("edit, named", [
    (("n: int = 1", "n: int = 1000"), "default of v.Knob.n: 1 -> 1000"),
    (("n * 2", "n * 3"), "v.scale changed"),
])
def test_item5_a_changed_default_or_helper_plans_cached_with_a_note_naming_it(voyage_dir, tmp_path, capsys, edit,
                                                                             named):
    v, prefix = _voyage(voyage_dir, DEFAULTS), tmp_path / "p"
    assert cli([v, "--prefix", prefix, "--no-live-page"], capsys)[0] == 0
    with open(v) as f:
        text = f.read()
    with open(v, "w") as f:
        f.write(text.replace(*edit))
    code, out, _ = cli([v, "--prefix", prefix, "--dry-run"], capsys)
    line = next(line for line in out.splitlines() if line.startswith("k "))
    assert code == 0 and "code drifted" in line and named in line, line
