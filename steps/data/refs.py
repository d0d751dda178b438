"""How an output names another output: by a path relative to itself, so a prefix can be copied.

The data steps record where their inputs are: a mixture its token datasets, a token dataset its
tokenizer and source shards, a ledger the shard it was made from. A URL inside the step's own
prefix is written as a path relative to the folder of the file that records it, starting with
`./` or `../` (`../../tokenized/kjv-af75ae205f`); a reader resolves it against the folder it read
the file from (`resolve`). So `cp -r` or `gsutil rsync` of a prefix to another folder, bucket or
region gives outputs with the same bytes, hence the same output digests, that read only from the
copy. Anything outside the prefix (a raw corpus in another bucket, a hub tokenizer name) is
written as given, and resolved as itself.

The prefix of a running step is its output URL less `{name}-{digest[:10]}` (the executor's
folder naming); a step run by hand in some other folder has none, and writes URLs as given.
"""

from __future__ import annotations

import posixpath

from executor import StepContext


def prefix_of(ctx: StepContext) -> str | None:
    """The prefix the step's output folder lives under, or None if the folder is not named by
    the executor's rule (`{prefix}/{name}-{digest[:10]}`)."""
    tail = f"/{ctx.name}-{ctx.digest[:10]}"
    output = ctx.output.rstrip("/")
    return output[: -len(tail)] if output.endswith(tail) and len(output) > len(tail) else None


def ref(ctx: StepContext, url: str, folder: str | None = None) -> str:
    """How a file in `folder` (default: the step's output folder) names `url`: relative when both
    are inside the step's prefix, else `url` itself."""
    prefix = prefix_of(ctx)
    folder = (folder or ctx.output).rstrip("/")
    if prefix is None or not (_inside(url, prefix) and _inside(folder, prefix)):
        return url
    rel = posixpath.relpath(_split(url)[1], _split(folder)[1])
    return rel if rel.startswith("../") else f"./{rel}"


def resolve(name: str, folder: str) -> str:
    """The URL a file in `folder` means by `name`: a `./` or `../` path against the folder,
    anything else as it is."""
    if not name.startswith(("./", "../")):
        return name
    scheme, path = _split(folder.rstrip("/"))
    return scheme + posixpath.normpath(posixpath.join(path, name))


def _inside(url: str, prefix: str) -> bool:
    return url.rstrip("/").startswith(prefix.rstrip("/") + "/")


def _split(url: str) -> tuple[str, str]:
    """(`gs://`, `bucket/path`) of a URL; ("", path) of a local path."""
    scheme, sep, rest = url.partition("://")
    return (scheme + sep, rest) if sep else ("", url)
