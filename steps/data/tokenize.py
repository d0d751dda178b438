"""tokenize: document shards into token shards (see `steps.data.formats`).

Input shard `i` (in the order of the input's manifest, or sorted glob order) becomes output
shard `shards/IIIII.{tokens,offsets}`; shards are grouped `shards_per_task` to a Ray task, which
changes nothing in the output. Within a shard, documents are read, encoded and written in
batches of `batch_docs`: a reader thread parses the next batch while `encode_batch_fast` (which
releases the GIL and uses RAYON_NUM_THREADS threads) encodes this one, so memory holds about
two batches whatever the corpus size.

BOS and EOS are explicit: `bos`/`eos` name the tokens to put before/after every document, or
None for none; the tokenizer's own post-processor is never applied.

Resumable per shard: a shard is done once `ledger/IIIII.json` exists, written after both of its
files were renamed into place. The step lists the ledger folder once, retries transient store
errors, and may leave out (quarantine) shards that keep failing, up to `max_quarantine_share`,
naming them in the manifest and the record (`steps.data.shard_io`).

The manifest names the tokenizer and each shard's source, and each ledger its source, relative to
its own folder when they are in the same prefix (`steps.data.refs`): the same bytes under any
prefix, and a copied prefix reads its own copy.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from executor import InputPath, Resources, StepContext, VoyageError, run_only, step_type
from steps.data.formats import MANIFEST, TOKENS_FORMAT, TokenShardWriter, document_shards, iter_text_batches, join, \
    token_dtype, write_json
from steps.data.provenance import LICENSES_KEY, folder_licenses, note_sources, to_manifest
from steps.data.refs import ref
from steps.data.shard_io import Ledger, ShardOutcome, ledgers, retry, run_shards, settle
from steps.data.tokenizer import load_tokenizer, special_id


@dataclass(frozen=True)
class TokenizeConfig:
    """What to tokenize with what; `bos`/`eos` are token strings or None (required: no default)."""

    documents: InputPath  # a documents folder (ingest/dedup output), a shard URL or a glob
    tokenizer: InputPath  # tokenizer.json URL, a folder holding one, or a hub name
    bos: str | None
    eos: str | None
    batch_docs: int = run_only(default=1024)
    shards_per_task: int = run_only(default=1)
    threads: int = run_only(default=0)  # encoder threads per task; 0: the task's CPUs
    # Shards that keep failing may be left out (named in the record) while they are at most this
    # share of all (steps/data/shard_io.py). Run-only: it decides whether an output is accepted.
    max_quarantine_share: float = run_only(default=0.001)

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_quarantine_share <= 1.0:
            raise VoyageError(f"tokenize: max_quarantine_share must be between 0 and 1, got {self.max_quarantine_share}")


@dataclass(frozen=True)
class _Job:
    output: str
    shards: tuple[tuple[int, str, str], ...]  # (index, URL, how the ledger names it)
    tokenizer: str
    bos: str | None
    eos: str | None
    batch_docs: int
    threads: int


@step_type(version="2", resumable=True)
def tokenize(config: TokenizeConfig, ctx: StepContext) -> None:
    """Tokenize documents into uint16/uint32 token shards with int64 document offsets."""
    inputs = document_shards(config.documents)
    if not inputs:
        raise FileNotFoundError(f"tokenize: no document shards in {config.documents!r}")
    tok = load_tokenizer(config.tokenizer)
    bos_id, eos_id = special_id(tok, config.bos, "bos"), special_id(tok, config.eos, "eos")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    threads = config.threads or max(1, int(ctx.resources.cpus))
    ledger = Ledger(ctx.output)
    done = ledger.done() & set(range(len(inputs)))
    todo = [(i, url, ref(ctx, url, ctx.path("ledger"))) for i, url in enumerate(inputs) if i not in done]
    ctx.logger.info("tokenize: %d shards, %d to do, %d encoder threads per task", len(inputs), len(todo), threads)
    per = max(1, config.shards_per_task)
    jobs = [_Job(ctx.output, tuple(todo[k:k + per]), config.tokenizer, config.bos, config.eos, config.batch_docs,
                 threads) for k in range(0, len(todo), per)]
    # each task asks for what the step asks for: its CPUs (the encoder's threads) and its memory
    outcomes = [o for got in ctx.map(_tokenize_shards, jobs,
                                     resources=Resources(cpus=threads, memory_gb=ctx.resources.memory_gb))
                for o in got]
    quarantined = settle("tokenize", outcomes, len(inputs), config.max_quarantine_share)
    finished = ledgers(ledger, outcomes, done)

    shards = []
    for i, url in enumerate(inputs):
        if i in finished:
            shards.append({"name": f"{i:05d}", "tokens": finished[i]["tokens"], "documents": finished[i]["documents"],
                           "source": ref(ctx, url)})
    tokens, documents = sum(s["tokens"] for s in shards), sum(s["documents"] for s in shards)
    licenses = folder_licenses(config.documents)  # the text's licences (the tokenizer's are in the record)
    note_sources(ctx, licenses)
    manifest = {
        LICENSES_KEY: to_manifest(licenses),
        "format": TOKENS_FORMAT, "dtype": token_dtype(vocab).name, "vocab_size": vocab,
        "tokenizer": ref(ctx, config.tokenizer),
        "bos": config.bos, "eos": config.eos, "bos_id": bos_id, "eos_id": eos_id,
        "tokens": tokens, "documents": documents, "shards": shards}
    if quarantined:  # only then, so that a clean run writes the same bytes as before quarantine existed
        manifest["quarantined"] = [dict(q, shard=ref(ctx, inputs[q["index"]])) for q in quarantined]
    retry(write_json, ctx.path(MANIFEST), manifest, what="write the manifest")
    ctx.results.update(tokens=tokens, documents=documents, shards=len(shards), dtype=token_dtype(vocab).name)
    if quarantined:
        ctx.results["quarantined"] = manifest["quarantined"]


def set_threads(threads: int) -> None:
    """Fix the encoder's thread pool size; only effective before the first encode in a process."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


def _tokenize_shards(job: _Job) -> list[ShardOutcome]:
    set_threads(job.threads)
    tok = load_tokenizer(job.tokenizer)
    bos, eos = special_id(tok, job.bos, "bos"), special_id(tok, job.eos, "eos")
    dtype = token_dtype(tok.get_vocab_size(with_added_tokens=True))
    ledger = Ledger(job.output)

    def one(shard: tuple[int, str, str]) -> dict:
        index, url, source = shard
        name = f"{index:05d}"
        with TokenShardWriter(join(job.output, "shards"), name, dtype) as writer:
            for flat, lengths in encode_batches(tok, prefetch(iter_text_batches(url, job.batch_docs)), bos, eos, dtype):
                writer.write(flat, lengths)
        entry = {"source": source, "tokens": writer.tokens, "documents": writer.documents}
        ledger.write(index, entry)
        return entry

    return run_shards(one, job.shards, index_of=lambda s: s[0], name_of=lambda s: s[1])


def encode_batches(tok, batches: Iterable[list[str]], bos: int | None, eos: int | None,
                   dtype: np.dtype) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per batch of texts: all ids in one flat array (with BOS/EOS) and each document's length."""
    extra = (bos is not None) + (eos is not None)
    for texts in batches:
        encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
        body = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=dtype,
                           count=int(lengths.sum()))
        if not extra:
            yield body, lengths
            continue
        full = lengths + extra
        ends = np.cumsum(full)
        flat = np.empty(int(ends[-1]), dtype=dtype)
        starts = ends - full
        first = starts + (bos is not None)  # where each document's own ids begin
        flat[np.repeat(first - np.cumsum(lengths) + lengths, lengths) + np.arange(body.size)] = body
        if bos is not None:
            flat[starts] = bos
        if eos is not None:
            flat[ends - 1] = eos
        yield flat, full


def prefetch(items: Iterable, depth: int = 2) -> Iterator:
    """Produce `items` on a background thread, at most `depth` ahead (overlaps I/O and parsing
    with encoding, which releases the GIL)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # re-raised in the consumer
            q.put(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
