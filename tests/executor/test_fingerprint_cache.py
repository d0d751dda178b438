"""The fingerprint's walk kept on disk (executor.fingerprint_cache): served when nothing it read
or asked changed, and never when anything did, whatever the files' mtimes say."""

import importlib
import os
import sys
import textwrap

import pytest

from executor import fingerprint as fp
from executor.fingerprint import code_fingerprint, drift


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache in a folder of this test's own; `cache.parses` counts the sources parsed."""
    monkeypatch.setenv("MARIN_CACHE", str(tmp_path / "cache"))
    parsed = []
    real = fp._parse

    def counting(name, file):
        parsed.append(name)
        return real(name, file)

    monkeypatch.setattr(fp, "_parse", counting)

    class Cache:
        folder = tmp_path / "cache" / "fingerprint"
        parses = parsed

    return Cache


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def fresh(name):
    top = name.partition(".")[0]
    for mod in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[mod]
    importlib.invalidate_caches()
    return importlib.import_module(name)


STEP = """
    import os
    from dataclasses import dataclass
    from fpc_pkg.helper import scale

    @dataclass(frozen=True)
    class Cfg:
        n: int = 1
        seed: int = int(os.environ.get("FPC_SEED", "0"))  # a default read from outside the source

    def step(config, ctx):
        return scale(config.n)
"""


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    # No bytecode: an edit that keeps a file's size within the second of the last write would
    # otherwise import the stale .pyc (the live default would be the old one).
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    write(tmp_path / "src" / "fpc_pkg" / "__init__.py", "")
    write(tmp_path / "src" / "fpc_pkg" / "helper.py", "def scale(x):\n    return x * 2\n")
    write(tmp_path / "src" / "fpc_pkg" / "step.py", STEP)
    return tmp_path / "src" / "fpc_pkg"


def test_a_hit_parses_nothing_and_equals_the_walk(cache, pkg, monkeypatch):
    mod = fresh("fpc_pkg.step")
    first = code_fingerprint(mod.step, mod.Cfg)
    assert cache.parses and list(cache.folder.glob("*.json"))
    cache.parses.clear()
    again = code_fingerprint(mod.step, mod.Cfg)
    assert cache.parses == [] and again == first
    monkeypatch.setenv("MARIN_CACHE", "off")
    assert code_fingerprint(mod.step, mod.Cfg) == first


def test_a_helper_edited_to_the_same_size_and_mtime_is_seen(cache, pkg, monkeypatch):
    mod = fresh("fpc_pkg.step")
    first = code_fingerprint(mod.step, mod.Cfg)
    helper = pkg / "helper.py"
    stat = helper.stat()
    helper.write_text(helper.read_text().replace("x * 2", "x * 3"))
    os.utime(helper, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert helper.stat().st_size == stat.st_size and helper.stat().st_mtime_ns == stat.st_mtime_ns
    second = code_fingerprint(mod.step, mod.Cfg)  # the live objects are the same: only the file changed
    assert second.digest != first.digest
    assert "fpc_pkg.helper.scale changed" in drift(first.parts, second.parts)
    monkeypatch.setenv("MARIN_CACHE", "off")
    assert code_fingerprint(mod.step, mod.Cfg) == second


def test_a_default_read_from_outside_the_source_is_never_cached(cache, pkg, monkeypatch):
    mod = fresh("fpc_pkg.step")
    first = code_fingerprint(mod.step, mod.Cfg)
    monkeypatch.setenv("FPC_SEED", "7")
    mod = fresh("fpc_pkg.step")  # the same files: the source parts are served from the cache
    cache.parses.clear()
    second = code_fingerprint(mod.step, mod.Cfg)
    assert cache.parses == []
    assert drift(first.parts, second.parts) == ["default of fpc_pkg.step.Cfg.seed: 0 -> 7"]


def test_an_edited_default_is_seen(cache, pkg):
    mod = fresh("fpc_pkg.step")
    first = code_fingerprint(mod.step, mod.Cfg)
    (pkg / "step.py").write_text((pkg / "step.py").read_text().replace("n: int = 1", "n: int = 5"))
    mod = fresh("fpc_pkg.step")
    second = code_fingerprint(mod.step, mod.Cfg)
    assert "default of fpc_pkg.step.Cfg.n: 1 -> 5" in drift(first.parts, second.parts)


def test_a_module_name_that_resolves_to_another_file_is_seen(cache, tmp_path, monkeypatch):
    """The same step file, the same helper name, another folder first on sys.path: the walk
    read another file, so the cached one is not served."""
    for where, factor in (("a", 2), ("b", 3)):
        write(tmp_path / where / "fpc_helper.py", f"def scale(x):\n    return x * {factor}\n")
    write(tmp_path / "s" / "fpc_step.py", "from fpc_helper import scale\n\ndef step(config, ctx):\n"
                                          "    return scale(config)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "s"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    sys.modules.pop("fpc_helper", None)
    first = code_fingerprint(fresh("fpc_step").step)
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    sys.modules.pop("fpc_helper", None)
    second = code_fingerprint(fresh("fpc_step").step)
    assert "fpc_helper.scale changed" in drift(first.parts, second.parts)
    sys.modules.pop("fpc_helper", None)


def test_a_corrupt_or_foreign_entry_is_ignored(cache, pkg, monkeypatch):
    mod = fresh("fpc_pkg.step")
    first = code_fingerprint(mod.step, mod.Cfg)
    entries = list(cache.folder.glob("*.json"))
    assert entries
    for entry in entries:
        entry.write_text('{"version": 1, "key": "another", "parts": {}, "trace": []}')
    assert code_fingerprint(mod.step, mod.Cfg) == first
    for entry in cache.folder.glob("*.json"):
        entry.write_text(entry.read_text()[:40])  # truncated
    assert code_fingerprint(mod.step, mod.Cfg) == first


def test_the_folder_keeps_the_newest_entries(cache, pkg, monkeypatch):
    from executor import fingerprint_cache

    monkeypatch.setattr(fingerprint_cache, "KEEP", 4)
    cache.folder.mkdir(parents=True)
    for i in range(6):
        old = cache.folder / f"old{i}.json"
        old.write_text("{}")
        os.utime(old, (1000 + i, 1000 + i))
    mod = fresh("fpc_pkg.step")
    code_fingerprint(mod.step, mod.Cfg)
    left = sorted(p.name for p in cache.folder.glob("*.json"))
    assert len(left) == 2 and "old5.json" in left and not any(n.startswith("old0") for n in left)


def test_walks_in_two_threads_each_keep_all_their_own_questions(cache, pkg, tmp_path):
    """Each thread's walk records its own trace: an entry written while another thread walked
    still names every file it read (it is missed after that file is edited)."""
    import threading

    write(tmp_path / "src" / "fpc_other.py", "def other(config, ctx):\n    return 1\n")
    mod = fresh("fpc_pkg.step")
    other = importlib.import_module("fpc_other")
    results = {}
    start = threading.Barrier(2)

    def walk(name, fn, cfg):
        start.wait()
        results[name] = code_fingerprint(fn, cfg)

    threads = [threading.Thread(target=walk, args=("step", mod.step, mod.Cfg)),
               threading.Thread(target=walk, args=("other", other.other, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    helper = pkg / "helper.py"
    helper.write_text(helper.read_text().replace("x * 2", "x * 4"))
    assert code_fingerprint(mod.step, mod.Cfg).digest != results["step"].digest
    sys.modules.pop("fpc_other", None)
