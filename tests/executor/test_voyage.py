"""executor/voyage.py: loading a voyage file and calling its optional hooks (`license_policy`,
`pins`, `costs`) the one way: with its config when it has one, one VoyageError naming the file
and the hook when one fails."""

import textwrap

import pytest

from executor import VoyageError
from executor.voyage import call_hook, load

WITH_CONFIG = """
from dataclasses import dataclass

@dataclass(frozen=True)
class C:
    n: int = 3

def voyage(config: C):
    return []

def pins(config: C):
    return [f"pinned/{config.n}"]

def costs(config: C):
    return {}["missing"]

def license_policy(config: C):
    from executor import VoyageError
    raise VoyageError("bad policy: its own words")
"""

WITHOUT_CONFIG = """
def voyage():
    return []

def pins():
    return ["pinned/none"]
"""


def _voyage(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load(str(path))


def test_a_hook_is_called_with_the_config_only_when_the_voyage_has_one(tmp_path):
    vf = _voyage(tmp_path, "with.py", WITH_CONFIG)
    assert call_hook(vf, "pins", vf.config_class(n=7)) == ["pinned/7"]
    bare = _voyage(tmp_path, "without.py", WITHOUT_CONFIG)
    assert call_hook(bare, "pins", None) == ["pinned/none"]


def test_a_missing_hook_gives_the_callers_default(tmp_path):
    bare = _voyage(tmp_path, "without.py", WITHOUT_CONFIG)
    assert call_hook(bare, "costs", None, missing={}) == {}
    assert call_hook(bare, "license_policy", None) is None


def test_a_failing_hook_is_one_error_naming_the_file_and_the_hook(tmp_path):
    vf = _voyage(tmp_path, "with.py", WITH_CONFIG)
    with pytest.raises(VoyageError) as e:
        call_hook(vf, "costs", vf.config_class())
    assert str(e.value) == f"{vf.path}: costs() failed: KeyError: 'missing'"
    with pytest.raises(VoyageError, match=r"^bad policy: its own words$"):  # a VoyageError is the hook's own
        call_hook(vf, "license_policy", vf.config_class())
