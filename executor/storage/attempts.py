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
to the output folder, without attempt ids (`steps.data.refs`): `logical` takes the attempt out of
a URL, `served` puts the committed one back in by reading the `.status` of the output the URL is in.
"""

from __future__ import annotations

import json
import re
import uuid

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
        if commit is None or not commit.dir:
            return url
        return "/".join([folder, commit.dir, *parts[i + 1:]])
    return url
