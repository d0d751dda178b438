"""train_tokenizer: a byte-level BPE trained with HF `tokenizers`; pin_tokenizer; `load_tokenizer`.

A tokenizer is named by a string everywhere in the data steps: a `tokenizer.json` URL, a folder
(URL) holding one (such as this step's output), or a hub name (which needs the network).
"""

from __future__ import annotations

import functools
import itertools
import posixpath
from dataclasses import dataclass
from typing import Iterator

from executor import InputPath, License, StepContext, VoyageError, step_type
from steps.data.formats import document_shards, iter_text_batches, url_fs

DEFAULT_SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")


@dataclass(frozen=True)
class TrainTokenizerConfig:
    """Train on the documents of `documents` (an ingest/dedup output folder or a glob)."""

    documents: InputPath | tuple[InputPath, ...]  # one documents folder or glob, or several
    vocab_size: int
    special_tokens: tuple[str, ...] = DEFAULT_SPECIALS
    min_frequency: int = 2
    max_documents: int | None = None  # train on the first N documents only
    max_chars_per_document: int = 100_000  # longer documents are cut for training

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + len(self.special_tokens):
            raise VoyageError(f"train_tokenizer: vocab_size {self.vocab_size} is smaller than the 256 byte "
                              f"symbols plus {len(self.special_tokens)} special tokens")


@step_type(version="1")
def train_tokenizer(config: TrainTokenizerConfig, ctx: StepContext) -> None:
    """Train a byte-level BPE tokenizer; writes `tokenizer.json`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=config.vocab_size, min_frequency=config.min_frequency,
                                  special_tokens=list(config.special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    counted = {"documents": 0, "chars": 0}

    def texts() -> Iterator[str]:
        specs = (config.documents,) if isinstance(config.documents, str) else config.documents
        for url in (u for spec in specs for u in document_shards(spec)):
            for batch in iter_text_batches(url, 1024):
                for text in batch:
                    text = text[:config.max_chars_per_document]
                    counted["documents"] += 1
                    counted["chars"] += len(text)
                    yield text

    stream = texts() if config.max_documents is None else itertools.islice(texts(), config.max_documents)
    from steps.data.provenance import folder_licenses, note_sources

    note_sources(ctx, folder_licenses(config.documents))  # what it learned its vocabulary from
    tok.train_from_iterator(stream, trainer=trainer)
    with ctx.open("tokenizer.json", "w") as f:
        f.write(tok.to_str())
    ctx.results.update(vocab_size=tok.get_vocab_size(), trained_on_documents=counted["documents"],
                       trained_on_chars=counted["chars"])


@dataclass(frozen=True)
class PinTokenizerConfig:
    """Copy a tokenizer given by URL or hub name into the prefix, so that every later step reads
    the same bytes (a hub repository can change under the same name)."""

    source: str  # a tokenizer.json URL, a folder holding one, or a hub name (needs the network)
    expect_vocab_size: int | None = None  # fail early if the tokenizer is not the one meant
    # The tokenizer's licence (a hub tokenizer comes under its model's licence): it reaches every
    # step that tokenizes with it. None: declared by no one (NOASSERTION; docs/provenance.md).
    license: License | None = None


@step_type(version="1")
def pin_tokenizer(config: PinTokenizerConfig, ctx: StepContext) -> None:
    """Fetch a tokenizer once and keep it as `tokenizer.json` in this step's output."""
    tok = load_tokenizer(config.source)
    size = tok.get_vocab_size()
    if config.expect_vocab_size is not None and size != config.expect_vocab_size:
        raise VoyageError(f"pin_tokenizer: {config.source} has {size} tokens, expected {config.expect_vocab_size}")
    with ctx.open("tokenizer.json", "w") as f:
        f.write(tok.to_str())
    ctx.results.update(vocab_size=size, source=config.source)


@functools.lru_cache(maxsize=8)
def load_tokenizer(spec: str):  # -> tokenizers.Tokenizer
    """A tokenizer from a `tokenizer.json` URL, a folder URL holding one, or a hub name."""
    from tokenizers import Tokenizer

    fs, path = url_fs(spec)
    for candidate in (path, posixpath.join(path, "tokenizer.json")):
        if candidate.endswith(".json") and fs.isfile(candidate):
            with fs.open(candidate, "r") as f:
                return Tokenizer.from_str(f.read())
    if "://" in spec or spec.startswith(("/", ".")):
        raise FileNotFoundError(f"no tokenizer.json at {spec}")
    return Tokenizer.from_pretrained(spec)


def special_id(tok, token: str | None, role: str) -> int | None:
    """The id of a special token named in a config, or an error naming it."""
    if token is None:
        return None
    tid = tok.token_to_id(token)
    if tid is None:
        raise VoyageError(f"tokenize: {role} token {token!r} is not in the tokenizer's vocabulary")
    return tid
