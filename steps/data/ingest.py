"""ingest: raw documents from any fsspec URL or glob into normalized JSONL shards.

Inputs are JSONL (plain, gzip or zstd) or Parquet. Every input file is read as a stream by one
task (`ctx.map`); it becomes one or more output shards `documents/FFFFF-PPPP.jsonl.zst` of at
most `max_docs_per_shard` documents each, `{"id", "text", "metadata"}` per line. A record that
cannot be used is counted under its reason and written, truncated, to `rejects/FFFFF.jsonl.zst`.
Reasons: `invalid_utf8`, `invalid_json`, `not_an_object`, `no_text` (field missing or not a
string), `empty_text` (empty or blank), `corrupt_file` (the stream broke off; what was read before
is kept). A few rejects are normal; many mean the source is read wrong (text under another field,
the wrong format): the step fails, naming the reasons and one example, when rejects are more than
`max_reject_share` of the records (default 1%), or when no document is left.

Resumable per input file: a file is done once `ledger/FFFFF.json` exists (written last, after
its shards were renamed into place), so a crashed run redoes only the unfinished files. The step
lists the ledger folder once, retries transient store errors, and may leave out (quarantine)
input files that keep failing, up to `max_quarantine_share`, naming them in the manifest and the
record (`steps.data.shard_io`).

Input files are named in the output (manifest, ledgers, rejects) as the config names them: a
relative input read from `root` stays relative, so the same corpus in two checkouts gives the same
bytes and output digest.

Ingest is where a source's licence enters (`license`, an SPDX id or a short name with a URL:
docs/provenance.md): the manifest keeps it under `licenses`, keyed by this step's name, and every
step after it carries it on. The licence is identity, like the data itself: correcting it
re-addresses this output and everything built from it.
"""

from __future__ import annotations

import collections
import functools
import json
import posixpath
from dataclasses import dataclass
from typing import Any, Iterator

from executor import License, Resources, StepContext, VoyageError, run_only, step_type
from steps.data.formats import DOCS_FORMAT, DocumentWriter, expand, join, open_lines, url_fs
from steps.data.provenance import LICENSES_KEY, source_licenses, to_manifest
from steps.data.budget import ingest_task_gb
from steps.data.shard_io import Shard, commit_manifest, is_transient, map_shards

REJECT_SNIPPET = 2000  # bytes of a bad record kept in the rejects file
EXAMPLE_SNIPPET = 200  # characters of the example reject named when the step fails


class TooManyRejects(Exception):
    """More of a source's records were rejected than its config allows (or all of them)."""


@dataclass(frozen=True)
class IngestConfig:
    """Where the raw documents are and how to read them."""

    input: str | tuple[str, ...]  # URLs, globs or folders
    text_field: str = "text"
    id_field: str | None = "id"  # None: ids are "FILE:LINE"
    keep_metadata: bool = True  # other fields go under "metadata"
    max_docs_per_shard: int = 100_000
    # The source's licence (None: not declared, recorded as NOASSERTION, which no licence policy
    # allows unless it names it). Identity: the licence is part of what this output is.
    license: License | None = None
    files_per_task: int = run_only(default=1)
    # Where relative local inputs are read from (default: the working directory). Run-only, so a
    # repository-relative input names the same step from any checkout and any working directory.
    root: str = run_only(default="")
    # The step fails when more than this share of the records is rejected. Run-only: it decides
    # whether an output is accepted, never what it holds, so raising it after a failure retries
    # in the same folder (and a resumed ingest redoes no file).
    max_reject_share: float = run_only(default=0.01)
    # Input files that keep failing (a store error past its retries, any other error) may be left
    # out, named in the record, while they are at most this share of all (steps/data/shard_io.py).
    max_quarantine_share: float = run_only(default=0.001)

    def __post_init__(self) -> None:
        for name in ("max_reject_share", "max_quarantine_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise VoyageError(f"ingest: {name} must be between 0 and 1, got {getattr(self, name)}")


@step_type(version="2", resumable=True)
def ingest(config: IngestConfig, ctx: StepContext) -> None:
    """Normalize raw JSONL/Parquet documents into JSONL shards, counting and keeping rejects."""
    files = expand(_rooted(config.input, config.root))
    if not files:
        raise FileNotFoundError(f"ingest: no input files match {config.input!r}")
    names = [_as_given(url, config.root) for url in files]
    finished, quarantined = map_shards(
        ctx, "ingest", functools.partial(_ingester, ctx.output, config),
        [Shard(i, url, names[i]) for i, url in enumerate(files)], config.files_per_task,
        _task_resources(ctx), config.max_quarantine_share)

    shards, rejects, documents, example = [], collections.Counter(), 0, None
    for i in sorted(finished):
        ledger_i = finished[i]
        shards += ledger_i["shards"]
        rejects.update(ledger_i["rejects"])
        documents += ledger_i["documents"]
        example = example or ledger_i.get("example")
    check_rejects(documents, rejects, example, config)
    licenses = source_licenses(ctx, config.license)
    manifest = {"format": DOCS_FORMAT, "documents": documents, "shards": shards,
                "rejects": dict(sorted(rejects.items())), "sources": names, LICENSES_KEY: to_manifest(licenses)}
    commit_manifest(ctx, manifest, quarantined, documents=documents, input_files=len(files), shards=len(shards),
                    rejects=dict(sorted(rejects.items())), rejected=sum(rejects.values()))


def _task_resources(ctx: StepContext) -> Resources:
    """A task asks for the step's own CPUs and memory (the data plan sizes them), or, when the
    voyage gives no memory, the plan's figure for an ingest task: without a memory request Ray
    packs tasks by CPU alone and the kernel's OOM killer decides."""
    return Resources(cpus=ctx.resources.cpus, memory_gb=ctx.resources.memory_gb or ingest_task_gb())


def _ingester(output: str, config: IngestConfig):
    """The per-shard function of an ingest task: one input file into its shards and rejects."""
    return lambda shard: _ingest_one(output, shard.index, shard.url, config, shard.name)


def check_rejects(documents: int, rejects: collections.Counter, example: dict[str, Any] | None,
                  config: IngestConfig) -> None:
    """Raise TooManyRejects, naming the reasons and one example, if more than
    `config.max_reject_share` of the records were rejected or no document is left."""
    rejected = sum(rejects.values())
    total = documents + rejected
    if documents and rejected <= config.max_reject_share * total:
        return
    if not total:
        raise TooManyRejects(f"ingest: no records in {config.input!r}")
    reasons = ", ".join(f"{reason} {n}" for reason, n in rejects.most_common())
    why = (f"more than max_reject_share {config.max_reject_share:g}" if rejected > config.max_reject_share * total
           else "no document left")
    text = f"ingest: {rejected} of {total} records rejected ({100 * rejected / total:.1f}%, {why}): {reasons}"
    if example:
        text += (f"; e.g. {posixpath.basename(example['source'])} line {example['line']} ({example['reason']}): "
                 f"{example['record']}")
        if example.get("fields") is not None and example["reason"] == "no_text":
            text += f" (fields {', '.join(example['fields'])}; text_field is {config.text_field!r})"
    raise TooManyRejects(text)


def _ingest_one(output: str, index: int, url: str, config: IngestConfig, name: str | None = None) -> dict:
    name = name or url
    rejects: collections.Counter = collections.Counter()
    shards: list[dict[str, Any]] = []
    writer: DocumentWriter | None = None
    reject_writer = DocumentWriter(join(output, f"rejects/{index:05d}.jsonl.zst"))
    stem = posixpath.basename(url_fs(url)[1])
    example: dict[str, Any] | None = None
    try:
        for line_no, record, reason, raw in _records(url):
            doc = None if reason else _normalize(record, config, stem, line_no)
            if isinstance(doc, str):
                reason, doc = doc, None
            if doc is None:
                rejects[reason] += 1
                reject_writer.write({"source": name, "line": line_no, "reason": reason,
                                     "record": raw[:REJECT_SNIPPET].decode("utf-8", "replace")})
                if example is None:
                    example = {"source": name, "line": line_no, "reason": reason,
                               "record": raw.decode("utf-8", "replace")[:EXAMPLE_SNIPPET],
                               "fields": sorted(map(str, record)) if isinstance(record, dict) else None}
                continue
            if writer is None or writer.count >= config.max_docs_per_shard:
                if writer is not None:
                    writer.close()
                    shards.append({"path": _rel(writer.url, output), "documents": writer.count})
                writer = DocumentWriter(join(output, f"documents/{index:05d}-{len(shards):04d}.jsonl.zst"))
            try:
                writer.write(doc)
            except UnicodeEncodeError:  # e.g. a lone surrogate inside metadata
                rejects["invalid_utf8"] += 1
                reject_writer.write({"source": name, "line": line_no, "reason": "invalid_utf8",
                                     "record": raw[:REJECT_SNIPPET].decode("utf-8", "replace")})
    except BaseException:
        if writer is not None:
            writer.close(ok=False)
        reject_writer.close(ok=False)
        raise
    if writer is not None:
        writer.close()
        shards.append({"path": _rel(writer.url, output), "documents": writer.count})
    reject_writer.close()
    return {"source": name, "shards": shards, "documents": sum(s["documents"] for s in shards),
            "rejects": dict(rejects), "example": example}


def _rooted(spec: str | tuple[str, ...], root: str) -> str | tuple[str, ...]:
    """`spec` with its relative local paths read from `root` (when one is given)."""
    def one(url: str) -> str:
        return url if not root or "://" in url or posixpath.isabs(url) else join(root, url)

    return one(spec) if isinstance(spec, str) else tuple(one(u) for u in spec)


def _as_given(url: str, root: str) -> str:
    """An input file as the config names it: relative to `root` if it was read from there."""
    base = root.rstrip("/")
    return url[len(base) + 1:] if base and url.startswith(base + "/") else url


def _rel(url: str, root: str) -> str:
    return url[len(root.rstrip("/")) + 1:]


def _records(url: str) -> Iterator[tuple[int, Any, str | None, bytes]]:
    """(line number, parsed record or None, reject reason or None, raw bytes) per record."""
    path = url_fs(url)[1]
    line_no = 0
    try:
        if path.endswith(".parquet"):
            yield from _parquet_records(url)
            return
        for line_no, line in enumerate(open_lines(url), start=1):
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                yield line_no, None, "invalid_utf8", line
                continue
            try:
                yield line_no, json.loads(text), None, line
            except ValueError:
                yield line_no, None, "invalid_json", line
    except (OSError, EOFError, ValueError) as e:  # a truncated or corrupt stream: keep what was read
        if is_transient(e):  # the store, not the file: retried (shard_io), never kept as a short file
            raise
        yield line_no + 1, None, "corrupt_file", f"{type(e).__name__}: {e}".encode()


def _parquet_records(url: str) -> Iterator[tuple[int, Any, str | None, bytes]]:
    import pyarrow.parquet as pq

    fs, path = url_fs(url)
    row = 0
    with fs.open(path, "rb") as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                row += 1
                yield row, record, None, repr(record).encode("utf-8", "replace")


def _normalize(record: Any, config: IngestConfig, stem: str, line_no: int) -> dict | str:
    """The normalized document, or the reason it is rejected."""
    if not isinstance(record, dict):
        return "not_an_object"
    text = record.get(config.text_field)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return "invalid_utf8"
    if not isinstance(text, str):
        return "no_text"
    if not text.strip():
        return "empty_text"
    try:
        text.encode("utf-8")  # lone surrogates from "\udXXX" escapes are not valid UTF-8
    except UnicodeEncodeError:
        return "invalid_utf8"
    doc_id = record.get(config.id_field) if config.id_field else None
    doc: dict[str, Any] = {"id": str(doc_id) if doc_id is not None else f"{stem}:{line_no}", "text": text}
    if config.keep_metadata:
        meta = {k: v for k, v in record.items() if k not in (config.text_field, config.id_field)}
        if meta:
            doc["metadata"] = _jsonable(meta)
    return doc


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))
