"""Where an attempt writes, and how a reader finds the committed one (docs/concepts.md, "Attempts").

An output folder `{prefix}/{name}-{digest[:10]}` holds two files of the executor's and one folder
per attempt:

    {output}/.lease                      who may write (executor.storage.lease)
    {output}/.status                     the commit record: which attempt is served (executor.storage.store)
    {output}/.attempts/{id}/...          one attempt's files, and its record `.step.json`

An attempt writes only under its own `.attempts/{id}/`, which no reader resolves until a `.status`
naming it (`dir`) is committed: one small atomic write, fenced by the lease (a rename under the
lease's lock on a local disk, a generation-matched write on GCS). Nothing is copied or moved to
commit. A `.status` of a running or failed attempt carries the SUCCESS it would replace
(`committed`), so the last good output stays served until another attempt commits.

Folders made before attempts had folders of their own have a `.status` without `dir`: their files
are the folder itself, and they are read as before.

Outputs name each other (a mixture its datasets, a token dataset its tokenizer) by paths relative
to the output folder, without attempt ids (`steps.data.paths`): `logical` takes the attempt out of
a URL, `served` puts the committed one back in by reading the `.status` of the output the URL is in.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from typing import Any

ATTEMPTS = ".attempts"
_ATTEMPT_RE = re.compile(r"/\.attempts/[^/]+(?=/|$)")
_OUTPUT_SEGMENT = re.compile(r".-[0-9a-f]{10}$")  # `{name}-{digest[:10]}`, the executor's folder naming


def new_dir(number: int) -> str:
    """A fresh attempt folder, relative to the output folder: unique even when two executors (one
    of them paused past its lease) start the same attempt number."""
    return f"{ATTEMPTS}/{number:04d}-{uuid.uuid4().hex[:8]}"


def logical(url: str) -> str:
    """`url` without its attempt: `{output}/.attempts/{id}/x` -> `{output}/x`."""
    return _ATTEMPT_RE.sub("", url.rstrip("/"), count=1) or url


def attempt_root(url: str) -> str | None:
    """The attempt folder `url` lies in (`{output}/.attempts/{id}`), or None."""
    m = _ATTEMPT_RE.search(url)
    return url[: m.end()] if m else None


def served(url: str, fs=None) -> str:
    """The URL a reader reads for `url`: a path inside an executor's output folder (no attempt in
    it) is moved into the attempt that folder's `.status` commits; anything else is itself. The
    output folder is the first segment named `{name}-{digest[:10]}` that holds a `.status`."""
    from executor.storage.store import STATUS, url_to_fs, _parse_status  # the store owns the status format

    if attempt_root(url) is not None:
        return url
    scheme, sep, rest = url.partition("://")
    head, path = (scheme + sep, rest) if sep else ("", url)
    parts = path.rstrip("/").split("/")
    for i, segment in enumerate(parts):
        if not _OUTPUT_SEGMENT.search(segment):
            continue
        folder = head + "/".join(parts[: i + 1])
        if fs is None:
            fs_, folder_path = url_to_fs(folder)
        else:
            fs_, folder_path = fs, "/".join(parts[: i + 1])
        try:
            data = fs_.cat_file(f"{folder_path}/{STATUS}")
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            status = _parse_status(folder, data)
        except json.JSONDecodeError:
            status = None
        commit = status.served() if status is not None else None
        if commit is not None:
            _note(folder, commit)
        if commit is None or not commit.dir:
            return url
        return "/".join([folder, commit.dir, *parts[i + 1:]])
    return url


# -- what an attempt resolved: the outputs it reached through names inside other outputs -----------
#
# A worker records every output `served` resolves while its step runs (a mixture's token datasets,
# a token dataset's tokenizer), and checks them as it checks its direct inputs: unchanged before
# the commit, and never resumed across a change (executor.worker). The recorders of a process
# are shared by its threads: an attempt may record another's resolutions, which only adds checks.

RESOLVED = ".resolved.json"  # in an attempt's folder: what it resolved so far (executor.worker)
_RECORDERS: list["Resolved"] = []
_LOCK = threading.Lock()


class Resolved:
    """{output folder URL: (attempt, token, dir, output digest) it served when first resolved}."""

    def __init__(self, on_new: Any = None) -> None:
        self.seen: dict[str, tuple] = {}
        self.on_new = on_new

    def __enter__(self) -> "Resolved":
        with _LOCK:
            _RECORDERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _LOCK:
            if self in _RECORDERS:
                _RECORDERS.remove(self)

    def add(self, folder: str, key: tuple) -> None:
        if folder in self.seen:
            return
        self.seen[folder] = key
        if self.on_new is not None:
            self.on_new(self)


def current_key(folder: str) -> tuple | None:
    """The commit key of what output folder `folder` (a URL) serves now; None if nothing."""
    from executor.storage.store import STATUS, url_to_fs, _parse_status

    fs, path = url_to_fs(folder)
    try:
        data = fs.cat_file(f"{path.rstrip('/')}/{STATUS}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        status = _parse_status(folder, data)
    except json.JSONDecodeError:
        return None
    commit = status.served() if status is not None else None
    return commit_key(commit) if commit is not None else None


def commit_key(status: Any) -> tuple:
    """What identifies the bytes an output serves: its attempt, token, folder and output digest."""
    return (status.attempt, status.token, status.dir, status.output_digest)


def _note(folder: str, commit: Any) -> None:
    if not _RECORDERS:
        return
    with _LOCK:
        recorders = list(_RECORDERS)
    for r in recorders:
        r.add(logical(folder), commit_key(commit))
