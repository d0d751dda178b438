"""The environment a step ran in: the git commit of the code (and whether the tree was dirty) and
the versions of the key packages. Recorded in every record, not keyed: like the code fingerprint,
a difference is a note in the plan, never a new output path.

Computed once per process (`current()`): reading the commit costs a few file reads (HEAD, a ref,
packed-refs; no subprocess), the dirty flag one `git status` run, the versions one metadata
lookup each. Code that is not a git checkout (an installed wheel, a copied folder), or a machine
without git, records why the commit or the flag is unknown, and never fails.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Any

# The packages whose versions change what a step computes. triton only where installed (the GPU
# kernels); a package that is not installed is left out.
PACKAGES = ("marin-voyage", "torch", "ray", "tokenizers", "triton", "numpy")
GIT_TIMEOUT = 10.0  # seconds for the one `git status`; past it the flag is unknown


def code_root() -> str:
    """The folder holding the `executor` package: the checkout's root when run from a checkout."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def current(root: str | None = None) -> dict[str, Any]:
    """{"git": {"commit", "dirty", "describe"}, "packages": {name: version}} of this process."""
    return {"git": git_state(root or code_root()), "packages": package_versions()}


def package_versions() -> dict[str, str]:
    """python and the installed key packages, by version (importlib.metadata's answers)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        version = dist_info_version(name)
        if version is None:  # not the plain case: importlib.metadata decides
            from importlib import metadata

            try:
                version = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        if version is not NOT_INSTALLED:
            out[name] = version
    return out


NOT_INSTALLED = "<not installed>"


def dist_info_version(name: str) -> str | None:
    """`importlib.metadata.version(name)` where the answer is plain, without importing
    importlib.metadata (its email, zipfile and csv are a tenth of what a dry-run imports, and every
    plan asks for these versions): the first `<name>-*.dist-info` folder on sys.path, in its order,
    and the Version header of its METADATA; NOT_INSTALLED when every sys.path entry is a folder and
    none holds one. None where importlib.metadata could answer otherwise (an entry that is a file,
    such as a zip; an egg; two candidates in one folder; no plain Version header): ask it then.
    tests/executor/test_environment.py compares the two on every installed distribution."""
    want = _normalized(name)
    for entry in sys.path:
        found = _dist_infos(entry or ".")
        if found is None:
            return None
        candidates = found.get(want, [])
        if not candidates:
            continue
        if len(candidates) > 1:
            return None
        folder = os.path.join(entry or ".", candidates[0])
        if candidates[0].endswith(".dist-info"):
            return _metadata_version(os.path.join(folder, "METADATA"))
        # An `.egg-info` folder: what setuptools leaves in a checkout installed in editable mode,
        # found first when the checkout is the working folder; importlib.metadata reads its METADATA,
        # else its PKG-INFO. An `.egg-info` file (older setuptools): ask importlib.metadata.
        if not os.path.isdir(folder):
            return None
        meta = os.path.join(folder, "METADATA")
        return _metadata_version(meta if os.path.exists(meta) else os.path.join(folder, "PKG-INFO"))
    return NOT_INSTALLED


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")  # as importlib.metadata's Prepared


@functools.lru_cache(maxsize=None)
def _dist_infos(folder: str) -> dict[str, list[str]] | None:
    """{normalized name: its `.dist-info`/`.egg-info` children} of a sys.path folder; {} for a
    path that does not exist; None for one importlib.metadata reads otherwise (a zip, an egg)."""
    try:
        children = os.listdir(folder)
    except OSError:
        return None if os.path.isfile(folder) else {}
    if os.path.basename(folder).lower().endswith(".egg"):
        return None
    out: dict[str, list[str]] = {}
    for child in children:
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")):
            out.setdefault(_normalized(low.rpartition(".")[0].partition("-")[0]), []).append(child)
    return out


def _metadata_version(path: str) -> str | None:
    """The first Version header of a METADATA file (headers end at the first blank line)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, ValueError):
        return None
    for i, line in enumerate(lines):
        if not line.strip():
            return None
        key, sep, value = line.partition(":")
        if sep and key.lower() == "version":
            folded = i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t")
            return None if folded or not value.strip() else value.strip()
    return None


def git_state(root: str) -> dict[str, Any]:
    """The commit checked out at `root` and whether its tracked files (or new files git does not
    ignore) differ from it; None for what cannot be known, with `describe` saying why."""
    git_dir = _git_dir(root)
    if git_dir is None:
        return {"commit": None, "dirty": None, "describe": f"not a git checkout ({root}): an installed package?"}
    try:
        commit = _head_commit(git_dir)
    except OSError as e:
        return {"commit": None, "dirty": None, "describe": f"cannot read git HEAD in {git_dir}: {e}"}
    if commit is None:
        return {"commit": None, "dirty": None, "describe": f"no commit checked out in {root}"}
    dirty, why = _dirty(root)
    state = {"commit": commit, "dirty": dirty, "describe": commit[:12] + ("-dirty" if dirty else "")}
    if why:
        state["describe"] = f"{commit[:12]} ({why})"
    return state


def _git_dir(root: str) -> str | None:
    """`root/.git`, or the folder a worktree's `.git` file points to; None when there is neither
    (only `root` itself is looked at: an installed package inside some checkout is not it)."""
    dot = os.path.join(root, ".git")
    if os.path.isdir(dot):
        return dot
    if os.path.isfile(dot):
        try:
            with open(dot, encoding="utf-8") as f:
                line = f.read().strip()
        except OSError:
            return None
        if line.startswith("gitdir:"):
            path = line[len("gitdir:"):].strip()
            return path if os.path.isabs(path) else os.path.normpath(os.path.join(root, path))
    return None


def _head_commit(git_dir: str) -> str | None:
    """The commit HEAD names, read from the files (a worktree's refs live in its common dir)."""
    with open(os.path.join(git_dir, "HEAD"), encoding="utf-8") as f:
        head = f.read().strip()
    if not head.startswith("ref:"):
        return head or None  # detached
    ref = head[len("ref:"):].strip()
    common = git_dir
    common_file = os.path.join(git_dir, "commondir")
    if os.path.isfile(common_file):
        with open(common_file, encoding="utf-8") as f:
            common = os.path.normpath(os.path.join(git_dir, f.read().strip()))
    for base in (git_dir, common):
        path = os.path.join(base, ref)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read().strip() or None
    packed = os.path.join(common, "packed-refs")
    if os.path.isfile(packed):
        with open(packed, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    return None  # a branch without commits


def _dirty(root: str) -> tuple[bool | None, str]:
    """(whether the tree differs from HEAD, why that is unknown)."""
    git = shutil.which("git")
    if git is None:
        return None, "dirty unknown: no git program"
    try:
        out = subprocess.run([git, "-C", root, "status", "--porcelain", "--untracked-files=normal"],
                             capture_output=True, timeout=GIT_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"dirty unknown: {type(e).__name__}"
    if out.returncode != 0:
        first = out.stderr.decode("utf-8", "replace").strip().splitlines()[:1]
        return None, f"dirty unknown: git status failed ({first[0] if first else out.returncode})"
    return bool(out.stdout.strip()), ""


def packages_digest(env: dict[str, Any]) -> str:
    """A short digest of the package versions (what `.status` keeps, so the plan can compare)."""
    body = json.dumps(env.get("packages") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def commit_text(env: dict[str, Any]) -> str:
    """`abc123def456` or `abc123def456-dirty`, or "" when unknown."""
    git = env.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return ""
    return commit[:12] + ("-dirty" if git.get("dirty") else "")


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two package maps, as `torch 2.12.0 -> 2.13.0` (sorted by name)."""
    old, new = recorded.get("packages") or {}, now.get("packages") or {}
    out = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            out.append(f"{name} {old.get(name, 'absent')} -> {new.get(name, 'absent')}")
    return out
