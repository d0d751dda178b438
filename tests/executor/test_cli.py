"""`marin-run`: flags, the voyage's config through draccus, exit codes and one-line errors."""

import os
import subprocess
import sys
import textwrap

import pytest

from executor.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELLO = os.path.join(ROOT, "voyages", "hello.py")


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("marin-run: error: ")
    return lines[0]


def write_voyage(tmp_path, body, name="v.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


VOYAGE_HEAD = """
from dataclasses import dataclass
from executor import Step, step_type, output_of

@dataclass(frozen=True)
class Cfg:
    n: int = 2

@dataclass(frozen=True)
class C:
    src: str = ""

@step_type(version="1")
def t(config: C, ctx):
    pass
"""


def test_help_lists_flags_and_config_fields_without_ray_or_torch():
    code = ("import sys; from executor.cli import main; rc = main([%r, '--help']); "
            "print('IMPORTED', [m for m in ('ray', 'torch') if m in sys.modules]); sys.exit(rc)" % HELLO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for flag in ("--dry-run", "--rerun", "--downstream", "--only", "--prefix", "--ray-address", "--max-concurrent",
                 "--n_files", "--words_per_file", "--top_k"):
        assert flag in out.stdout
    assert "IMPORTED []" in out.stdout


def test_dry_run_prints_counts_then_steps_and_writes_nothing(tmp_path, capsys):
    prefix = tmp_path / "prefix"
    code, out, err = run_cli([HELLO, "--dry-run", "--prefix", str(prefix), "--n_files", "3"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("plan of 8 steps") and "RUN 8" in lines[0]
    assert any("hello/count/2" in line and str(prefix) in line and "new step" in line for line in lines)
    assert not prefix.exists()


def test_missing_voyage_file(tmp_path, capsys):
    code, _, err = run_cli([str(tmp_path / "nope.py"), "--dry-run"], capsys)
    assert code == 2 and "not found" in one_error_line(err)


def test_syntax_error_names_file_and_line(tmp_path, capsys):
    path = write_voyage(tmp_path, "x = 1\ndef voyage(:\n    pass\n")
    code, _, err = run_cli([path, "--dry-run"], capsys)
    assert code == 2 and f"{path}:2:" in one_error_line(err)


def test_exception_in_voyage_names_file_and_line(tmp_path, capsys):
    path = write_voyage(tmp_path, VOYAGE_HEAD + "\ndef voyage(config: Cfg):\n    return [1 / 0]\n")
    code, _, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p")], capsys)
    line = one_error_line(err)
    assert code == 2 and f"{path}:18: ZeroDivisionError" in line


def test_unknown_flag_gives_usage(capsys):
    code, _, err = run_cli([HELLO, "--dry-run", "--no-such-flag", "3"], capsys)
    line = one_error_line(err)
    assert code == 2 and "unrecognized arguments: --no-such-flag 3" in line and "--help" in line


def test_config_value_of_the_wrong_type_names_the_field(capsys):
    code, _, err = run_cli([HELLO, "--dry-run", "--n_files", "many"], capsys)
    line = one_error_line(err)
    assert code == 2 and "n_files" in line and "many" in line


def test_cycle_is_exit_2(tmp_path, capsys):
    path = write_voyage(tmp_path, VOYAGE_HEAD + """
def voyage(config: Cfg):
    a = Step("a", t, C(src=output_of("b")))
    b = Step("b", t, C(src=output_of(a)))
    return [a, b]
""")
    code, _, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p")], capsys)
    assert code == 2 and "cycle between steps: a -> b -> a" in one_error_line(err)


@pytest.mark.parametrize("name", ["../up", "/abs", "bad name!"])
def test_bad_step_name_is_exit_2_with_file_and_line(tmp_path, capsys, name):
    path = write_voyage(tmp_path, VOYAGE_HEAD + f"""
def voyage(config: Cfg):
    return [Step({name!r}, t, C())]
""")
    code, _, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p")], capsys)
    line = one_error_line(err)
    assert code == 2 and "bad step name" in line and f"{path}:18" in line


def test_unknown_rerun_name_suggests_the_closest(tmp_path, capsys):
    code, _, err = run_cli([HELLO, "--dry-run", "--prefix", str(tmp_path), "--rerun", "hello/merj"], capsys)
    line = one_error_line(err)
    assert code == 2 and "no step named 'hello/merj'" in line and "hello/merge" in line


def test_unwritable_prefix_is_found_before_anything_runs(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli([HELLO, "--prefix", str(blocker / "out")], capsys)
    assert code == 2 and "cannot be written" in one_error_line(err)


def test_run_cached_rerun_and_failure_exit_codes(tmp_path, capsys, ray_local):
    prefix = str(tmp_path / "p")
    code, out, _ = run_cli([HELLO, "--prefix", prefix, "--n_files", "2"], capsys)
    assert code == 0 and "SUCCESS 6" in out
    report = next((tmp_path / "p" / "hello").glob("report-*/.attempts/*/report.md")).read_text()  # its one attempt
    assert report.startswith("| word | count | share |")
    code, out, _ = run_cli([HELLO, "--prefix", prefix, "--n_files", "2"], capsys)
    assert code == 0 and "CACHED 6" in out and "nothing to run" in out
    code, out, _ = run_cli([HELLO, "--prefix", prefix, "--n_files", "2", "--rerun", "hello/merge", "--note", "why"],
                           capsys)
    assert code == 0 and "RERUN 1" in out and "SUCCESS 1" in out
    # the log (docs/logbook.md): the two runs that ran steps, the second with its flags and note
    from executor.logbook import entries
    from executor.storage.store import Store

    second, first = entries(Store(prefix), "hello")
    assert first["counts"] == {"ran": 6} and first["flags"]["overrides"] == ["--n_files", "2"]
    assert second["flags"]["rerun"] == ["hello/merge"] and second["note"] == "why"
    assert second["steps"]["hello/merge"]["state"] == "ran" and second["config_diff"] == []
    failing = write_voyage(tmp_path, VOYAGE_HEAD + """
@step_type(version="1")
def boom(config: C, ctx):
    raise ValueError("no good")

def voyage(config: Cfg):
    return [Step("boom", boom, C()), Step("fine", t, C())]
""", name="failing.py")
    code, out, _ = run_cli([failing, "--prefix", prefix], capsys)
    assert code == 1 and "FAILED" in out and "ValueError: no good" in out and ".step.json" in out
    failed = entries(Store(prefix), "failing")[0]["steps"]["boom"]
    assert failed["state"] == "failed" and failed["failure"] and "ValueError: no good" in failed["stack"]


# -- exact flags, bad values refused in one line, nothing written -------------------

FLAGS_VOYAGE = VOYAGE_HEAD.replace("n: int = 2", "n: int = 2\n    max: int = 0\n    name: str = 'x'") + """
def voyage(config: Cfg):
    return [Step("s", t, C(src=config.name))]

def summary(config: Cfg):
    return f"max={config.max}"
"""


def test_flags_are_exact_and_never_abbreviations(tmp_path, capsys):
    path = write_voyage(tmp_path, FLAGS_VOYAGE)
    code, out, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p"), "--max", "7"], capsys)
    assert code == 0 and "max=7" in out, out + err  # the voyage's field, not --max-concurrent
    code, _, err = run_cli([path, "--dry-run", "--pre", str(tmp_path / "q")], capsys)
    assert code == 2 and "unrecognized arguments: --pre" in one_error_line(err)


@pytest.mark.parametrize("args, env, words", [
    (["--lease-ttl", "0"], {}, "--lease-ttl"),
    (["--lease-ttl", "-5"], {}, "--lease-ttl"),
    (["--lease-ttl", "nan"], {}, "--lease-ttl"),
    (["--lease-ttl", "inf"], {}, "--lease-ttl"),
    ([], {"MARIN_LEASE_TTL": "abc"}, "MARIN_LEASE_TTL"),
    (["--max-concurrent", "0"], {}, "--max-concurrent"),
    (["--prefix", ""], {}, "--prefix"),
    (["--prefix", "   "], {}, "--prefix"),
])
def test_bad_executor_settings_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, args, env, words):
    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = write_voyage(tmp_path, FLAGS_VOYAGE)
    code, _, err = run_cli([path, *args], capsys)
    assert code == 2 and words in one_error_line(err)
    assert sorted(os.listdir(tmp_path)) == ["v.py"]


def test_a_lone_surrogate_in_a_config_string_is_one_line(tmp_path, capsys):
    path = write_voyage(tmp_path, FLAGS_VOYAGE)
    code, _, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p"), "--name", "bad\udcff"], capsys)
    line = one_error_line(err)
    assert code == 2 and "--name" in line and "surrogate" in line, line


@pytest.mark.parametrize("name", ["x/./y", "x/../y", "./x", "x/.", "x//y", "x/"])
def test_step_names_that_alias_folders_are_refused(tmp_path, capsys, name):
    path = write_voyage(tmp_path, VOYAGE_HEAD + f"""
def voyage(config: Cfg):
    return [Step({name!r}, t, C())]
""")
    code, _, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p")], capsys)
    assert code == 2 and "bad step name" in one_error_line(err)


def test_rerun_of_an_unknown_step_creates_nothing(tmp_path, capsys):
    prefix = tmp_path / "p"
    code, _, err = run_cli([HELLO, "--prefix", str(prefix), "--rerun", "nosuch"], capsys)
    assert code == 2 and "no step named 'nosuch'" in one_error_line(err)
    assert not prefix.exists()


def test_a_corrupt_status_is_explained_as_corrupt(tmp_path, capsys, ray_local):
    path = write_voyage(tmp_path, VOYAGE_HEAD + """
def voyage(config: Cfg):
    return [Step("s", t, C())]
""")
    prefix = tmp_path / "p"
    assert run_cli([path, "--prefix", str(prefix), "--no-live-page"], capsys)[0] == 0
    (status,) = prefix.glob("s-*/.status")
    status.write_text('{"state": "SUCC')
    code, out, _ = run_cli([path, "--dry-run", "--prefix", str(prefix)], capsys)
    line = next(line for line in out.splitlines() if line.startswith("s "))
    assert code == 0 and "corrupt" in line and ".status" in line and "new step" not in line, line


# -- bad voyages and settings are one line and exit 2 ---------------------------------

@pytest.mark.parametrize("body, named", [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0) while it was imported"),
    (VOYAGE_HEAD + "\n@step_type(version='1', name='t2')\ndef a(config: C, ctx):\n    pass\n\n"
     "@step_type(version='1', name='t2')\ndef b(config: C, ctx):\n    pass\n\ndef voyage(cfg: Cfg):\n"
     "    return [Step('a', a, C()), Step('b', b, C())]\n", "two step types are named 't2'"),
    (VOYAGE_HEAD + "\n@dataclass(frozen=True)\nclass L:\n    xs: object = None\n\ndef voyage(cfg: Cfg):\n"
     "    loop = []\n    loop.append(loop)\n    return [Step('s', t, L(loop))]\n", "config.xs[0]: the config holds itself"),
    (VOYAGE_HEAD + "\n@dataclass(frozen=True)\nclass L:\n    xs: object = None\n\ndef voyage(cfg: Cfg):\n"
     "    deep = []\n    for _ in range(3000):\n        deep = [deep]\n    return [Step('s', t, L(deep))]\n",
     "nests deeper than 200 levels"),
    (VOYAGE_HEAD + "\ndef voyage(cfg: Cfg):\n    return [Step('x' * 300, t, C())]\n", "is 311 bytes; a store holds at most 255"),
])
def test_bad_voyages_are_one_line_and_exit_2(tmp_path, capsys, body, named):
    v = str(tmp_path / "v20.py")
    with open(v, "w") as f:
        f.write(body)
    code, out, err = run_cli([v, "--dry-run", "--prefix", str(tmp_path / "p")], capsys)
    assert code == 2 and named in one_error_line(err), err
    assert not os.path.exists(tmp_path / "p")


def test_ray_failing_to_start_is_exit_2_in_one_line(tmp_path):
    """A local Ray that cannot start (here: its temp folder is a file) is a setting, not a step
    that failed: one line, exit 2."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {**os.environ, "RAY_TMPDIR": str(blocker), "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    out = subprocess.run([sys.executable, "-m", "executor.cli", HELLO, "--prefix", str(tmp_path / "p"),
                          "--no-live-page"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip() and "marin-run: error" in line]
    assert out.returncode == 2 and len(lines) == 1 and "starting a local Ray failed" in lines[0], out.stderr[-2000:]


HELP_VOYAGE = """
from dataclasses import dataclass
from executor import Step, step_type

@dataclass(frozen=True)
class Inner:
    depth: int = 1  # how deep the inner thing goes

@dataclass(frozen=True)
class Cfg:
    n: int = 2  # how many steps the voyage makes
    inner: Inner = Inner()

@dataclass(frozen=True)
class C:
    i: int

@step_type(version="1")
def t(config: C, ctx):
    pass

def voyage(config: Cfg):
    return [Step(f"h/s{i}", t, C(i * config.inner.depth)) for i in range(config.n)]
"""


def test_only_help_reads_the_voyage_source_for_field_help(tmp_path, capsys, monkeypatch):
    """draccus builds each field's help from the config class's source (inspect.getsource parses
    the whole voyage file): a dry-run, and a bad value's error, read none of it; --help still
    shows the fields' comments, nested ones included."""
    import draccus.wrappers.docstring as docstring
    import inspect

    path = write_voyage(tmp_path, HELP_VOYAGE)
    real = inspect.getsource
    read: list[str] = []

    def spy(obj):
        read.append(getattr(obj, "__qualname__", repr(obj)))
        return real(obj)

    monkeypatch.setattr(inspect, "getsource", spy)
    docstring._get_class_source.cache_clear()
    code, out, _ = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p"), "--n", "3", "--inner.depth", "2"],
                           capsys)
    assert code == 0 and "RUN 3" in out.splitlines()[0]
    code, _, err = run_cli([path, "--dry-run", "--prefix", str(tmp_path / "p"), "--n", "x"], capsys)
    assert code == 2 and "'x'" in one_error_line(err)
    assert not {"Cfg", "Inner"} & set(read)  # (`t` is read: the file is loaded twice in this process)
    assert docstring.get_attribute_docstring.__module__ == docstring.__name__  # put back after each parse
    code, out, _ = run_cli([path, "--help"], capsys)
    assert code == 0
    assert "how many steps the voyage makes" in out and "how deep the inner thing goes" in out
    assert "Cfg" in read


def test_the_collector_paused_for_planning_is_running_again_after(tmp_path, capsys):
    """main() pauses the cyclic garbage collector while it plans (no cycles, many objects); a
    caller in the same process gets it back running, after a plan and after an error."""
    import gc

    assert gc.isenabled()
    code, _, _ = run_cli([HELLO, "--dry-run", "--prefix", str(tmp_path / "p")], capsys)
    assert code == 0 and gc.isenabled()
    code, _, _ = run_cli([str(tmp_path / "missing.py"), "--dry-run"], capsys)
    assert code == 2 and gc.isenabled()


HEAVY = ("fsspec", "pydantic", "rich", "ray", "torch", "importlib.metadata")


def test_a_dry_run_of_a_cached_local_prefix_imports_no_fsspec_pydantic_or_rich(tmp_path):
    """The whole process of a dry-run is mostly imports; a plan of a local folder whose
    steps are all cached, printed to a pipe, reads `.status` files with `open` and lays the
    table out itself. Running (or reading a record) still goes through fsspec and pydantic."""
    from kits.vizkit import InlineBackend

    from executor import voyage as voyage_mod
    from executor.api import plan_steps
    from executor.runner import Runner

    path = write_voyage(tmp_path, VOYAGE_HEAD + """
def voyage(config: Cfg):
    a = Step("a", t, C("x"))
    return [a] + [Step(f"b/{i}", t, C(output_of(a))) for i in range(config.n)]
""")
    prefix = str(tmp_path / "out")
    vf = voyage_mod.load(path)
    plan = plan_steps(voyage_mod.build_steps(vf, vf.config_class()), prefix)
    assert Runner(plan, InlineBackend(), poll=0.01).run().exit_code == 0
    code = ("import sys; from executor.cli import main; rc = main(sys.argv[1:]); "
            f"print('IMPORTED', [m for m in {HEAVY!r} if m in sys.modules]); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, path, "--dry-run", "--prefix", prefix],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert f"plan of 3 steps under {prefix}: CACHED 3" in out.stdout and "IMPORTED []" in out.stdout, out.stdout


def test_only_the_command_itself_leaves_its_dry_runs_plan_to_the_exit(tmp_path):
    """`marin-run --dry-run` (main() reading the process's own argv) ends with the collector off
    and the plan frozen (the OS frees it, no last collection walks it); a caller of main(argv)
    keeps its collector as it was."""
    code = ("import gc, sys; from executor.cli import main; args = sys.argv[1:]; "
            "rc = main(args); print('CALLER', gc.isenabled(), gc.get_freeze_count()); "
            "sys.argv[1:] = args; rc = main(); print('COMMAND', gc.isenabled(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code, HELLO, "--dry-run", "--prefix", str(tmp_path / "p")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "CALLER True 0" in out.stdout and "COMMAND False True" in out.stdout, out.stdout


@pytest.mark.parametrize("voyage, rc", [(HELLO, 0), ("no/such/voyage.py", 2)])
def test_a_dry_run_command_skips_the_teardown_but_not_the_exit_handlers(tmp_path, voyage, rc):
    """The command's dry-run ends after every exit handler has run, with main's exit code and its
    output flushed, and without the interpreter's teardown: torn down beside the frozen plan,
    Triton's bindings (imported by torch._dynamo, as the 535B plan's trace does) reported their
    objects as leaks, some 30 lines after every plan."""
    code = textwrap.dedent("""
        import atexit, sys
        import torch._dynamo  # noqa: F401
        from executor.cli import main
        atexit.register(lambda: print('HANDLER', flush=True))
        rc = main()
        print('RETURNED', rc)
        sys.exit(rc)
    """)
    out = subprocess.run([sys.executable, "-c", code, voyage, "--dry-run", "--prefix", str(tmp_path / "p")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == rc, out.stderr
    assert f"RETURNED {rc}" in out.stdout and out.stdout.rstrip().endswith("HANDLER"), out.stdout
    assert "leaked" not in out.stderr, out.stderr
    if rc:
        assert "no/such/voyage.py" in out.stderr


def test_a_reader_that_goes_away_ends_the_plan_quietly(tmp_path):
    """`marin-run V --dry-run | head`: the plan is written without rich to a pipe, so the broken
    pipe is ours to handle: exit 1 and nothing on stderr, as when rich wrote it."""
    proc = subprocess.Popen([sys.executable, "-m", "executor.cli", HELLO, "--dry-run", "--prefix", str(tmp_path / "p")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait() == 1 and err == "", err
