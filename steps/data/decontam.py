"""decontaminate: remove (or mark) training documents that share an n-gram with an eval set.

GPT-3's rule, as Dolma and OLMo apply it: a training document that shares one normalised 13-gram
with any text of an eval set the voyage reports is contaminated for that set, and is removed
(`mode="remove"`) or kept with `metadata.contamination = [SETS]` (`mode="mark"`, to measure first).

Normalisation (`normalize`, then `words`), the same on the training and the eval side, in order:
1. HTML tags go: `<name ...>`, `</name>`, `<name/>` (a `<` directly followed by a letter or `/`
   and a letter, up to the next `>`) and comments `<!-- ... -->` each become a space, so
   `<em>`, `<br/>` or `<a href=...>` inside a span do not hide it (`x < y`, with a space, is
   not a tag);
2. HTML entities are decoded (`html.unescape`: `&amp;`, `&nbsp;`, `&eacute;`, `&#233;`), so an
   entity is the character it names;
3. Unicode NFC (canonical composition: `e` + U+0301 is `é`, as most text writes it);
4. lower-cased; with `fold_unicode` (a config option, off by default, part of identity)
   instead case-folded, then NFKD with the combining marks dropped (`café` is `cafe`, `ß` is `ss`,
   `ﬁ` is `fi`);
5. words are the runs of letters and digits (any script; `_` is no letter); everything else (punctuation,
   markdown's `*`, `#`, `_`, `[`, whitespace, what is left of the markup) only separates words.
An n-gram is n consecutive words, hashed
to 64 bits (each word by a mixed polynomial over its bytes, the window by a polynomial over the
word hashes, uint64 arithmetic wrapping on purpose; `NgramHasher`): at 1e10 training n-grams against 1e8 eval n-grams a false match
by collision is ~5e-2 expected in the whole corpus, against real matches in the thousands.
Not normalised: spelling, word order, numbers written out, text inside `<script>`/`<style>`
(kept as words), Markdown link targets (their URL's words stay words).

An eval text shorter than n words has no n-gram: it is counted (`too_short` in the record),
never silently matched by something shorter.

Passes and memory:
1. The eval side, in the step's own process: every eval set's texts (a documents folder or JSONL
   glob, or an lm-eval task's documents as the harness sees them: its prompt and its target)
   become one sorted array of n-gram hashes with, for each, a bit mask of the sets that hold it
   (16 bytes an n-gram: a million-n-gram eval suite is 16 MB), written to `evals.npz`.
2. The training side, one Ray task per `shards_per_task` shards: each loads `evals.npz` once and
   streams its shards `BATCH` documents at a time (memory: the eval arrays and one batch), looks
   the batch's n-grams up by one binary search, and writes `documents/IIIII.jsonl.zst` (shard i from
   input shard i, order kept, as dedup writes it) and its ledger. Store I/O, retries and
   quarantine as every per-shard step (`steps.data.shard_io`).
3. The step: `contaminated.jsonl`, one line per contaminated document (`shard`, `position` in
   the input shard, `id`, `matches`: the sets), which `--which-saw` reads; counts per source and
   eval set in the record (`removed`: {source: {set: documents}}) and the manifest, which the
   model card reports.
"""

from __future__ import annotations

import collections
import functools
import html
import io
import json
import posixpath
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from executor import InputPath, Resources, StepContext, VoyageError, run_only, step_type
from steps.data.formats import DOCS_FORMAT, DocumentWriter, document_shards, expand, iter_documents, \
    join, url_fs, write_bytes
from steps.data.provenance import LICENSES_KEY, folder_licenses, note_sources, to_manifest
from steps.data.memory import GiB, checked
from steps.data.budget import decontam_task_gb, ingest_task_gb
from steps.data.shard_io import Shard, commit_manifest, map_shards, retry

MODES = ("remove", "mark")
CONTAMINATED = "contaminated.jsonl"
EVALS = "evals.npz"
MAX_SETS = 64  # one bit each in a uint64 mask
BATCH = 256  # documents hashed and looked up together (numpy over the batch; memory: the batch)
# what building the index holds an eval n-gram (repeats included) at its peak: the set's hashes
# and their sort, then every set's unique hashes with their masks, joined, ordered and reduced
# (measured 98 B at 9.5M n-grams, bench/data_decontam.py --sizes, docs/benchmarks.md; 15% more)
BUILD_BYTES_PER_NGRAM = 112
LM_EVAL_GB = 1.0  # lm-eval's task index and a task's datasets, when an eval set is an lm-eval task
_PRIME = np.uint64(0x100000001B3)  # FNV's 64-bit prime: odd, so invertible mod 2^64
_PRIME_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_WORD = re.compile(r"[^\W_]+")
_SEPARATORS = re.compile(r"[\W_]+")  # what is not a word: words() and the hasher agree
# an HTML tag (a letter, or / and a letter, right after "<"; attributes up to the next ">") or comment
_TAG = re.compile(r"<!--.*?-->|</?[A-Za-z][^<>]*>", re.S)


@dataclass(frozen=True)
class EvalSet:
    """One eval set whose text training must not hold: `documents` (a documents folder, or URLs /
    a glob of JSONL with a `text` field), or `task`, an lm-eval-harness task (its test, else
    validation, else train documents: prompt and target, as the harness builds them), found in
    `include_path` (a folder of task YAMLs, relative to the step's `root`) or lm-eval's own."""

    name: str
    documents: InputPath | None = None
    task: str | None = None
    include_path: str | None = None

    def __post_init__(self) -> None:
        if (self.documents is None) == (self.task is None):
            raise VoyageError(f"decontaminate: eval set {self.name!r} needs exactly one of documents= or task=")


@dataclass(frozen=True)
class DecontamConfig:
    """Which training documents to check against which eval sets, and what to do with a match."""

    documents: InputPath  # a documents folder (dedup or ingest output) or a glob of shards
    evals: tuple[EvalSet, ...]
    ngram: int = 13
    fold_unicode: bool = False  # NFKD, combining marks dropped, case-folded (`normalize`): accents do not hide a match
    mode: str = "remove"  # "remove", or "mark": keep them, listing the sets under metadata.contamination
    shards_per_task: int = run_only(default=1)
    root: str = run_only(default="")  # where relative eval paths are read from (default: the working directory)
    max_quarantine_share: float = run_only(default=0.001)
    task_memory_gb: float = run_only(default=0.0)  # declared to Ray a task; 0: the step's own memory

    def __post_init__(self) -> None:
        if not self.evals:
            raise VoyageError("decontaminate: evals names no eval set")
        names = [e.name for e in self.evals]
        if len(set(names)) != len(names):
            raise VoyageError(f"decontaminate: eval set names repeat: {sorted(names)}")
        if len(names) > MAX_SETS:
            raise VoyageError(f"decontaminate: at most {MAX_SETS} eval sets, got {len(names)}")
        if self.mode not in MODES:
            raise VoyageError(f"decontaminate: mode must be one of {MODES}, got {self.mode!r}")
        if self.ngram < 1:
            raise VoyageError(f"decontaminate: ngram must be positive, got {self.ngram}")


# -- n-grams ----------------------------------------------------------------------------------

def normalize(text: str, fold_unicode: bool = False) -> str:
    """`text` as matching sees it (the module's doc, steps 1-4): HTML tags and comments become
    spaces, entities are decoded, NFC, lower-cased; with `fold_unicode`, case-folded, then NFKD
    without combining marks."""
    if "<" in text:
        text = _TAG.sub(" ", text)
    if "&" in text:
        text = html.unescape(text)
    if text.isascii():
        return text.lower()
    if fold_unicode:
        return "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", text).lower()


def words(text: str, fold_unicode: bool = False) -> list[str]:
    """The normalised words of `text` (`normalize`, then the runs of letters and digits)."""
    return _WORD.findall(normalize(text, fold_unicode))


class NgramHasher:
    """64-bit hashes of the n-grams of texts, a batch of texts at a time, in numpy over the batch's
    bytes (no Python work per word): each word is a polynomial hash of its UTF-8 bytes, computed
    for all words at once from prefix sums (`h[s:e] = P^(e-1) * (S[e-1] - S[s-1])` with `S` the
    prefix sum of `b_j * P^-j`: P is odd, so invertible mod 2^64), then mixed (splitmix64's
    finalizer) so that its low bits are as good as its high ones."""

    def __init__(self, n: int, fold_unicode: bool = False) -> None:
        self.n = n
        self.fold_unicode = fold_unicode
        self._pow = np.ones(1, dtype=np.uint64)  # P^i
        self._inv = np.ones(1, dtype=np.uint64)  # P^-i

    def _powers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if self._pow.size < size:
            grown = max(size, 2 * self._pow.size)
            one = np.ones(1, dtype=np.uint64)  # not a Python 1: int64 with uint64 would promote to float64
            self._pow = np.concatenate((one, np.cumprod(np.full(grown - 1, _PRIME, dtype=np.uint64), dtype=np.uint64)))
            self._inv = np.concatenate((one, np.cumprod(np.full(grown - 1, _PRIME_INV, dtype=np.uint64), dtype=np.uint64)))
        return self._pow[:size], self._inv[:size]

    def word_hashes(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the hash of every normalised word of the batch, in order; the text each is in)."""
        encoded = [_SEPARATORS.sub(" ", normalize(t, self.fold_unicode)).strip(" ").encode() for t in texts]
        buf = np.frombuffer(b" ".join(encoded), dtype=np.uint8)
        if not buf.size:
            return np.empty(0, np.uint64), np.empty(0, np.int64)
        space = buf == 32
        word = ~space
        first = np.flatnonzero(word & np.concatenate(([True], space[:-1])))
        last = np.flatnonzero(word & np.concatenate((space[1:], [True])))  # each word's last byte
        pw, inv = self._powers(buf.size)
        prefix = np.cumsum(buf.astype(np.uint64) * inv, dtype=np.uint64)
        before = np.where(first > 0, prefix[np.maximum(first - 1, 0)], np.uint64(0))
        h = pw[last] * (prefix[last] - before) + (last - first + 1).astype(np.uint64)
        starts = np.cumsum(np.array([0] + [len(e) + 1 for e in encoded[:-1]], dtype=np.int64))
        owner = np.searchsorted(starts, first, side="right") - 1
        return _mix(h), owner

    def batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hashes of every n-gram of every text, the index of the text each belongs to); a text
        of fewer than n words has none."""
        flat, words_owner = self.word_hashes(texts)
        count = flat.size - self.n + 1
        if count <= 0:
            return np.empty(0, np.uint64), np.empty(0, np.int64)
        h = np.zeros(count, dtype=np.uint64)
        for i in range(self.n):  # uint64 arrays wrap silently: the polynomial is mod 2^64
            h = h * _PRIME + flat[i:i + count]
        inside = words_owner[:count] == words_owner[self.n - 1:]  # the window starts and ends in one text
        return h[inside], words_owner[:count][inside]

    def ngrams(self, text: str) -> np.ndarray:
        """The hashes of every n-gram of `text` (empty if it has fewer than n words)."""
        return self.batch([text])[0]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, over an array."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@dataclass
class EvalIndex:
    """Sorted n-gram hashes of all eval sets, each with the mask of the sets that hold it."""

    names: list[str]
    hashes: np.ndarray  # uint64, sorted, unique
    masks: np.ndarray  # uint64, bit k: set names[k] holds the n-gram

    def masks_of(self, grams: np.ndarray, owner: np.ndarray, count: int) -> np.ndarray:
        """Per text of a batch (`owner` of each n-gram, `count` texts): the mask of the sets it
        shares an n-gram with (0: none)."""
        out = np.zeros(count, dtype=np.uint64)
        if not grams.size or not self.hashes.size:
            return out
        at = np.searchsorted(self.hashes, grams)
        at[at == self.hashes.size] = 0
        hit = self.hashes[at] == grams
        if hit.any():
            np.bitwise_or.at(out, owner[hit], self.masks[at[hit]])
        return out

    def names_of(self, mask: int) -> list[str]:
        return [name for k, name in enumerate(self.names) if int(mask) >> k & 1]

    def matches(self, grams: np.ndarray) -> list[str]:
        """The sets sharing any of `grams`, in the order of `names`."""
        return self.names_of(int(self.masks_of(grams, np.zeros(grams.size, np.int64), 1)[0]))

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, hashes=self.hashes, masks=self.masks, names=np.array(self.names, dtype=str))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "EvalIndex":
        z = np.load(io.BytesIO(data))
        return cls([str(n) for n in z["names"]], z["hashes"], z["masks"])


def build_index(sets: dict[str, Iterable[str]], n: int,
                fold_unicode: bool = False) -> tuple[EvalIndex, dict[str, dict[str, int]]]:
    """The index of eval sets given as {name: texts}, and per set: texts, n-grams, too_short."""
    hasher = NgramHasher(n, fold_unicode)
    parts, masks, stats = [], [], {}
    for k, (name, texts) in enumerate(sets.items()):
        grams, count, short = [], 0, 0
        for chunk in _chunks(texts, BATCH):
            g, owner = hasher.batch(chunk)
            count += len(chunk)
            short += len(chunk) - np.unique(owner).size
            grams.append(g)
        uniq = np.unique(np.concatenate(grams)) if grams else np.empty(0, np.uint64)
        parts.append(uniq)
        masks.append(np.full(uniq.size, np.uint64(1) << np.uint64(k), dtype=np.uint64))
        stats[name] = {"texts": count, "ngrams": int(uniq.size), "too_short": short}
    allh = np.concatenate(parts) if parts else np.empty(0, np.uint64)
    allm = np.concatenate(masks) if masks else np.empty(0, np.uint64)
    order = np.argsort(allh, kind="stable")
    allh, allm = allh[order], allm[order]
    hashes, first = np.unique(allh, return_index=True)
    merged = np.bitwise_or.reduceat(allm, first) if allm.size else allm
    return EvalIndex(list(sets), hashes, merged.astype(np.uint64)), stats


# -- eval texts -------------------------------------------------------------------------------

def eval_texts(spec: EvalSet, root: str = "") -> Iterator[str]:
    """The texts of one eval set (see `EvalSet`)."""
    if spec.documents is not None:
        src = _rooted(spec.documents, root)
        fs, path = url_fs(src)
        shards = document_shards(src) if fs.isdir(path) else expand(src, suffixes=(".jsonl", ".jsonl.gz", ".jsonl.zst"))
        for url in shards:
            for doc in iter_documents(url):
                yield str(doc["text"])
        return
    yield from task_texts(spec.task, _rooted(spec.include_path, root) if spec.include_path else None)


def task_texts(task: str, include_path: str | None) -> Iterator[str]:
    """An lm-eval task's documents as the harness shows them to a model: the prompt, then the
    target (for a multiple-choice task, the right choice, and the other choices as texts of their
    own: a model that memorised the options is contaminated too)."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=include_path is None)
    found = manager.load_task_or_group([task])
    objs = list(_leaves(found))
    if not objs:
        raise VoyageError(f"decontaminate: lm-eval has no task {task!r}" + (f" in {include_path}" if include_path else ""))
    for t in objs:
        docs = (t.test_docs() if t.has_test_docs() else t.validation_docs() if t.has_validation_docs()
                else t.training_docs())
        for doc in docs or ():
            prompt = t.doc_to_text(doc)
            target = t.doc_to_target(doc)
            choices = t.doc_to_choice(doc) if getattr(t.config, "doc_to_choice", None) else None
            if isinstance(target, int) and choices:
                yield f"{prompt} {choices[target]}"
                yield from (str(c) for k, c in enumerate(choices) if k != target)
            else:
                yield f"{prompt} {target if isinstance(target, str) else ''}".strip()


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _leaves(found: Any) -> Iterator[Any]:
    for value in (found.values() if isinstance(found, dict) else [found]):
        if isinstance(value, dict):
            yield from _leaves(value)
        else:
            yield value


def _rooted(url: str, root: str) -> str:
    return url if not root or "://" in url or posixpath.isabs(url) else join(root, url)


# -- the step ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _IndexJob:
    output: str
    evals: tuple[EvalSet, ...]
    root: str
    ngram: int
    fold_unicode: bool


def _count_ngrams(job: _IndexJob) -> int:
    """The eval side's n-grams, repeats included (what building the index holds at most): a
    stream over the eval texts, nothing kept."""
    hasher = NgramHasher(job.ngram, job.fold_unicode)
    total = 0
    for spec in job.evals:
        for chunk in _chunks(eval_texts(spec, job.root), BATCH):
            total += hasher.batch(chunk)[0].size
    return total


def _build_index(job: _IndexJob) -> dict:
    """Build the eval index and write it (`evals.npz`); its n-grams and per-set stats."""
    index, stats = build_index({e.name: eval_texts(e, job.root) for e in job.evals}, job.ngram, job.fold_unicode)
    retry(write_bytes, join(job.output, EVALS), index.to_bytes(), what="write the eval index")
    return {"ngrams": int(index.hashes.size), "stats": stats}


def _reader_gb(evals: tuple[EvalSet, ...]) -> float:
    """What reading the eval side holds: a batch of texts, and lm-eval's task index and
    datasets when a set is an lm-eval task."""
    return ingest_task_gb() + (LM_EVAL_GB if any(e.task for e in evals) else 0.0)


def build_gb(ngrams: int, evals: tuple[EvalSet, ...] = ()) -> float:
    """What the index build declares for an eval side of `ngrams` n-grams (repeats included)."""
    return round(_reader_gb(evals) + ngrams * BUILD_BYTES_PER_NGRAM / GiB, 3)


@step_type(version="2", resumable=True)  # 2: HTML tags and entities, NFC (`normalize`)
def decontaminate(config: DecontamConfig, ctx: StepContext) -> None:
    """Remove (or mark) the training documents that share a normalised n-gram with an eval set;
    a documents folder like dedup's, `contaminated.jsonl`, and counts per source and set."""
    inputs = document_shards(config.documents)
    if not inputs:
        raise FileNotFoundError(f"decontaminate: no document shards in {config.documents!r}")
    # The eval index is built in tasks, not here: one streams the eval side and counts its
    # n-grams (no memory to speak of), so that the one that builds it declares what it holds.
    job = _IndexJob(ctx.output, config.evals, config.root, config.ngram, config.fold_unicode)
    small = Resources(cpus=1, memory_gb=_reader_gb(config.evals))
    [count] = ctx.map(checked(_count_ngrams, ctx.name, "eval count", small.memory_gb), [job], resources=small)
    build = Resources(cpus=1, memory_gb=build_gb(count, config.evals))
    [built] = ctx.map(checked(_build_index, ctx.name, "eval index", build.memory_gb), [job], resources=build)
    stats = built["stats"]
    ctx.logger.info("decontaminate: %d eval n-grams from %s", built["ngrams"],
                    ", ".join(f"{k} ({v['texts']} texts)" for k, v in stats.items()))

    # a task holds the eval arrays (twice while loading) and one batch of documents
    memory = config.task_memory_gb or ctx.resources.memory_gb or decontam_task_gb(built["ngrams"])
    finished, quarantined = map_shards(
        ctx, "decontaminate", functools.partial(_decontaminator, ctx.output, config.ngram, config.mode,
                                                config.fold_unicode),
        [Shard(i, url, url) for i, url in enumerate(inputs)], config.shards_per_task,
        Resources(cpus=1, memory_gb=memory), config.max_quarantine_share)

    licenses = folder_licenses(config.documents)
    source = "+".join(sorted(licenses)) or "documents"  # the source step(s) these documents come from
    names = [e.name for e in config.evals]
    by_set: collections.Counter = collections.Counter()
    lines, shards, kept, seen = [], [], 0, 0
    for i in sorted(finished):
        entry = finished[i]
        shards.append({"path": f"documents/{i:05d}.jsonl.zst", "documents": entry["kept"]})
        kept += entry["kept"]
        seen += entry["documents"]
        for position, doc_id, sets in entry["contaminated"]:
            by_set.update(sets)
            lines.append(json.dumps({"shard": i, "position": position, "id": doc_id, "matches": sets},
                                    ensure_ascii=False))
    retry(write_bytes, ctx.path(CONTAMINATED), "".join(line + "\n" for line in lines).encode(),
          what=f"write {CONTAMINATED}")
    removed = {source: {name: int(by_set[name]) for name in names}}
    note_sources(ctx, licenses)
    manifest = {"format": DOCS_FORMAT, "documents": kept, "shards": shards, LICENSES_KEY: to_manifest(licenses),
                "decontamination": {"mode": config.mode, "ngram": config.ngram, "contaminated": len(lines),
                                    "by_source": removed, "evals": stats}}
    commit_manifest(ctx, manifest, quarantined, documents=seen, kept=kept, contaminated=len(lines), mode=config.mode,
                    ngram=config.ngram, removed=removed if config.mode == "remove" else {},
                    marked=removed if config.mode == "mark" else {}, evals=stats)


def _decontaminator(output: str, ngram: int, mode: str, fold_unicode: bool = False):
    """The per-shard function of a decontaminate task (the eval index loaded once a task): the
    shard's kept (or marked) documents, in order, and its ledger."""
    index = EvalIndex.from_bytes(retry(_read_bytes, join(output, EVALS), what="read the eval index"))
    hasher = NgramHasher(ngram, fold_unicode)

    def one(shard: Shard) -> dict:
        contaminated, count, kept = [], 0, 0
        with DocumentWriter(join(output, f"documents/{shard.index:05d}.jsonl.zst")) as writer:
            for docs in _chunks(iter_documents(shard.url), BATCH):
                grams, owner = hasher.batch([d["text"] for d in docs])
                masks = index.masks_of(grams, owner, len(docs))
                for k, doc in enumerate(docs):
                    if masks[k]:
                        sets = index.names_of(masks[k])
                        contaminated.append([count + k, doc.get("id"), sets])
                        if mode == "remove":
                            continue
                        doc = dict(doc, metadata=dict(doc.get("metadata") or {}, contamination=sets))
                    writer.write(doc)
                    kept += 1
                count += len(docs)
        return {"documents": count, "kept": kept, "contaminated": contaminated}

    return one


def _read_bytes(url: str) -> bytes:
    fs, path = url_fs(url)
    return fs.cat_file(path)


def read_contaminated(url: str) -> list[dict[str, Any]]:
    """The contaminated documents a decontaminate output lists (`contaminated.jsonl`)."""
    fs, path = url_fs(join(url, CONTAMINATED))
    with fs.open(path, "rb") as f:
        return [json.loads(line) for line in f if line.strip()]


