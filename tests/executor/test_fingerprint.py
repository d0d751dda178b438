"""The code fingerprint follows what changes a step's behaviour (helpers behind
decorators, Triton kernels, module constants, `pkg.mod.fn()` chains, the config class and its
defaults), names what changed, and is the same on every Python version for the same source."""

import importlib
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from executor.fingerprint import code_fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def digest_of(fp) -> str:
    return getattr(fp, "digest", fp)


@pytest.fixture
def module(tmp_path, monkeypatch):
    """`module(name, source)`: write `name.py` (or a package file) and import it afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    # No bytecode: an edit that keeps the file's size within the second of the last write (a
    # warm fingerprint cache makes that likely) would otherwise import the stale .pyc.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def make(name, source, files=()):
        for rel, text in files:
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        stems = {r.split("/")[0].removesuffix(".py") for r, _ in files}  # a package, or a module file
        for mod in [m for m in sys.modules if m == name or m.split(".")[0] in stems]:
            del sys.modules[mod]
        importlib.invalidate_caches()
        return importlib.import_module(name)

    return make


def changes(module, name, before, after, files_before=(), files_after=(), config=None):
    """Fingerprints of `step` in `before` and in `after` (the same module edited)."""
    first = module(name, before, files_before)
    fp1 = code_fingerprint(first.step, *((getattr(first, config),) if config else ()))
    second = module(name, after, files_after)
    fp2 = code_fingerprint(second.step, *((getattr(second, config),) if config else ()))
    return fp1, fp2


def changed_parts(fp1, fp2, modules=False):
    """The parts that differ: the precise walk's (units and defaults), or with `modules` the
    fail-safe parts too (`module <name>`: a module's whole normalized source)."""
    return sorted(k for k in set(fp1.parts) | set(fp2.parts) if fp1.parts.get(k) != fp2.parts.get(k)
                  and (modules or not k.startswith("module ")))


def test_a_helper_behind_lru_cache_counts(module):
    src = """
    import functools

    @functools.lru_cache(maxsize=None)
    def load_tokenizer(name):
        return name.upper()

    def step(config, ctx):
        return load_tokenizer(config)
    """
    fp1, fp2 = changes(module, "fp_cached", src, src.replace("upper", "lower"))
    assert digest_of(fp1) != digest_of(fp2)
    assert changed_parts(fp1, fp2) == ["fp_cached.load_tokenizer"]


def test_a_helper_behind_functools_wraps_counts(module):
    src = """
    import functools

    def logged(fn):
        @functools.wraps(fn)
        def wrapper(*a):
            return fn(*a)
        return wrapper

    @logged
    def helper(x):
        return x + 1

    def step(config, ctx):
        return helper(config)
    """
    fp1, fp2 = changes(module, "fp_wrapped", src, src.replace("x + 1", "x + 2"))
    assert digest_of(fp1) != digest_of(fp2)
    assert "fp_wrapped.helper" in changed_parts(fp1, fp2)


def test_a_triton_kernel_counts(module):
    src = """
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, n: tl.constexpr):
        tl.store(x_ptr, n)

    def step(config, ctx):
        kernel[(1,)](config, 4)
    """
    fp1, fp2 = changes(module, "fp_kernel", src, src.replace("tl.store(x_ptr, n)", "tl.store(x_ptr, n + 1)"))
    assert digest_of(fp1) != digest_of(fp2)
    assert changed_parts(fp1, fp2) == ["fp_kernel.kernel"]


def test_a_module_constant_the_step_reads_counts(module):
    src = """
    SCALE = 3
    OFFSET = SCALE * 2

    def step(config, ctx):
        return config * OFFSET
    """
    fp1, fp2 = changes(module, "fp_const", src, src.replace("SCALE = 3", "SCALE = 4"))
    assert digest_of(fp1) != digest_of(fp2)
    assert changed_parts(fp1, fp2) == ["fp_const.SCALE"]


def test_a_call_through_a_package_attribute_chain_counts(module):
    src = """
    import fp_pkg.inner

    def step(config, ctx):
        return fp_pkg.inner.helper(config)
    """
    helper = "def helper(x):\n    return x + 1\n"
    files1 = [("fp_pkg/__init__.py", ""), ("fp_pkg/inner.py", helper)]
    files2 = [("fp_pkg/__init__.py", ""), ("fp_pkg/inner.py", helper.replace("+ 1", "+ 2"))]
    fp1, fp2 = changes(module, "fp_chain", src, src, files1, files2)
    assert digest_of(fp1) != digest_of(fp2)
    assert changed_parts(fp1, fp2) == ["fp_pkg.inner.helper"]


def test_the_config_class_and_its_defaults_count_and_a_changed_default_is_named(module):
    src = """
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Inner:
        lr: float = 0.1

    @dataclass(frozen=True)
    class Cfg:
        n: int = 1
        inner: Inner = field(default_factory=Inner)

        def __post_init__(self):
            assert self.n > 0

    def step(config, ctx):
        return config.n
    """
    fp1, fp2 = changes(module, "fp_cfg", src, src.replace("n: int = 1", "n: int = 1000"), config="Cfg")
    assert digest_of(fp1) != digest_of(fp2)
    assert changed_parts(fp1, fp2) == ["default fp_cfg.Cfg.n"]
    assert fp1.parts["default fp_cfg.Cfg.n"].endswith(" 1") and fp2.parts["default fp_cfg.Cfg.n"].endswith(" 1000")
    fp3, fp4 = changes(module, "fp_cfg", src, src.replace("lr: float = 0.1", "lr: float = 0.2"), config="Cfg")
    assert changed_parts(fp3, fp4) == ["default fp_cfg.Inner.lr"]
    fp5, fp6 = changes(module, "fp_cfg", src, src.replace("self.n > 0", "self.n > 1"), config="Cfg")
    assert changed_parts(fp5, fp6) == ["fp_cfg.Cfg"]


def test_comments_docstrings_annotations_and_layout_do_not_count(module):
    src = """
    def helper(x):
        return x + 1

    def step(config, ctx):
        '''doc'''
        return helper(config)
    """
    other = """
    # a comment
    def helper(x: int) -> int:
        '''a docstring'''
        return (x +
                1)  # same code


    def step(config, ctx) -> None:
        '''another doc'''
        return helper(  config  )
    """
    fp1, fp2 = changes(module, "fp_layout", src, other)
    assert digest_of(fp1) == digest_of(fp2)


FIXED = '''
import functools

LIMIT = 10 ** 3
NAMES = ("a", "b")


@functools.lru_cache(maxsize=None)
def table(n):
    return {k: i * 1.5 for i, k in enumerate(NAMES[:n])}


class Box:
    size: int = 4

    def grow(self, by=2):
        return f"{self.size + by!r:>{LIMIT}}" if by else f'{by=}'  # f-strings tokenize anew in 3.12


def step(config, ctx):
    """Docstrings do not count."""
    with open(config) as f:
        data = f.read()
    match data.split():
        case [first, *rest] if first:
            return table(len(rest)), Box().grow(), lambda *a, **k: (a, k)
        case _:
            return {**{}, "x": [*range(3)]}
'''

# The fingerprint of FIXED's `step`, pinned: a change here means every recorded fingerprint drifts.
PINNED = "fp3:4b001eceaab2845414c40c2b72ac5d9d17cbea9467c36e3109653c0e6360c433"

OTHER_PYTHONS = [os.path.expanduser(f"~/.pyenv/versions/{v}/bin/python") for v in ("3.12.1", "3.13.0")]


def test_the_fingerprint_is_pinned_and_the_same_on_other_python_versions(module, tmp_path):
    fixed = module("fp_fixed", FIXED)
    here = code_fingerprint(fixed.step)
    assert digest_of(here) == PINNED
    # The static part needs nothing but the standard library: load it alone under each Python.
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(tmp_path)!r})
        spec = importlib.util.spec_from_file_location("fp_alone", {os.path.join(ROOT, "executor", "fingerprint.py")!r})
        fp = sys.modules["fp_alone"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fp)
        import fp_fixed
        print(fp.code_fingerprint(fp_fixed.step).digest)
    """)
    others = {}
    for python in OTHER_PYTHONS + [shutil.which(f"python3.{minor}") for minor in (12, 13, 14)]:
        probe = python and subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                                          capture_output=True, text=True)
        if probe and probe.returncode == 0 and probe.stdout.strip() != str(sys.version_info[:2]):
            others[probe.stdout.strip()] = python
    if not others:
        pytest.skip("no other Python interpreter on this machine (pyenv 3.12/3.13 not found)")
    for python in others.values():
        out = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == PINNED, python


def test_a_voyage_file_loaded_under_two_module_names_has_one_fingerprint():
    """marin-run loads voyages/hello.py as `marin_voyage_hello`, a notebook or a test under
    another name: the same file must not look drifted from one to the other."""
    import importlib.util

    fps = []
    for name in ("marin_voyage_hello_fp", "hello_fp_under_another_name"):
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "voyages", "hello.py"))
        mod = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fps.append(code_fingerprint(mod.count_words, mod.CountConfig))
    assert fps[0] == fps[1] and "hello.count_words" in fps[0].parts


# -- a fingerprint that fails safe --------------------------------------------------
# Each of these edits once left the fingerprint unchanged, so a stale output was served as plain
# "cached". The precise walk may or may not name the unit; the module's normalized source (every
# project module in the import closure of the step's and the config's modules) always changes.

ESCAPES_BASE = """
from dataclasses import dataclass, field
from typing import ClassVar
from fp_escape_helpers import *

TABLE = {"scale": 1}

@dataclass(frozen=True)
class Inner:
    k: int = 1

@dataclass(frozen=True)
class Cfg:
    anything: object = Inner()
    pair: tuple = (Inner(),)
    derived: int = field(init=False, default=3)
    LIMIT: ClassVar[int] = 10

def plain_wrapper(fn):
    def wrapper(config, ctx):
        return fn(config, ctx) + 1
    return wrapper

class Other:
    def method(self, helper):
        return [helper for helper in range(2)]

def helper(x):
    return x * 2

@plain_wrapper
def step(config, ctx):
    return helper(TABLE["scale"]) + starred(config.LIMIT) + config.derived
"""

ESCAPES = {
    "a default nested in an untyped field": ("anything: object = Inner()", "anything: object = Inner(k=2)"),
    "a default nested in a bare tuple": ("pair: tuple = (Inner(),)", "pair: tuple = (Inner(k=5),)"),
    "a field(init=False) default": ("field(init=False, default=3)", "field(init=False, default=4)"),
    "a ClassVar of the config class": ("LIMIT: ClassVar[int] = 10", "LIMIT: ClassVar[int] = 11"),
    "a decorator without functools.wraps": ("fn(config, ctx) + 1", "fn(config, ctx) + 2"),
    "a module-level mutation": ('TABLE = {"scale": 1}', 'TABLE = {"scale": 1}\nTABLE.update(scale=5)'),
    "a helper whose name is a local elsewhere": ("return x * 2", "return x * 3"),
}


@pytest.mark.parametrize("what", sorted(ESCAPES))
def test_every_escape_gives_a_drift_note(module, what):
    old, new = ESCAPES[what]
    helpers = [("fp_escape_helpers.py", "def starred(n):\n    return n\n")]
    assert old in ESCAPES_BASE
    fp1, fp2 = changes(module, "fp_escape", ESCAPES_BASE, ESCAPES_BASE.replace(old, new), helpers, helpers, "Cfg")
    assert fp1.digest != fp2.digest, what
    from executor.fingerprint import drift

    assert drift(fp1.parts, fp2.parts), what


def test_a_helper_reached_through_a_star_import_gives_a_drift_note(module):
    before = [("fp_escape_helpers.py", "def starred(n):\n    return n\n")]
    after = [("fp_escape_helpers.py", "def starred(n):\n    return n + 1\n")]
    fp1, fp2 = changes(module, "fp_escape", ESCAPES_BASE, ESCAPES_BASE, before, after, "Cfg")
    assert "module fp_escape_helpers" in changed_parts(fp1, fp2, modules=True)
    from executor.fingerprint import drift

    assert "module fp_escape_helpers changed" in drift(fp1.parts, fp2.parts)


def test_cosmetic_edits_of_any_module_in_the_closure_give_no_note(module):
    helpers = [("fp_escape_helpers.py", "def starred(n):\n    return n\n")]
    cosmetic = [("fp_escape_helpers.py", '"""A docstring."""\n\n# a comment\ndef starred(n: int) -> int:\n'
                                         '    """doc"""\n    return (n)\n')]
    edited = ESCAPES_BASE.replace("def helper(x):", "# a comment\ndef helper(x: int) -> int:\n    '''doc'''")
    fp1, fp2 = changes(module, "fp_escape", ESCAPES_BASE, '"""Module doc."""\n' + edited, helpers, cosmetic, "Cfg")
    assert fp1.digest == fp2.digest, changed_parts(fp1, fp2, modules=True)


def test_the_closure_follows_imports_inside_functions_and_leaves_out_installed_packages(module):
    fp = code_fingerprint(module("fp_lazy", "import json\n\ndef step(config, ctx):\n    import fp_lazy_dep\n"
                                            "    return fp_lazy_dep.f()\n",
                                 [("fp_lazy_dep.py", "def f():\n    return 1\n")]).step)
    mods = sorted(k for k in fp.parts if k.startswith("module "))
    assert mods == ["module fp_lazy", "module fp_lazy_dep"], mods
