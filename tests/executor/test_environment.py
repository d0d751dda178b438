"""The environment in the record (executor.environment): the git commit and dirty flag of the code
and the key package versions; recorded, not keyed; cheap (once per process, never a subprocess per
step); and code that is not a git checkout (an installed wheel) says so without failing."""

import json
import os
import subprocess
import sys

import pytest

from kits.vizkit import replan, run_inline, small_voyage  # noqa: E402

from executor import environment  # noqa: E402
from executor.storage.store import Status, Store  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIT = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0,
                         reason="no git program")


@GIT
def test_a_checkout_records_its_commit_and_dirty_flag(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q", "-b", "main"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    head = subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert environment.git_state(str(repo)) == {"commit": head, "dirty": False, "describe": head[:12]}
    (repo / "a.py").write_text("x = 2\n")
    assert environment.git_state(str(repo))["dirty"] is True
    # a worktree: `.git` is a file naming the git dir; the branch's ref lives in the common dir
    subprocess.run(git[:3] + ["worktree", "add", "-q", str(tmp_path / "wt"), "-b", "other"], check=True)
    assert environment.git_state(str(tmp_path / "wt"))["commit"] == head
    # refs packed away (git gc): read from packed-refs
    subprocess.run(git[:3] + ["pack-refs", "--all"], check=True)
    assert environment.git_state(str(repo))["commit"] == head


def test_code_that_is_not_a_checkout_says_so_and_never_fails(tmp_path, monkeypatch):
    """An installed wheel: site-packages has no .git, and one further up (a venv inside some
    repository) is not this code's."""
    site = tmp_path / "repo" / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    state = environment.git_state(str(site))
    assert state["commit"] is None and state["dirty"] is None and "not a git checkout" in state["describe"]
    # a checkout where no git program is installed: the commit from the files, the flag unknown
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    state = environment.git_state(ROOT)
    assert len(state["commit"]) == 40 and state["dirty"] is None and "no git program" in state["describe"]
    # a .git that cannot be read
    broken = tmp_path / "broken"
    (broken / ".git").mkdir(parents=True)
    assert environment.git_state(str(broken))["commit"] is None


def test_versions_of_the_key_packages():
    packages = environment.package_versions()
    assert packages["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {"marin-voyage", "torch", "ray", "tokenizers"} <= set(packages)


def test_once_per_process_not_per_step(tmp_path, monkeypatch):
    """Planning cached steps made under other package versions reads the current environment
    once (the cache) and one record to say what changed: no subprocess per step."""
    prefix = str(tmp_path / "p")
    steps = small_voyage()
    plan, summary = run_inline(steps, prefix)
    assert summary.exit_code == 0
    store = Store(prefix)
    for d in plan.decisions:  # as if made with torch 2.12.0
        status = store.read_status(d.node.dirname)
        record = store.read_record(d.node.dirname)
        record.environment["packages"]["torch"] = "2.12.0"
        store.write_record(status.data_dir(d.node.dirname), record)  # in the attempt it commits
        store.write_status(d.node.dirname, status.model_copy(update={"env": environment.packages_digest(
            record.environment)}))
    calls = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    reads = []
    read_record = Store.read_record
    monkeypatch.setattr(Store, "read_record", lambda self, d: reads.append(d) or read_record(self, d))
    again = replan(steps, prefix)
    assert calls == []  # this process had computed it already (the run's workers ran here)
    assert len(reads) == 1
    now = environment.current()["packages"]["torch"]
    for d in again.decisions:
        assert d.state == "CACHED" and d.env_drift == f"torch 2.12.0 -> {now}"
        assert f"made with torch 2.12.0 -> {now} (recorded, not keyed" in d.reason
        assert d.node.dirname in {x.node.dirname for x in plan.decisions}  # same paths: not keyed


def test_status_and_record_written_before_these_fields_still_load(tmp_path):
    old = {"state": "SUCCESS", "digest": "ab" * 32, "output_digest": "cd" * 32, "inputs": {}, "time": 1.0}
    status = Status.model_validate_json(json.dumps(old))
    assert status.env == "" and status.commit == ""
    assert environment.differences({}, environment.current())[0].startswith("marin-voyage absent -> ")


def test_versions_are_importlib_metadatas_without_importing_it(tmp_path, monkeypatch):
    """The versions are read from the dist-info folders on sys.path (a plan needs them and
    importlib.metadata's import was a tenth of a dry-run's): the same answer as importlib.metadata
    for every installed distribution that reading answers, and for one installed twice, the first."""
    from importlib import metadata

    answered = 0
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        got = environment.dist_info_version(name)
        if got is not None:
            answered += 1
            assert got == metadata.version(name), name
    assert answered > 50 and environment.dist_info_version("no-such-package-zz") == environment.NOT_INSTALLED

    for folder, version in (("first", "2.0"), ("second", "1.0")):
        info = tmp_path / folder / "Fake_Pkg-{}.dist-info".format(version)
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-pkg\nVersion: {version}\n\nVersion: 9\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path / "first"), str(tmp_path / "second")])
    environment._dist_infos.cache_clear()
    try:
        assert environment.dist_info_version("fake.pkg") == metadata.version("fake.pkg") == "2.0"
        # an editable checkout's `.egg-info` folder (PKG-INFO, no METADATA) found first, as in a
        # checkout that is the working folder: importlib.metadata reads it, and so do we
        egg = tmp_path / "checkout" / "fake_pkg.egg-info"
        egg.mkdir(parents=True)
        (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: fake-pkg\nVersion: 3.0.dev0\n")
        sys.path.insert(0, str(tmp_path / "checkout"))
        assert environment.dist_info_version("fake-pkg") == metadata.version("fake-pkg") == "3.0.dev0"
        (tmp_path / "zipped.zip").write_bytes(b"PK")
        sys.path.insert(0, str(tmp_path / "zipped.zip"))
        assert environment.dist_info_version("fake.pkg") is None  # a zip on the path: importlib.metadata decides
    finally:
        environment._dist_infos.cache_clear()


def test_the_versions_are_read_without_importing_importlib_metadata():
    code = ("import sys; from executor import environment; v = environment.package_versions(); "
            "print(sorted(v), 'importlib.metadata' in sys.modules)")
    # from the checkout's root, as the README runs marin-run: setup.sh's editable install left
    # marin_voyage.egg-info there, first on sys.path
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert "'python'" in out.stdout and out.stdout.strip().endswith("False"), out.stdout + out.stderr
