"""Suite-wide settings. Triton must run in interpreter mode on CPU-only machines, and the flag
has to be set before any kernel is defined, so it is set here, before test modules import."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
if "MARIN_CACHE" not in os.environ:  # the fingerprint cache: the suite's own, not the user's ~/.cache
    import atexit
    import shutil as _shutil
    import tempfile as _tempfile

    os.environ["MARIN_CACHE"] = _tempfile.mkdtemp(prefix="marin-cache-")
    atexit.register(_shutil.rmtree, os.environ["MARIN_CACHE"], True)

import shutil
import socket
import subprocess
import sys
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_local(gcs_emulator):
    """One embedded local Ray for the whole session (as marin-run starts by default).

    Started after the GCS emulator: a Ray worker's environment is fixed when Ray starts, so a Ray
    started first would never see STORAGE_EMULATOR_HOST and its tasks would go to the real GCS."""
    import ray

    for attempt in range(2):
        if ray.is_initialized():
            break
        try:
            # "local": our own Ray, never a cluster another `ray start` on this machine left its address for
            ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",
                     configure_logging=False)
        except Exception as e:  # noqa: BLE001
            # Ray gives its raylet a fixed 30 s to register: on a machine loaded far past its cores
            # (several suites at once) it may not, and every test of this worker would error. Once more.
            ray.shutdown()
            if attempt or "timed out during startup" not in str(e):
                raise
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def gcs_emulator():
    """A real GCS emulator (gcp-storage-emulator) on a free port, with bucket `marin-test`.

    Sets STORAGE_EMULATOR_HOST and FSSPEC_GS_TOKEN=anon so that gcsfs, in this process and in
    Ray workers and subprocesses started after it, talks to the emulator.
    """
    exe = shutil.which("gcp-storage-emulator") or os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    # The emulator binds the port itself, after free_port() let it go: another process may take it
    # in between. Then the emulator exits, and a port that answers is someone else's: a new port.
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen([exe, "start", f"--port={port}", "--in-memory"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.2)  # an emulator that lost the port exits right after its bind fails
        if proc.poll() is None:
            if time.time() < deadline:
                break
            proc.kill()
            pytest.fail("the GCS emulator did not start in 30 s")
    else:
        pytest.fail("the GCS emulator exited on five ports in a row")
    endpoint = f"http://127.0.0.1:{port}"
    old = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "FSSPEC_GS_TOKEN")}
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    os.environ["FSSPEC_GS_TOKEN"] = "anon"
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()
    fs = gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon")
    fs.mkdir("marin-test")
    yield endpoint
    proc.terminate()
    proc.wait(timeout=10)
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# The session's laptop run: the README's laptop voyage with fewer optimizer steps (the same DAG,
# batch, sequence length and 80/20 split; `--laptop_steps`). 400 steps take most of a minute of
# CPU, twice (the end-to-end test reruns pretrain on a copied prefix); 200 still learn well below
# the unigram baseline, the promise the end-to-end test checks. 0 runs the README's 400 steps.
LAPTOP_TEST_STEPS = 200


def _run_shared_dir(tmp_path_factory):
    """A folder every xdist worker of this run shares (the parent of the workers' base temps, one
    per run: pytest-N), or this process's own base temp when the suite runs in one process."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def laptop_voyage(request, tmp_path_factory):
    """The laptop voyage (`marin-run voyages/535b.py --laptop --laptop_steps 200`) run once per
    session on a fresh prefix, shared by the tests that read its outputs (the end-to-end test,
    which-saw, the model card, the export's Hub checks, the live page). Under xdist the workers
    share it too: the first worker to need it runs it under a file lock, the others wait for the
    lock and read the finished prefix (its run summary is pickled beside it). Tests only read
    it: a test that writes (a rerun) or moves a prefix copies it first (`laptop_copy`), since other
    workers may be reading it at the same time. Returns a namespace: module, config, prefix, plan
    (made after the run: every status read), summary, voyage_path, root, ran_at (the folder it ran
    in, which no longer exists), args (the CLI flags of its config,
    for `marin-run` on its prefix), pretrain_steps and steps (optimizer steps of pretrain, and of
    pretrain and midtrain together), batch_size (sequences a step).

    Step counts, token budgets and sequence indices are read from here, never written as
    numbers: the recipe is the test's, not the README's."""
    import importlib.util
    import pickle
    import types

    from filelock import FileLock
    from ray import cloudpickle

    from executor.api import plan_steps, run_steps

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "voyages", "535b.py")
    spec = importlib.util.spec_from_file_location("voyage_535b_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    config = module.VoyageConfig(laptop=True, laptop_steps=LAPTOP_TEST_STEPS)
    scale = module.scale_of(config)
    per_step = scale.batch_size * scale.seq_len
    shared = _run_shared_dir(tmp_path_factory) / "laptop-voyage"
    shared.mkdir(exist_ok=True)
    # It runs in one folder and is then moved to another, the one tests read: every test reads a
    # relocated prefix, so a read of the folder a step ran in (an absolute path kept in a record)
    # fails in every test, not only in the ones that copy the prefix.
    prefix, ran_at, done = str(shared / "out"), str(shared / "ran-here" / "out"), shared / "summary.pkl"
    cwd = os.getcwd()
    with FileLock(str(shared / ".lock")):
        os.chdir(root)  # the bundled corpus is named by repository-relative paths
        try:
            if done.exists():  # another worker ran it
                summary = pickle.loads(done.read_bytes())
            else:
                request.getfixturevalue("ray_local")
                _, summary = run_steps(module.voyage(config), ran_at, voyage="535b")
                os.rename(ran_at, prefix)
                os.rmdir(os.path.dirname(ran_at))
                done.with_suffix(".tmp").write_bytes(pickle.dumps(summary))
                done.with_suffix(".tmp").rename(done)
            plan = plan_steps(module.voyage(config), prefix)
        finally:
            os.chdir(cwd)
    return types.SimpleNamespace(module=module, config=config, prefix=prefix, plan=plan, summary=summary,
                                 voyage_path=path, root=root, ran_at=ran_at,
                                 args=["--laptop", "--laptop_steps", str(LAPTOP_TEST_STEPS)],
                                 pretrain_steps=round(scale.pretrain_tokens / per_step),
                                 steps=round((scale.pretrain_tokens + scale.midtrain_tokens) / per_step),
                                 batch_size=scale.batch_size)


@pytest.fixture
def laptop_copy(laptop_voyage, tmp_path) -> str:
    """A copy of the laptop run's prefix that the test may change, move or rerun steps on (the
    session's prefix is read by other tests, on other workers, meanwhile)."""
    copy = str(tmp_path / "laptop-copy" / "out")
    shutil.copytree(laptop_voyage.prefix, copy, symlinks=True)
    return copy


# -- running the suite on several workers (pytest-xdist) -------------------------------------------
# The README's command runs the suite on 3 workers with `--dist loadgroup`: most of the suite's time
# is waiting (Rays, clusters, Ray Train workers and subprocesses starting, leases expiring), which
# overlaps well even on 2 cores. Module fixtures start once per worker that needs them, so every
# test is grouped with its module (one worker runs a module's fixtures once). The longest groups go
# first: a worker that started a 2-minute group last would finish alone. The modules that only read
# the session's laptop run go last: by then the worker that runs it (test_535b.py's group, first)
# has finished it, and they read its prefix instead of waiting for the lock.
LONG_FIRST = (  # the slowest groups of the main tier, slowest first (measured: pytest --durations)
    "tests/voyages/test_535b.py",
    "tests/steps/data/test_data_gcs.py",
    "tests/steps/data/test_pipeline_ray.py",
    "tests/executor/test_ray_join.py",
    "tests/executor/test_concurrent.py",
    "tests/steps/train/test_train_loop.py",
    "tests/steps/moe/test_moe_bench.py",
    "tests/steps/train/test_train_watchdog.py",
    "tests/executor/views/test_browser.py",
    "tests/steps/train/test_train_guard.py",
    "tests/steps/ladder/test_law.py",
    "tests/executor/test_unreachable.py",
    "tests/executor/test_crash.py",
    "tests/executor/storage/test_gcs.py",
    "tests/executor/test_nodes.py",
)
LAST = (  # readers of the laptop run
    "tests/steps/provenance/test_which_saw.py",
    "tests/steps/provenance/test_card.py",
    "tests/steps/export/test_hub_ready.py",
    "tests/executor/views/test_browser_training.py",
)


def _group(item) -> str:
    return item.nodeid.split("::", 1)[0]


def _grouped(item, group: str) -> None:
    """Give the item the node id `ID@group` that xdist's loadgroup scheduler reads. xdist 3.8 does
    this itself for `xdist_group` marks by setting `item._nodeid`, which pytest 9.2 no longer reads
    (a node's id is the structured `item._id`), so the groups were silently ignored and the
    laptop run and the gloo meshes ran once per worker. Here the id's string form carries the
    group (its cached string; the structure stays pytest's own)."""
    grouped = f"{item.nodeid}@{group}"
    ident = getattr(item, "_id", None)
    if ident is not None and hasattr(ident, "_str_cache"):
        ident = dataclasses.replace(ident)
        object.__setattr__(ident, "_str_cache", grouped)
        item._id = ident
    else:  # pytest before 9.2
        item._nodeid = grouped


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("main", "slow", "all"), default="main",
                     help="main (default: the README's command), slow (the tests marked slow_tier: fault injection "
                          "on real processes, which .ci/run runs after the main tier) or all")


def pytest_configure(config):
    # xdist's loadscope/loadgroup scheduler sorts the groups by their number of tests (most first)
    # unless told not to, which undid LONG_FIRST: the 8-test mesh group started after dozens of
    # parametrized unit-test modules. Our order stands (the same as `--no-loadscope-reorder`).
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


def _select_tier(config, items):
    """Keep the tests of the tier asked for (`--tier`); the others are deselected, and said so."""
    tier = config.getoption("--tier")
    if tier == "all":
        return
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("slow_tier") is not None) == (tier == "slow") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    _select_tier(config, items)
    # The laptop run (about a minute alone) is set up inside whichever of its users comes first,
    # under that test's timeout; other workers wait for its lock meanwhile. 300 s was hit once on a
    # machine loaded far past its cores: its users get twice the default.
    for item in items:
        if "laptop_voyage" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
    # on a worker (where the ids are collected) xdist sets `loadgroup`; elsewhere there is nothing to do
    if not getattr(config.option, "loadgroup", False):
        return
    rank = {g: i for i, g in enumerate(LONG_FIRST)}
    rank.update({g: 1000 + i for i, g in enumerate(LAST)})
    # stable: the rest keep their order; in a group, the laptop run's users first (it starts at once)
    items.sort(key=lambda item: (rank.get(_group(item), len(LONG_FIRST)),
                                 "laptop_voyage" not in getattr(item, "fixturenames", ())))
    for item in items:
        nodeid = item.nodeid
        if nodeid.rfind("@") <= nodeid.rfind("]"):  # not grouped yet
            _grouped(item, _group(item))


def pytest_runtest_logreport(report):
    """`MARIN_SUITE_TIMELINE=FILE`: one JSON line per test phase (worker, test, phase, start, stop),
    written where the reports arrive (xdist's controller), to see which worker waited on what
    (bench/suite_timeline.py reads it)."""
    path = os.environ.get("MARIN_SUITE_TIMELINE")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import json

    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    with open(path, "a") as f:
        f.write(json.dumps({"worker": worker, "test": report.nodeid, "when": report.when,
                            "start": report.start, "stop": report.stop, "outcome": report.outcome}) + "\n")
