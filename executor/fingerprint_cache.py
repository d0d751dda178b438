"""The code fingerprint's walk, kept on disk between processes, and served only when it would
come out the same.

Every `marin-run` is a new process, and the walk reads (parses, normalizes, hashes) every project
module in a step function's import closure: for a voyage file of 3,000 generated steps that cost
more than the rest of its plan (docs/benchmarks.md). Its result is a pure function of what it read and
what it asked: which file each module name resolves to, each module's label, whether a file is
project code, and each file's bytes. So an entry holds the parts with every (question, answer)
of the walk, and is served only after every question is asked again with the same answer, the
bytes of every file hashed again (sha256 of the content: never its mtime or size, which an edit
can keep). Its key names what else the walk depends on: the fingerprint code itself (its file's
hash), the Python version, the step function and its config classes (executor.fingerprint's
`_cache_key`). Field defaults are not in an entry: they are read from the live classes every time.

Where: `$MARIN_CACHE/fingerprint/` (default `~/.cache/marin-voyage`); `MARIN_CACHE=off` turns it
off. An entry that cannot be read, written or parsed is ignored: the walk runs.
"""

from __future__ import annotations

import json
import os
from typing import Any

VERSION = 1
KEEP = 2000  # entries kept; past it, the older half (by mtime) is removed when one is written


def folder() -> str | None:
    """Where entries live, or None when the cache is off."""
    root = os.environ.get("MARIN_CACHE")
    if root == "off":
        return None
    root = root or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "marin-voyage")
    return os.path.join(root, "fingerprint")


def get(key: str) -> dict[str, str] | None:
    """The parts of the walk for `key` if an entry exists and every answer it recorded is still
    the answer; else None."""
    from executor.fingerprint import replay

    where = folder()
    if where is None:
        return None
    try:
        with open(os.path.join(where, key + ".json"), encoding="utf-8") as f:
            entry = json.load(f)
        if entry.get("version") != VERSION or entry.get("key") != key:
            return None
        parts, trace = entry["parts"], entry["trace"]
        if not isinstance(parts, dict) or not isinstance(trace, list):
            return None
        for kind, arg, answer in trace:
            if replay(kind, arg) != answer:
                return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return {str(k): str(v) for k, v in parts.items()}


def put(key: str, parts: dict[str, str], trace: list[tuple[str, str, Any]]) -> None:
    """Keep the walk for `key` (written whole or not at all: a temporary file renamed)."""
    where = folder()
    if where is None:
        return
    seen: dict[tuple[str, str], Any] = {}
    for kind, arg, answer in trace:
        if seen.setdefault((kind, arg), answer) != answer:
            return  # a file changed while it was walked: which answer made the parts is unclear
    entry = {"version": VERSION, "key": key, "parts": parts,
             "trace": [[kind, arg, answer] for (kind, arg), answer in seen.items()]}
    import tempfile  # only a cold walk writes an entry

    try:
        os.makedirs(where, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f)
            os.replace(tmp, os.path.join(where, key + ".json"))
        except BaseException:
            os.unlink(tmp)
            raise
        _prune(where)
    except OSError:
        pass


def _prune(where: str) -> None:
    """Every edit makes new entries (and a test's temporary modules new keys): keep the newest."""
    with os.scandir(where) as it:
        entries = [e for e in it if e.name.endswith(".json")]
    if len(entries) <= KEEP:
        return
    by_age = sorted(entries, key=lambda e: e.stat().st_mtime)
    for entry in by_age[:len(by_age) - KEEP // 2]:
        try:
            os.unlink(entry.path)
        except OSError:
            pass
