"""How an output names another output: by a path relative to itself, so a prefix can be copied.

The data steps record where their inputs are: a mixture its token datasets, a token dataset its
tokenizer and source shards, a ledger the shard it was made from. A URL inside the step's own
prefix is written as a path relative to the folder of the file that records it, starting with
`./` or `../` (`../../tokenized/kjv-af75ae205f`); a reader resolves it against the folder it read
the file from (`resolve`). So `cp -r` or `gsutil rsync` of a prefix to another folder, bucket or
region gives outputs with the same bytes, hence the same output digests, that read only from the
copy. Anything outside the prefix (a raw corpus in another bucket, a hub tokenizer name) is
written as given, and resolved as itself.

The prefix of a running step is its output URL less its attempt (`/.attempts/{id}`) and
`{name}-{digest[:10]}` (the executor's folder naming); a step run by hand in some other folder has
none, and writes URLs as given. A name never holds an attempt: a path into another output is
written relative to the output folders (`../../tokenized/kjv-af75ae205f/manifest.json`), and
`resolve` reads it in the attempt that output's `.status` commits now (`executor.storage.attempts`), so an
identical rerun of the input, which cuts off downstream, leaves the name valid. A path inside the
writer's own attempt stays inside it (`./shards/0.bin`): the attempt may not be committed yet.
"""

from __future__ import annotations

import posixpath

from executor import StepContext, attempt_root
from executor import logical_url as logical
from executor import served_url as served


def prefix_of(ctx: StepContext) -> str | None:
    """The prefix the step's output folder lives under, or None if the folder is not named by
    the executor's rule (`{prefix}/{name}-{digest[:10]}`)."""
    tail = f"/{ctx.name}-{ctx.digest[:10]}"
    output = logical(ctx.output)
    return output[: -len(tail)] if output.endswith(tail) and len(output) > len(tail) else None


def ref(ctx: StepContext, url: str, folder: str | None = None) -> str:
    """How a file in `folder` (default: the step's output folder) names `url`: relative when both
    are inside the step's prefix, else `url` itself."""
    prefix = prefix_of(ctx)
    folder = (folder or ctx.output).rstrip("/")
    if prefix is None or not (_inside(url, prefix) and _inside(folder, prefix)):
        return url
    own = attempt_root(folder)
    if own is None or not _inside(url, own):  # another output: named without attempts
        url, folder = logical(url), logical(folder)
    rel = posixpath.relpath(_split(url)[1], _split(folder)[1])
    return rel if rel.startswith("../") else f"./{rel}"


def resolve(name: str, folder: str) -> str:
    """The URL a file in `folder` means by `name`: a `./` or `../` path against the folder (in
    the writer's own attempt, or else in the attempt another output commits), anything else as
    it is."""
    if not name.startswith(("./", "../")):
        return name
    scheme, path = _split(folder.rstrip("/"))
    here = scheme + posixpath.normpath(posixpath.join(path, name))
    own = attempt_root(folder)
    if own is not None and _inside(here, own):
        return here
    scheme, path = _split(logical(folder))
    return served(scheme + posixpath.normpath(posixpath.join(path, name)))


def _inside(url: str, prefix: str) -> bool:
    return url.rstrip("/").startswith(prefix.rstrip("/") + "/")


def _split(url: str) -> tuple[str, str]:
    """(`gs://`, `bucket/path`) of a URL; ("", path) of a local path."""
    scheme, sep, rest = url.partition("://")
    return (scheme + sep, rest) if sep else ("", url)
