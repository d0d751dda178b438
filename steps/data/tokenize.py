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
its own folder when they are in the same prefix (`steps.data.paths`): the same bytes under any
prefix, and a copied prefix reads its own copy.
"""

from __future__ import annotations

import functools
import itertools
import os
import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from executor import InputPath, Resources, StepContext, VoyageError, run_only, step_type
from steps.data.formats import TOKENS_FORMAT, TokenShardWriter, document_shards, iter_text_batches, join, token_dtype
from steps.data.provenance import LICENSES_KEY, folder_licenses, note_sources, to_manifest
from steps.data.paths import ref
from steps.data.budget import tokenize_task_gb
from steps.data.shard_io import Shard, commit_manifest, map_shards
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
    ctx.logger.info("tokenize: %d encoder threads per task", threads)
    # each task asks for what the step asks for: its CPUs (the encoder's threads) and its memory,
    # or when the voyage gives none, the data plan's figure for a tokenize task
    resources = Resources(cpus=threads, memory_gb=ctx.resources.memory_gb or tokenize_task_gb(config.batch_docs))
    finished, quarantined = map_shards(
        ctx, "tokenize", functools.partial(_tokenizer, ctx.output, config, threads),
        [Shard(i, url, url, meta=ref(ctx, url, ctx.path("ledger"))) for i, url in enumerate(inputs)],
        config.shards_per_task, resources,
        config.max_quarantine_share)

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
    commit_manifest(ctx, manifest, [dict(q, shard=ref(ctx, inputs[q["index"]])) for q in quarantined],
                    tokens=tokens, documents=documents, shards=len(shards), dtype=token_dtype(vocab).name)


def set_threads(threads: int) -> None:
    """Fix the encoder's thread pool size; only effective before the first encode in a process."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


def _tokenizer(output: str, config: TokenizeConfig, threads: int):
    """The per-shard function of a tokenize task (the tokenizer loaded once a task)."""
    set_threads(threads)
    tok = load_tokenizer(config.tokenizer)
    bos, eos = special_id(tok, config.bos, "bos"), special_id(tok, config.eos, "eos")
    dtype = token_dtype(tok.get_vocab_size(with_added_tokens=True))

    def one(shard: Shard) -> dict:
        with TokenShardWriter(join(output, "shards"), f"{shard.index:05d}", dtype) as writer:
            for flat, lengths in encode_batches(tok, prefetch(iter_text_batches(shard.url, config.batch_docs)), bos,
                                                eos, dtype):
                writer.write(flat, lengths)
        return {"source": shard.meta, "tokens": writer.tokens, "documents": writer.documents}

    return one


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
