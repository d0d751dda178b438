"""Served bytes are always the bytes of the code and inputs on record: each finding of the third
round of attacks, reproduced, then held. Fast: no Ray unless a test says so."""

import dataclasses
import functools
import importlib
import json
import os
import pathlib
import sys
import textwrap

import pytest

from executor import Step, step_type
from executor.dag import build_dag
from executor.errors import VoyageError
from executor.fingerprint import drift


@pytest.fixture
def module(tmp_path, monkeypatch):
    """`module(name, source)`: write `name.py` into a folder on sys.path and import it afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def make(name, source):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module(name)

    return make


def _node(steps, name):
    dag = build_dag(steps)
    return dag, dag[name]


# -- critical 1: a config value whose class lives outside the step's import closure -------------

C1_STEP = """
from dataclasses import dataclass, field
from executor import step_type

@dataclass(frozen=True)
class C1Cfg:
    extra: object = None
    more: dict = field(default_factory=dict)

@step_type(version="1")
def c1_scaled(config: C1Cfg, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(str(config.extra.apply(2)) + config.more["kind"].word())
"""

C1_HELPER = """
import enum
from dataclasses import dataclass

@dataclass(frozen=True)
class Scale:
    n: int = 1

    def apply(self, x):
        return x * self.n

class Kind(enum.Enum):
    A = "a"

    def word(self):
        return "alpha"
"""


def _c1(module, helper):
    step_mod = module("c1_step", C1_STEP)
    h = module("c1_helper", helper)  # only the voyage imports it: the step's module never names it
    step = Step("s", step_mod.c1_scaled, step_mod.C1Cfg(extra=h.Scale(), more={"kind": h.Kind.A}))
    dag, node = _node([step], "s")
    return node.digest, dag.fingerprint(node)


def test_c1_a_dataclass_in_an_untyped_field_brings_its_defaults_and_module_into_the_fingerprint(module):
    digest1, fp1 = _c1(module, C1_HELPER)
    digest2, fp2 = _c1(module, C1_HELPER.replace("n: int = 1", "n: int = 1000"))
    assert digest1 == digest2  # a field equal to its default is left out of the digest...
    assert fp1.digest != fp2.digest  # ...so the fingerprint must see the default by value
    assert "default of c1_helper.Scale.n: 1 -> 1000" in drift(fp1.parts, fp2.parts)
    digest3, fp3 = _c1(module, C1_HELPER.replace("x * self.n", "x + self.n"))
    assert digest3 == digest1 and fp3.digest != fp1.digest  # a method the step calls
    _, fp4 = _c1(module, C1_HELPER.replace('return "alpha"', 'return "beta"'))
    assert fp4.digest != fp1.digest  # an enum's method, reached through a dict value


# -- critical 6: values with one digest but different meanings -----------------------------------

@dataclasses.dataclass(frozen=True)
class C6Cfg:
    weights: dict[str, float]
    pair: tuple[int, ...] = ()
    items: list[int] = dataclasses.field(default_factory=list)
    path: str = ""
    loose: object = None
    nested: dict = dataclasses.field(default_factory=dict)


@step_type(version="1")
def c6_write(config: C6Cfg, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(json.dumps(config.weights) + repr(config))


def _received(config):
    """The config as the step receives it (what the runner ships: executor.runner), and its digest."""
    from executor.identity import normalized

    dag, node = _node([Step("c6", c6_write, config)], "c6")
    return node.digest, normalized(config)


@pytest.mark.parametrize("a, b", [
    (C6Cfg({"web": .7, "code": .3}), C6Cfg({"code": .3, "web": .7})),
    (C6Cfg({}, pair=[1, 2]), C6Cfg({}, pair=(1, 2))),
    (C6Cfg({}, items=(1, 2)), C6Cfg({}, items=[1, 2])),
    (C6Cfg({}, path=pathlib.PurePosixPath("data/x")), C6Cfg({}, path="data/x")),
    (C6Cfg({}, loose=(1, (2, 3))), C6Cfg({}, loose=[1, [2, 3]])),
    (C6Cfg({}, loose={"b": pathlib.PurePosixPath("p"), "a": 1}), C6Cfg({}, loose={"a": 1, "b": "p"})),
    (C6Cfg({}, nested={"x": {"z": 1, "y": 2}}), C6Cfg({}, nested={"x": {"y": 2, "z": 1}})),
])
def test_c6_values_with_one_digest_reach_the_step_as_one_value(a, b):
    digest_a, got_a = _received(a)
    digest_b, got_b = _received(b)
    assert digest_a == digest_b  # one recipe...
    assert repr(got_a) == repr(got_b)  # ...so one value, whichever spelling the voyage used
    assert json.dumps(got_a.weights) == json.dumps(got_b.weights)
    assert type(got_a.pair) is tuple and type(got_a.items) is list  # the declared sequence types


# -- critical 2: a step type made with functools.partial, or from a callable object -------------

def _c2_body(config, ctx, mode="upper"):
    return mode


class _C2Callable:
    mode = "lower"

    def __call__(self, config, ctx):
        return self.mode

    def method(self, config, ctx):
        return self.mode


@pytest.mark.parametrize("fn, what", [
    (functools.partial(_c2_body, mode="lower"), "functools.partial"),
    (_C2Callable(), "_C2Callable"),
    (_C2Callable().method, "method"),
    (print, "builtin"),
])
def test_c2_a_step_type_with_bound_values_outside_its_config_is_refused(fn, what):
    # bound arguments are neither in the digest nor in the fingerprint: the values would change
    # the bytes under one recipe. A step type is a plain function; its values come from its config.
    with pytest.raises(VoyageError, match="a plain function") as e:
        step_type(version="1", name="c2_make")(fn)
    assert what in str(e.value)


# -- critical 5: a Ray retry of a resumable step, the first try still alive --------------------

GATES: dict = {}


@dataclasses.dataclass(frozen=True)
class C5Parts:
    n: int
    gate: str = ""


@step_type(version="1", name="c5_resumable_parts", resumable=True)
def c5_parts(config: C5Parts, ctx) -> None:
    for i in range(config.n):
        with ctx.open(f"part-{i}.txt", "w") as f:  # a resumable step's write: fenced
            f.write(f"part {i} by attempt {ctx.attempt}\n")
        if config.gate and i == 0 and config.gate in GATES:
            GATES.pop(config.gate).wait(30)


@pytest.fixture(params=["local", "memory"])
def prefix(request, tmp_path):
    return str(tmp_path / "p") if request.param == "local" else f"memory://served-{os.getpid()}-{id(tmp_path)}"


def test_c5_a_ray_retry_of_a_resumable_step_fences_out_the_first_try_still_alive(prefix):
    """Ray reruns a task after a presumed node loss with the same spec, so the same lease token:
    the retry resumes the same folder. The first try, alive after all, must stop before its next
    write there, as it cannot commit: the fence checks the attempt the status names, not only the
    token."""
    import threading

    from executor.storage.lease import Leases, Owner
    from executor.plan import make_plan
    from executor.runner import Runner
    from executor.storage.store import Store
    from executor.worker import execute

    GATES["c5"] = gate = threading.Event()
    store = Store(prefix)
    leases = Leases(store, ttl=30, owner=Owner("driver", 1, "run-c5"))
    plan = make_plan(build_dag([Step("s", c5_parts, C5Parts(3, gate="c5"))]), store, leases=leases)
    dirname = plan["s"].node.dirname
    lease, _ = leases.try_acquire(dirname)
    task = Runner(plan, None, leases)._task(plan["s"], lease.token)
    results = []
    first = threading.Thread(target=lambda: results.append(execute(task)))
    first.start()
    import time

    deadline = time.time() + 30
    while "c5" in GATES or not store.fs.glob(store.path(dirname, ".attempts/*/part-0.txt")):
        assert time.time() < deadline, "the first try never wrote its first part"
        time.sleep(0.01)
    retry = execute(task)  # the same spec, the same token: resumes the first try's folder
    assert retry.ok and retry.attempt == 2
    gate.set()
    first.join(30)
    assert results[0].lease_lost and not results[0].ok, results[0]
    served = store.served_dir(dirname)
    for i in range(3):
        assert store.fs.cat_file(store.path(served, f"part-{i}.txt")).decode() == f"part {i} by attempt 2\n"
    record = store.read_record(dirname)
    assert record.manifest == store.manifest(served)


# -- critical 3: the fingerprint is of the files on disk, not of the code that runs -------------

C3_STEP = """
from dataclasses import dataclass
from executor import step_type

WORD = "A"

@dataclass(frozen=True)
class C3Cfg:
    n: int = 1

def word():
    return "A"

@step_type(version="1")
def c3_write(config: C3Cfg, ctx):
    with ctx.open("out.txt", "w") as f:
        f.write(word() * config.n)
"""


def _c3_run(tmp_path, mod, edit_before_plan):
    """Plan a step of `mod`, edit its file (before or after planning), run the attempt here."""
    from executor.plan import make_plan
    from executor.runner import Runner
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store
    from executor.worker import execute

    path = pathlib.Path(mod.__file__)
    edited = path.read_text().replace('return "A"', 'return "B"')
    if edit_before_plan:
        path.write_text(edited)
    store = Store(str(tmp_path / "p"))
    leases = Leases(store, ttl=30, owner=Owner("driver", 1, "run-c3"))
    plan = make_plan(build_dag([Step("s", mod.c3_write, mod.C3Cfg(2))]), store, leases=leases)
    lease, _ = leases.try_acquire(plan["s"].node.dirname)
    task = Runner(plan, None, leases)._task(plan["s"], lease.token)  # the driver fingerprints its files
    if not edit_before_plan:
        path.write_text(edited)
    result = execute(task)
    return store, plan["s"].node.dirname, result


def test_c3_a_process_that_imported_a_module_before_its_edit_fails_the_attempt(module, tmp_path):
    # (b) a long-lived process: the plan fingerprints the edited file, the process runs the old code
    mod = module("c3_long_lived", C3_STEP.replace("c3_write", "c3_write_b"))
    mod.c3_write = mod.c3_write_b
    store, dirname, result = _c3_run(tmp_path, mod, edit_before_plan=True)
    assert not result.ok and "CodeMismatch" in result.error and "module c3_long_lived" in result.error, result
    assert "imported is not its file" in result.error and "\n" not in result.error
    assert store.read_status(dirname).state == "FAILED" and store.read_status(dirname).served() is None


def test_c3_a_worker_whose_checkout_differs_from_the_plans_fails_the_attempt(module, tmp_path):
    # (c) the plan's fingerprint is the driver's files; this worker's file is another
    mod = module("c3_behind", C3_STEP.replace("c3_write", "c3_write_c"))
    mod.c3_write = mod.c3_write_c
    store, dirname, result = _c3_run(tmp_path, mod, edit_before_plan=False)
    assert not result.ok and "module c3_behind" in result.error and "checkout" in result.error, result


def test_c3_stale_bytecode_is_found(tmp_path, monkeypatch):
    # (a) an edit of the same size within the same mtime second: Python imports the old .pyc
    from executor import loaded_code
    from executor.fingerprint import code_fingerprint

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = tmp_path / "c3_stale.py"
    path.write_text(textwrap.dedent(C3_STEP.replace("c3_write", "c3_write_a")))
    stat = os.stat(path)
    importlib.invalidate_caches()
    first = importlib.import_module("c3_stale")
    assert first.word() == "A"
    path.write_text(textwrap.dedent(C3_STEP.replace("c3_write", "c3_write_a")).replace('return "A"', 'return "B"'))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and mtime: the .pyc looks fresh
    del sys.modules["c3_stale"]
    again = importlib.import_module("c3_stale")
    assert again.word() == "A"  # the stale bytecode ran, while the file says "B"
    fp = code_fingerprint(again.c3_write_a, again.C3Cfg)  # the plan hashes the file: "B"
    why = loaded_code.mismatch(fp.parts)
    assert why and why.startswith("module c3_stale:") and "word differs" in why, why
    sys.modules.pop("c3_stale", None)


def test_c3_code_as_on_record_passes(module):
    from executor import loaded_code
    from executor.fingerprint import code_fingerprint

    mod = module("c3_fine", C3_STEP.replace("c3_write", "c3_write_ok"))
    assert loaded_code.mismatch(code_fingerprint(mod.c3_write_ok, mod.C3Cfg).parts) is None


# -- critical 4: outputs reached through names inside other outputs -----------------------------

C4 = {"bytes": "old", "pause": None, "paused": None, "kill": False}


@dataclasses.dataclass(frozen=True)
class C4W:
    n: int = 2


@step_type(version="1", name="c4_w")
def c4_w(config: C4W, ctx) -> None:
    for part in ("a", "b"):
        with ctx.open(f"{part}.txt", "w") as f:
            f.write(f"{C4['bytes']}-{part}")


@dataclasses.dataclass(frozen=True)
class C4Index:
    w: str


@step_type(version="1", name="c4_index")
def c4_index(config: C4Index, ctx) -> None:
    from steps.data.paths import ref

    with ctx.open("names.txt", "w") as f:
        f.write(ref(ctx, config.w))  # a name relative to the index: resolved through w's .status


def _c4_read_through(config, ctx):
    from steps.data.paths import resolve

    with ctx.open_input(config.index, "names.txt", "r") as f:
        w = resolve(f.read(), config.index)
    parts = []
    for part in ("a", "b"):
        with ctx.open_input(w, f"{part}.txt", "r") as f:
            parts.append(f.read())
        if part == "a" and C4["pause"] is not None:
            C4["paused"].set()
            C4["pause"].wait(30)
        if part == "a" and C4["kill"]:
            raise SystemExit("preempted")  # killed after its checkpoint: the status stays RUNNING
    return parts


@dataclasses.dataclass(frozen=True)
class C4Consumer:
    index: str


@step_type(version="1", name="c4_consumer")
def c4_consumer(config: C4Consumer, ctx) -> None:
    parts = _c4_read_through(config, ctx)
    with ctx.open("joined.txt", "w") as f:
        f.write("+".join(parts))


@step_type(version="1", name="c4_resumable", resumable=True)
def c4_resumable(config: C4Consumer, ctx) -> None:
    done = ctx.exists("ckpt-a.txt")
    if not done:
        with ctx.open("ckpt-a.txt", "w") as f:
            f.write("checkpoint")
    parts = _c4_read_through(config, ctx) if not done else ["(resumed)"]
    with ctx.open("joined.txt", "w") as f:
        f.write("+".join(parts))


def _c4_plan(prefix, consumer_type):
    from executor import output_of
    from executor.plan import make_plan
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store

    w = Step("w", c4_w, C4W())
    idx = Step("idx", c4_index, C4Index(output_of(w)))
    consumer = Step("c", consumer_type, C4Consumer(output_of(idx)))
    store = Store(prefix)
    leases = Leases(store, ttl=30, owner=Owner("driver", 1, f"run-c4-{os.getpid()}"))
    return store, leases, make_plan(build_dag([consumer]), store, leases=leases)


def _c4_execute(store, leases, plan, name):
    from executor.runner import Runner
    from executor.worker import execute

    dirname = plan[name].node.dirname
    lease, _ = leases.try_acquire(dirname)
    try:
        return execute(Runner(plan, None, leases)._task(plan[name], lease.token))
    finally:
        leases.release(dirname, leases.holder(dirname))


def test_c4_an_output_read_through_an_index_and_rerun_meanwhile_fails_the_consumer(tmp_path):
    import threading

    C4.update(bytes="old", pause=threading.Event(), paused=threading.Event(), kill=False)
    store, leases, plan = _c4_plan(str(tmp_path / "p"), c4_consumer)
    for name in ("w", "idx"):
        assert _c4_execute(store, leases, plan, name).ok
    C4["pause"], pause = None, C4["pause"]
    results = []
    C4["pause"] = pause
    reader = threading.Thread(target=lambda: results.append(_c4_execute(store, leases, plan, "c")))
    reader.start()
    assert C4["paused"].wait(30)
    C4["pause"] = None  # the rerun below must not pause
    C4["bytes"] = "new"
    assert _c4_execute(store, leases, plan, "w").ok  # another executor's --rerun w: new bytes
    pause.set()
    reader.join(30)
    result = results[0]
    assert not result.ok and "w-" in result.error and "changed while c read it" in result.error, result
    assert store.read_status(plan["c"].node.dirname).served() is None  # never SUCCESS on old-a+new-b


def test_c4_a_resumable_step_never_resumes_across_a_change_of_an_output_it_read_through_names(tmp_path):
    C4.update(bytes="old", pause=None, paused=None, kill=True)
    store, leases, plan = _c4_plan(str(tmp_path / "p"), c4_resumable)
    for name in ("w", "idx"):
        assert _c4_execute(store, leases, plan, name).ok
    with pytest.raises(SystemExit):
        _c4_execute(store, leases, plan, "c")  # preempted after its checkpoint
    first_dir = store.read_status(plan["c"].node.dirname).dir
    C4.update(bytes="new", kill=False)
    assert _c4_execute(store, leases, plan, "w").ok  # w rerun without --downstream
    result = _c4_execute(store, leases, plan, "c")
    assert result.ok, result
    status = store.read_status(plan["c"].node.dirname)
    assert status.dir != first_dir  # a fresh folder: no resume across the change
    assert store.fs.cat_file(store.path(plan["c"].node.dirname, status.dir, "joined.txt")).decode() == "new-a+new-b"


# -- majors 3 and 4, and the CLI's minors: one line, exit 2, nothing written ---------------------

CLI_VOYAGE = """
from dataclasses import dataclass
from executor import Step, step_type

@dataclass(frozen=True)
class Cfg:
    n: int = 2

@dataclass(frozen=True)
class C:
    n: int = 0

@step_type(version="1")
def served_cli_t(config: C, ctx):
    pass

def voyage(config: Cfg):
    return [Step("s", served_cli_t, C(n=config.n))]
"""


@pytest.mark.parametrize("args, env, words", [
    (["--lease-ttl", "0.001"], {}, "--lease-ttl"),  # major 3: the floor
    (["--lease-ttl", "1e300"], {}, "--lease-ttl"),  # major 3: the ceiling (threading.TIMEOUT_MAX)
    ([], {"MARIN_LEASE_TTL": "0.01"}, "MARIN_LEASE_TTL"),
    (["--prefix", "gs://"], {}, "--prefix"),  # major 4: an unset $BUCKET
    (["--prefix", "gs:///x"], {}, "--prefix"),
    (["--prefix", "ftp://"], {}, "--prefix"),
    (["--prefix", "nosuchproto://b/x"], {}, "nosuchproto"),
    (["--n", "1" + "0" * 5000], {}, "config"),  # a config value of 10**5000
    (["--config_path", "/nonexistent/c.yaml"], {}, "/nonexistent/c.yaml"),
])
def test_bad_settings_prefixes_and_values_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch,
                                                                                args, env, words):
    from executor.cli import main

    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = tmp_path / "v.py"
    path.write_text(textwrap.dedent(CLI_VOYAGE))
    code = main([str(path), "--dry-run", *args])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("marin-run: error: "), err
    assert words in lines[0], lines[0]
    assert sorted(os.listdir(tmp_path)) == ["v.py"]


def test_s3_without_s3fs_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from executor.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # not installed, whatever this machine has
    path = tmp_path / "v.py"
    path.write_text(textwrap.dedent(CLI_VOYAGE))
    code = main([str(path), "--dry-run", "--prefix", "s3://bucket/x"])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "s3fs" in lines[0], err


def test_a_config_value_of_ten_to_the_5000_in_a_voyage_is_an_identity_error_naming_the_field():
    from executor.errors import IdentityError

    with pytest.raises(IdentityError, match=r"config.weights\['n'\]: an integer of about 5001 digits"):
        build_dag([Step("big", c3_like_t, C6Cfg({"n": 10**5000}))])
    with pytest.raises(IdentityError, match=r"config.n: an integer"):
        build_dag([Step("big2", c3_like_t, _BigCfg(10**5000))])


@dataclasses.dataclass(frozen=True)
class _BigCfg:
    n: int = 0


@step_type(version="1", name="served_big_t")
def c3_like_t(config, ctx):
    pass


# -- major 2: a stalled first write must not land over another executor's commit ----------------

def test_major2_a_stalled_first_write_never_overwrites_another_executors_commit(monkeypatch):
    """On an object store the fence is a check, then writes: a writer A that passed its check and
    stalled past the ttl must not land RUNNING over the SUCCESS that B committed meanwhile.
    memory:// (whose conditional write is a lock of the process) stands for GCS's generation match."""
    import contextlib

    from executor import worker
    from executor.plan import make_plan
    from executor.runner import Runner
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store

    store = Store(f"memory://served-major2-{os.getpid()}")
    leases_a = Leases(store, ttl=30, owner=Owner("a", 1, "run-a"))
    leases_b = Leases(store, ttl=30, owner=Owner("b", 2, "run-b"))
    plan = make_plan(build_dag([Step("s", c3_like_t, _BigCfg(7))]), store, leases=leases_a)
    dirname = plan["s"].node.dirname
    lease_a, _ = leases_a.try_acquire(dirname)
    task_a = Runner(plan, None, leases_a)._task(plan["s"], lease_a.token)
    real_fence, stalled = Leases.fence, []

    @contextlib.contextmanager
    def fence(self, d, token):
        with real_fence(self, d, token) as ours:
            if token == lease_a.token and not stalled:  # A passed its check; now it stalls past the ttl
                stalled.append(True)
                leases_a.release(dirname, leases_a.holder(dirname))  # (its lease expired)
                lease_b, _ = leases_b.try_acquire(dirname)
                assert worker.execute(Runner(plan, None, leases_b)._task(plan["s"], lease_b.token)).ok
                assert store.read_status(dirname).state == "SUCCESS"
            yield ours

    monkeypatch.setattr(Leases, "fence", fence)
    result = worker.execute(task_a)
    assert stalled and not result.ok and result.lease_lost, result
    status = store.read_status(dirname)
    assert status.state == "SUCCESS" and status.served() is not None  # B's commit is still served


# -- major 1: the upgrade path: an interrupted resumable output from before attempt folders --------

@step_type(version="1", name="served_m1_train", resumable=True)
def m1_train(config: _BigCfg, ctx) -> None:
    if ctx.exists("ckpt-0100.txt"):
        with ctx.open("ckpt-0100.txt", "r") as f:
            start = f.read()
    else:
        start = "step 0"
    with ctx.open("final.txt", "w") as f:
        f.write(f"trained on from {start}")


def test_major1_an_old_layout_running_resumable_folder_is_adopted_and_resumed(tmp_path):
    """Written before attempts had folders: `.status` RUNNING without `dir`, the record and the
    checkpoints at the folder's root. The next run resumes there (attempt 0 adopted), never from
    step 0 in a new folder that would leave the 90-day run's checkpoints to --gc."""
    from executor.plan import make_plan
    from executor.runner import Runner
    from executor.storage.lease import Leases, Owner
    from executor.storage.records import Attempt, Record
    from executor.storage.store import Status, Store
    from executor.worker import execute

    store = Store(str(tmp_path / "p"))
    leases = Leases(store, ttl=30, owner=Owner("driver", 1, "run-m1"))
    plan = make_plan(build_dag([Step("train", m1_train, _BigCfg(3))]), store, leases=leases)
    d = plan["train"]
    dirname, digest = d.node.dirname, d.node.digest
    store.write_record(dirname, Record(name="train", step_type="served_m1_train", version="1", digest=digest,
                                       scheme="marin-voyage/identity/1", output_path=store.url(dirname),
                                       code_fingerprint=plan.dag.fingerprint(d.node).digest,
                                       attempts=[Attempt(number=1, state="RUNNING", started=1.0, token=1)]))
    with open(os.path.join(store.path(dirname), "ckpt-0100.txt"), "w") as f:
        f.write("step 100")
    store.write_status(dirname, Status(state="RUNNING", digest=digest, attempt=1, token=1))
    plan = make_plan(build_dag([Step("train", m1_train, _BigCfg(3))]), store, leases=leases)
    lease, _ = leases.try_acquire(dirname)
    result = execute(Runner(plan, None, leases)._task(plan["train"], lease.token))
    assert result.ok, result
    status = store.read_status(dirname)
    assert status.state == "SUCCESS" and not status.dir  # served from the root, as old folders are
    assert store.fs.cat_file(store.path(dirname, "final.txt")).decode() == "trained on from step 100"
    assert not store.fs.exists(store.path(dirname, ".attempts"))
    record = store.read_record(dirname)
    assert [a.state for a in record.attempts] == ["INTERRUPTED", "SUCCESS"]


# -- minors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("change", [{"token": "7"}, {"expires": None}, {"token": 7.5}, {"released": "no"},
                                    {"pid": True}, {"acquired": float("nan")}])
def test_minor_a_lease_file_of_the_right_keys_and_wrong_types_is_unreadable(tmp_path, change):
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store

    store = Store(str(tmp_path / "p"))
    leases = Leases(store, ttl=30, owner=Owner("a", 1, "run-a"))
    lease, _ = leases.try_acquire("s-0123456789")
    path = store.path("s-0123456789", ".lease")
    data = json.loads(open(path).read())
    data.update(change)
    open(path, "w").write(json.dumps(data).replace("NaN", "NaN"))
    holder = leases.holder("s-0123456789")
    assert holder.unreadable  # not a traceback, and `"released": "no"` is not "released"
    other = Leases(store, ttl=30, owner=Owner("b", 2, "run-b"))
    assert other.try_acquire("s-0123456789")[0] is None  # held for a ttl from its last write


def test_minor_a_unicode_step_name_is_refused_saying_ascii_and_nan_cpus_are_refused():
    with pytest.raises(VoyageError, match="ASCII"):
        Step("tökenize", c3_like_t, _BigCfg())
    from executor.step import Resources

    for bad in (dict(cpus=float("nan")), dict(gpus=float("nan")), dict(memory_gb=float("inf")),
                dict(cpus=float("inf"))):
        with pytest.raises(VoyageError, match="Resources"):
            Resources(**bad)


@pytest.mark.parametrize("dir_", ["../other-0123456789/.attempts/0001-abcd", ".attempts/../../x", "/abs/path",
                                  ".attempts/0001-gone"])
def test_minor_a_status_whose_dir_leaves_the_folder_or_is_missing_is_corrupt_never_cached(tmp_path, dir_):
    from executor.plan import make_plan
    from executor.storage.store import Status, Store

    store = Store(str(tmp_path / "p"))
    dag = build_dag([Step("s", c3_like_t, _BigCfg(5))])
    dirname = dag["s"].dirname
    os.makedirs(store.path(dirname, ".attempts/0001-real"))
    store.write_status(dirname, Status(state="SUCCESS", digest=dag["s"].digest, output_digest="0" * 64, attempt=1,
                                       token=1, dir=dir_))
    d = make_plan(dag, store)["s"]
    assert d.state != "CACHED" and "corrupt" in d.reason, (d.state, d.reason)


def test_minor_a_steps_files_are_fsynced_before_the_commit_on_a_local_disk(tmp_path, monkeypatch):
    """After a power loss right after a commit, SUCCESS must not name empty files: the attempt's
    files and folders reach the disk before `.status` says SUCCESS."""
    from executor.plan import make_plan
    from executor.runner import Runner
    from executor.storage.lease import Leases, Owner
    from executor.storage.store import Store
    from executor.worker import execute

    events = []
    real_fsync = os.fsync

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    real_swap = Store.swap_status

    def swap(self, dirname, expect, new):
        events.append(("status", new.state))
        return real_swap(self, dirname, expect, new)

    monkeypatch.setattr(Store, "swap_status", swap)
    store = Store(str(tmp_path / "p"))
    leases = Leases(store, ttl=30, owner=Owner("driver", 1, "run-fsync"))
    plan = make_plan(build_dag([Step("s", c5_parts, C5Parts(3))]), store, leases=leases)
    lease, _ = leases.try_acquire(plan["s"].node.dirname)
    assert execute(Runner(plan, None, leases)._task(plan["s"], lease.token)).ok
    commit = events.index(("status", "SUCCESS"))
    synced = {path for kind, path in events[:commit] if kind == "fsync"}
    served = store.path(store.served_dir(plan["s"].node.dirname))
    for i in range(3):
        assert os.path.join(served, f"part-{i}.txt") in synced
    assert served in synced  # the folder: its entries


def test_minor_a_token_shard_cut_short_is_an_error_on_open(tmp_path):
    """A shard whose bytes are fewer than its manifest says (a copy cut short) used to read short
    without error, and whatever counted its tokens counted the short data."""
    import numpy as np

    from steps.data.formats import MANIFEST, TOKENS_FORMAT, TokenDataset, TokenShardWriter

    folder = tmp_path / "tok"
    (folder / "shards").mkdir(parents=True)
    with TokenShardWriter(str(folder / "shards"), "0", np.uint16) as w:
        w.write(np.arange(100, dtype=np.uint16), np.array([60, 40]))
    manifest = {"format": TOKENS_FORMAT, "dtype": "uint16", "tokens": 100, "documents": 2,
                "shards": [{"name": "0", "tokens": 100, "documents": 2}]}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert TokenDataset(str(folder)).num_tokens == 100  # whole: opens
    with open(folder / "shards" / "0.tokens", "r+b") as f:
        f.truncate(150)  # 75 of 100 tokens
    with pytest.raises(ValueError, match=r"shard 0: 0.tokens holds 150 bytes, the manifest says 200"):
        TokenDataset(str(folder))


def test_minor_a_token_shard_of_the_right_size_and_other_bytes_fails_verify(tmp_path):
    import numpy as np

    from executor.storage.store import Store
    from steps.data.formats import MANIFEST, TOKENS_FORMAT, TokenDataset, TokenShardWriter

    folder = tmp_path / "p" / "tok-0123456789"
    (folder / "shards").mkdir(parents=True)
    with TokenShardWriter(str(folder / "shards"), "0", np.uint16) as w:
        w.write(np.arange(100, dtype=np.uint16), np.array([60, 40]))
    (folder / MANIFEST).write_text(json.dumps({"format": TOKENS_FORMAT, "dtype": "uint16", "tokens": 100,
                                               "documents": 2, "shards": [{"name": "0", "tokens": 100,
                                                                           "documents": 2}]}))
    store = Store(str(tmp_path / "p"))
    entries = [e.model_dump() for e in store.manifest("tok-0123456789")]  # as the executor records it
    (folder / ".step.json").write_text(json.dumps({"manifest": entries}))
    TokenDataset(str(folder), verify=True)  # as recorded: reads
    with open(folder / "shards" / "0.tokens", "r+b") as f:
        f.write(b"\xff\xff")  # same size, other bytes
    assert TokenDataset(str(folder)).num_tokens == 100  # sizes alone cannot tell
    with pytest.raises(ValueError, match=r"shard 0: shards/0.tokens does not have the content its record says"):
        TokenDataset(str(folder), verify=True)
