"""Which checkpoints saw this document? `marin-run V --which-saw SOURCE:DOC_ID`, from the prefix alone.

The answer follows the document down the voyage's own edges, reading only outputs under the
plan's prefix (a copied prefix answers from the copy):

1. **ingest**: the source's documents are scanned for the id (a byte search for the JSON string
   before any line is parsed); the document's global id is `shard << 32 | position`, as dedup
   counts it. An id that is not there is one error naming the source, the id and what was read.
2. **dedup**: `duplicates.npy` (every removed global id, sorted, with its keeper's) says whether
   it survived; a removed document names the document it was merged with, and what follows is
   that keeper's exposure (its text is what reached training). A kept document's position in
   its shard is its position less the removed documents before it (dedup keeps the order). A
   dedup of several sources numbers shards across them (`sources.json`: each source's first
   shard), so the keeper may be in another source: then its chain below is that source's.
   **decontaminate** (when the voyage has it): `contaminated.jsonl` says whether the document (or
   its keeper) shared an n-gram with an eval set: removed, the answer is "removed by
   decontamination: matches TASK" and nothing reached training; kept, its position moves back by
   the documents removed before it.
3. **tokenize**: shard i is dedup's shard i; the shard's `offsets` (one int64 a document) give
   the token span, counted across the dataset's shards as the mixture counts them.
4. **mixture**: `MixtureInverse` (steps/provenance/inverse.py) turns the span into the global
   sequences that read it, by the sampler's arithmetic backwards (no scan of batches).
5. **training**: optimizer step s reads sequences s*B .. s*B+B-1; pretrain owns steps
   [0, switch), midtrain [switch, total). A step is in checkpoint `step-N` for every N > s, and the
   first checkpoint written that holds it is the first N > s that the trainer's cadence saves
   (`CheckpointConfig.first_after`, steps/train/checkpoint_policy.py, which the trainer itself
   uses); the checkpoints still in the output are listed too.
6. **descendants** (steps/provenance/holders.py): a checkpoint or folder made from one that holds
   the document holds it too: midtrain started from pretrain (`init_from`), the Hugging Face
   export of a checkpoint, an import of that export, and so on down the DAG. "Never" is said
   of a training step only when neither its own batches nor anything it was made from held it.

A window counts as reading the document when it holds any of the document's own tokens: the
end-of-document token tokenize appends (and a begin-of-document one, when it writes one) is a
separator, not the document's text, so a window whose only overlap is that token does not count.
Step ranges are printed inclusive (`320-399`, the last step named), in which-saw as in
`--lineage`; the JSON form (`--json`) gives every list whole and ranges as `first`/`last`.

Torch-free and Ray-free: it reads JSON, numpy arrays and document shards.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executor import InputRef, Plan, VoyageError, step_span
from steps.data.formats import MANIFEST, document_shards, join, open_lines, read_json, url_fs
from steps.data.mixture import MixtureSampler, load_mixture
from steps.provenance.holders import TRAINING_TYPES, Holding, Parent, holdings
from steps.provenance.inverse import MixtureInverse
from steps.train.checkpoint_policy import META, CheckpointConfig, folder, list_checkpoints
from steps.train.spikes import REWIND, skipped_ranges

EXAMPLE = "kjv:kjv/Ge1"  # a real query of the laptop voyage: source kjv, document id "kjv/Ge1"


@dataclass
class SourceDocument:
    """A document of the source's ingested shards."""

    id: str
    shard: int
    position: int
    source: str = ""  # set when it is not the source asked about (a keeper in another source)
    first: int = 0  # the global number of its source's first shard, in dedup's id space

    @property
    def gid(self) -> int:
        return ((self.first + self.shard) << 32) | self.position


@dataclass
class Training:
    """What one training step of the document's mixture did with it, and what it holds."""

    step: str  # the step's name
    phase: str
    state: str  # the step's plan state (CACHED: its output is there)
    steps: list[int]  # its own optimizer steps whose batches held any of the document's tokens
    phase_steps: tuple[int, int]  # the optimizer steps this training step runs, [start, end)
    first_checkpoint: int | None  # the first checkpoint the trainer's schedule writes that holds it
    checkpoints_now: list[int] = field(default_factory=list)  # checkpoints in the output that hold it
    # of `steps`, those whose update the spike guard dropped ("skip") or whose data a rewind
    # skipped ("rewind"): read, never trained on (steps/train/spikes.py)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    made_from: Parent | None = None  # started from a checkpoint that holds it: all its checkpoints do

    @property
    def holds(self) -> bool:
        return bool(self.trained) or self.made_from is not None

    @property
    def trained(self) -> list[int]:
        """Of `steps`, those whose batch was trained on (not skipped by the spike guard)."""
        dropped = {n for n, _ in self.skipped}
        return [n for n in self.steps if n not in dropped]


@dataclass
class Answer:
    """Everything `--which-saw` says about one document."""

    source: str
    id: str
    found: SourceDocument
    survived: bool
    keeper: SourceDocument | None  # the document it was merged with, when dedup removed it
    dataset: str  # the token dataset's step name
    document: int  # its index in the token dataset
    span: tuple[int, int]  # its tokens [start, end) in the token dataset (separators included)
    sequences: list[int]  # global mixture sequences that read any of its own tokens
    untrained: list[int]  # of those, the ones past the last whole batch (never trained on)
    training: list[Training]
    steps_read: dict[str, str] = field(default_factory=dict)  # what was read: step name -> output URL
    also: list[SourceDocument] = field(default_factory=list)  # other documents of the source with the same id
    # the eval sets whose n-grams it (or its keeper) shares, when decontamination removed or marked it
    contamination: list[str] = field(default_factory=list)
    decontam_removed: bool = False
    descendants: list[Holding] = field(default_factory=list)  # exports, imports, other training made from a holder

    def holders(self) -> list[tuple[str, list[int] | None]]:
        """(step, its checkpoints now that hold it; None for a folder such as an export) of every
        output that holds the document, in DAG order."""
        out: list[tuple[str, list[int] | None]] = [(t.step, t.checkpoints_now) for t in self.training if t.holds]
        out += [(d.step, None if d.kind == "export_hf" else d.checkpoints_now) for d in self.descendants]
        return out

    def to_json(self) -> dict[str, Any]:
        """A plain-JSON form of the answer, every list whole (`marin-run ... --which-saw Q --json`)."""
        return {
            "source": self.source, "id": self.id,
            "ingested": {"shard": self.found.shard, "position": self.found.position},
            "survived_dedup": self.survived,
            "merged_with": None if self.keeper is None else {"id": self.keeper.id, "shard": self.keeper.shard,
                                                             "position": self.keeper.position,
                                                             "source": self.keeper.source or self.source},
            "token_dataset": self.dataset, "document": self.document, "span": list(self.span),
            "sequences": self.sequences, "untrained_sequences": self.untrained,
            "training": [{"step": t.step, "phase": t.phase, "state": t.state, "holds": t.holds,
                          "optimizer_steps": t.steps, "phase_steps": steps_json(*t.phase_steps),
                          "first_checkpoint": t.first_checkpoint, "checkpoints_now": t.checkpoints_now,
                          "skipped": [{"step": n, "why": why} for n, why in t.skipped],
                          "made_from": None if t.made_from is None else {"step": t.made_from.step,
                                                                         "checkpoint": t.made_from.checkpoint}}
                         for t in self.training],
            "descendants": [d.to_json() for d in self.descendants],
            "held_by": [{"step": s, "checkpoints_now": c} for s, c in self.holders()],
            "read": self.steps_read,
            "same_id_also_at": [{"shard": f.shard, "position": f.position} for f in self.also],
            "decontamination": {"matches": self.contamination, "removed": self.decontam_removed}
            if self.contamination else None,
        }

    def describe(self, limit: int | None = 12) -> str:
        """The answer for a person, a few lines; lists of steps are cut after `limit` runs (None:
        never), saying how many more there are."""
        lines = [f"{self.source}:{self.id}"]
        lines.append(f"  ingested   shard {self.found.shard}, document {self.found.position}"
                     + (f" (the id is not unique: also {', '.join(f'shard {f.shard} document {f.position}' for f in self.also)}"
                        "; answered for the first)" if self.also else ""))
        if self.survived:
            lines.append("  dedup      kept")
        else:
            k = self.keeper
            lines.append(f"  dedup      removed: merged with {k.source or self.source}:{k.id} (shard {k.shard}, document "
                         f"{k.position}); below, what the keeper's tokens reached")
        if self.contamination:
            whose = "" if self.survived else "its keeper "
            verb = "removed by decontamination" if self.decontam_removed else "marked by decontamination (kept)"
            lines.append(f"  decontam   {whose}{verb}: matches {', '.join(self.contamination)}")
            if self.decontam_removed:
                lines.append("  training   never: no token of it reached the token dataset")
                return "\n".join(lines)
        lines.append(f"  tokens     {self.dataset}: document {self.document}, tokens {self.span[0]:,}..{self.span[1]:,} "
                     f"({self.span[1] - self.span[0]:,} tokens)")
        lines.append(f"  mixture    {len(self.sequences):,} sequences read it: {_ranges(self.sequences, limit)}"
                     + (f" ({len(self.untrained)} past the last whole batch, never trained on)" if self.untrained else ""))
        if not self.training:
            lines.append("  training   no training step of the voyage reads this mixture")
        for t in self.training:
            lines.append(_training_line(t, limit))
            for n, why in t.skipped:
                lines.append(f"{'':13}skipped at step {n} ({why}): its batch was read, not trained on")
        for d in self.descendants:
            kept = (f"; checkpoints now in its output that hold it: {_checkpoints(d.checkpoints_now)}"
                    if d.checkpoints_now else "")
            lines.append(f"  {d.kind:<10} {d.step} [{d.state}]: holds it: made from {d.parent.describe()}, "
                         f"which holds it{kept}")
        held = self.holders()
        if held:
            lines.append("  held by    " + "; ".join(s + (f" {_checkpoints(c)}" if c else "") for s, c in held))
        else:
            lines.append("  held by    nothing: no checkpoint or export of the voyage holds it")
        if limit is not None and "more runs)" in "\n".join(lines):
            lines.append("  (lists cut short; --json gives them whole)")
        return "\n".join(lines)


def _training_line(t: Training, limit: int | None) -> str:
    head = f"  {t.phase:<10} {t.step} [{t.state}]"
    span = step_span(*t.phase_steps)
    if not t.holds:
        return f"{head}: never (none of its steps {span} held it, and it was made from no checkpoint that did)"
    if t.made_from is not None:
        own = (f"its own optimizer steps {_ranges(t.steps, limit)} read it too" if t.steps
               else f"its own steps {span} did not read it")
        what = f"holds it from its start: initialised from {t.made_from.describe()}, which holds it ({own})"
    else:
        what = f"optimizer steps {_ranges(t.steps, limit)}"
    now = (f"; checkpoints now in its output that hold it: {_checkpoints(t.checkpoints_now)}"
           if t.checkpoints_now else "; no checkpoint in its output holds it yet")
    return f"{head}: {what}; first checkpoint that includes it: step-{t.first_checkpoint}{now}"


def _checkpoints(steps: list[int]) -> str:
    return ", ".join(f"step-{n}" for n in steps)


def steps_json(start: int, end: int) -> dict[str, int]:
    """Optimizer steps [start, end) as the JSON gives them: the first and the last step, inclusive."""
    return {"first": start, "last": end - 1}


def parse_query(text: str) -> tuple[str, str]:
    """`SOURCE:DOC_ID` -> (source, id); the id may itself hold colons (ingest names documents
    without an id `FILE:LINE`)."""
    source, sep, doc_id = text.partition(":")
    if not sep or not source or not doc_id:
        raise VoyageError(f"--which-saw: {text!r} is not SOURCE:DOC_ID: a source of the voyage's mixture and a "
                          f"document's `id` as ingest wrote it (e.g. {EXAMPLE})")
    return source, doc_id


def which_saw(plan: Plan, source: str, doc_id: str) -> Answer:
    """Follow document `doc_id` of `source` through the plan's outputs (see the module's doc). A
    file missing or cut short under a finished output is one VoyageError naming it."""
    try:
        return _which_saw(plan, source, doc_id)
    except FileNotFoundError as e:
        raise VoyageError(f"--which-saw: {e.filename or e} is missing, though its step is marked done: the "
                          "prefix is incomplete (a partial copy?)") from None
    except (EOFError, ValueError) as e:
        raise VoyageError(f"--which-saw: an output under {plan.store.prefix} cannot be read: {e}") from None


def _which_saw(plan: Plan, source: str, doc_id: str) -> Answer:
    chain = _chain(plan, source)
    read: dict[str, str] = {}

    def url(node: Any) -> str:
        decision = plan[node.name]
        if not decision.has_output:
            raise VoyageError(f"--which-saw: {node.name} has no output under {plan.store.prefix} yet "
                              f"({decision.state}); run the voyage first")
        read[node.name] = plan.path(node)
        return plan.path(node)

    mixture_url = url(chain["mixture"])
    tokens_url = url(chain["tokenize"])
    dedup_url = url(chain["dedup"]) if "dedup" in chain else None
    scanned = _input_url(plan, chain["documents"]) if "dedup" in chain else tokens_documents(plan, chain["tokenize"])
    if "ingest" in chain:
        url(chain["ingest"])
    shards = document_shards(scanned)
    matches = find_documents(shards, doc_id)
    if not matches:
        where = chain.get("ingest", chain.get("dedup", chain["tokenize"])).name
        sample = first_ids(shards, 3)
        raise VoyageError(f"--which-saw: source {source!r} has no document with id {doc_id!r} "
                          f"({where}: {len(shards)} shard(s) read; its ids read like "
                          f"{', '.join(repr(f'{source}:{i}') for i in sample) or 'nothing: it is empty'})")
    found = matches[0]  # ids are meant to be unique; the first wins, as in the source's order

    keeper, position = None, found.position
    if dedup_url is not None:
        firsts = _first_shards(dedup_url)
        found.first = firsts.get(chain.get("dedup_source", ""), 0)
        removed, keepers = _duplicates(dedup_url)
        at = int(np.searchsorted(removed, found.gid))
        if at < removed.size and int(removed[at]) == found.gid:
            keeper = _keeper(plan, chain, firsts, int(keepers[at]), shards, found.first)
            if keeper.source:  # in another source: follow that source's tokens from here
                chain = _chain(plan, _dataset_of(plan, chain, keeper.source))
                tokens_url, mixture_url = url(chain["tokenize"]), url(chain["mixture"])
        target = keeper or found
        before = int(np.searchsorted(removed, target.gid)) - int(np.searchsorted(removed, (target.first + target.shard) << 32))
        position = target.position - before
    shard = (keeper or found).shard
    contamination, removed_by_decontam = [], False
    if "decontam" in chain:
        contamination, removed_by_decontam, before = _decontaminated(url(chain["decontam"]), chain["decontam"],
                                                                      shard, position)
        if removed_by_decontam:
            return Answer(source=source, id=doc_id, found=found, survived=keeper is None, keeper=keeper,
                          dataset=chain["tokenize"].name, document=-1, span=(0, 0), sequences=[], untrained=[],
                          training=[], steps_read=read, also=matches[1:], contamination=contamination,
                          decontam_removed=True)
        position -= before

    manifest = read_json(join(tokens_url, MANIFEST))
    sizes = manifest["shards"]
    if shard >= len(sizes) or position >= int(sizes[shard]["documents"]):
        raise VoyageError(f"--which-saw: {chain['tokenize'].name} has no document {position} in shard {shard}: "
                          "its documents are not the ones this voyage's dedup kept")
    offsets = _offsets(tokens_url, sizes[shard]["name"], position)
    shard_start = sum(int(s["tokens"]) for s in sizes[:shard])
    span = (shard_start + int(offsets[0]), shard_start + int(offsets[1]))
    document = sum(int(s["documents"]) for s in sizes[:shard]) + position

    mixture = load_mixture(mixture_url)
    dataset = chain["dataset"]
    inverse = MixtureInverse(MixtureSampler(mixture))
    sequences = [r.index for r in inverse.reads(dataset, *own_tokens(span, manifest))]
    training, trained_upto = [], 0
    for node in chain["training"]:
        t = _training(plan, node, mixture, sequences)
        trained_upto = max(trained_upto, t.phase_steps[1] * node.step.config.data.batch_size)
        training.append(t)
    untrained = [i for i in sequences if i >= trained_upto] if training else []
    descendants = _descendants(plan, mixture, training)
    return Answer(source=source, id=doc_id, found=found, survived=keeper is None, keeper=keeper,
                  dataset=chain["tokenize"].name, document=document, span=span, sequences=sequences,
                  untrained=untrained, training=training, steps_read=read, also=matches[1:],
                  contamination=contamination, descendants=descendants)


def own_tokens(span: tuple[int, int], manifest: dict[str, Any]) -> tuple[int, int]:
    """The document's own tokens: its span less the begin- and end-of-document tokens tokenize put
    around it (a window that reads only a separator has read nothing of the text)."""
    start, end = span
    if manifest.get("eos") is not None and end - start > 1:
        end -= 1
    if manifest.get("bos") is not None and end - start > 1:
        start += 1
    return start, end


def _descendants(plan: Plan, mixture: dict[str, Any], training: list[Training]) -> list[Holding]:
    """Completes each training step with what it was made from, and returns every other output that
    holds the document (exports, imports, training of other mixtures) because it was made from
    a holder."""
    from steps.train.data import phases

    by_name = {t.step: t for t in training}

    def phase_end(node: Any) -> int | None:
        try:
            return phases(mixture, int(node.step.config.data.batch_size)).range_of(node.step.type.name)[1]
        except Exception:  # a training step of another mixture: its checkpoints are read, not predicted
            return None

    held = holdings(plan, {t.step: (t.trained[0] if t.trained else None) for t in training}, checkpoints_in, phase_end)
    out = []
    for name, h in held.items():
        t = by_name.get(name)
        if t is None:
            if h.parent is not None:
                out.append(h)
            continue
        if h.parent is not None:
            t.made_from = h.parent
            policy = CheckpointConfig.of(plan.dag[name].step.config.trainer, t.phase_steps[1])
            t.first_checkpoint = policy.first_after(t.phase_steps[0])
            t.checkpoints_now = h.checkpoints_now
    return out


# -- the voyage's edges ------------------------------------------------------------------------

def _chain(plan: Plan, source: str) -> dict[str, Any]:
    """The steps a source's documents go through: ingest, dedup, tokenize, the mixture that names
    the source, and the training steps that read that mixture."""
    mixtures = [n for n in plan.dag if n.step.type.name == "mixture"]
    names = sorted({name for m in mixtures for name in m.step.config.datasets})
    owners = [m for m in mixtures if source in m.step.config.datasets]
    if not owners:
        close = difflib.get_close_matches(source, names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise VoyageError(f"--which-saw: no source {source!r} in the voyage's mixtures (sources: "
                          f"{', '.join(names) or 'none'}){hint}")
    mix = owners[0]
    chain: dict[str, Any] = {"mixture": mix, "dataset": source}
    tok = _producer(plan, mix.step.config.datasets[source])
    if tok is None or tok.step.type.name != "tokenize":
        raise VoyageError(f"--which-saw: {mix.name} names {source!r} by something other than a tokenize step's output")
    chain["tokenize"] = tok
    docs = _producer(plan, tok.step.config.documents)
    reader = tok.step.config  # the config whose `documents` names the dedup step's output
    if docs is not None and docs.step.type.name == "decontaminate":
        chain["decontam"] = docs
        reader = docs.step.config
        docs = _producer(plan, docs.step.config.documents)
    if docs is not None and docs.step.type.name == "dedup":
        chain["dedup"] = docs
        chain["documents"] = docs.step.config.documents
        if isinstance(chain["documents"], dict):  # several sources: its reader reads one source's folder
            chain["dedup_source"] = reader.documents.subpath
            chain["documents"] = chain["documents"][chain["dedup_source"]]
        docs = _producer(plan, chain["documents"])
    if docs is not None and docs.step.type.name == "ingest":
        chain["ingest"] = docs
    chain["training"] = [n for n in plan.dag if n.step.type.name in TRAINING_TYPES
                         and _producer(plan, n.step.config.data.mixture) is mix]
    return chain


def _first_shards(dedup_url: str) -> dict[str, int]:
    """{dedup source: its first global shard} ({"": 0} for an output of one source)."""
    try:
        return {s["name"]: int(s["first_shard"]) for s in read_json(join(dedup_url, "sources.json"))["sources"]}
    except FileNotFoundError:  # written before dedup covered several sources: one source from 0
        return {"": 0}


def _keeper(plan: Plan, chain: dict[str, Any], firsts: dict[str, int], gid: int, shards: list[str],
            first: int) -> SourceDocument:
    """The document a removed one was merged with, in whichever source of the dedup holds it."""
    shard, position = gid >> 32, gid & 0xFFFFFFFF
    source = max((f, n) for n, f in firsts.items() if f <= shard)[1]
    if source == chain.get("dedup_source", ""):
        return dataclasses.replace(document_at(shards, shard - first, position), first=first)
    other = document_shards(_input_url(plan, chain["dedup"].step.config.documents[source]))
    found = document_at(other, shard - firsts[source], position)
    return dataclasses.replace(found, source=source, first=firsts[source])


def _dataset_of(plan: Plan, chain: dict[str, Any], source: str) -> str:
    """The mixture dataset whose tokens come from `source`'s folder of the chain's dedup."""
    for name, value in chain["mixture"].step.config.datasets.items():
        tok = _producer(plan, value)
        docs = tok.step.config.documents if tok is not None and tok.step.type.name == "tokenize" else None
        decontam = _producer(plan, docs)
        if decontam is not None and decontam.step.type.name == "decontaminate":  # dedup -> decontaminate -> tokenize
            docs = decontam.step.config.documents
        if isinstance(docs, InputRef) and docs.step_name == chain["dedup"].name and docs.subpath == source:
            return name
    raise VoyageError(f"--which-saw: the keeper is in source {source!r} of {chain['dedup'].name}, whose tokens "
                      f"no dataset of {chain['mixture'].name} reads")


def _producer(plan: Plan, value: Any) -> Any:
    """The DAG node whose output a config value names, or None (a URL or glob of its own)."""
    if isinstance(value, InputRef):
        return plan.dag[value.step_name]
    return None


def _input_url(plan: Plan, value: Any) -> str:
    if isinstance(value, InputRef):
        base = plan.path(plan.dag[value.step_name])
        return join(base, value.subpath) if value.subpath else base
    return str(value)


def tokens_documents(plan: Plan, tok: Any) -> str:
    return _input_url(plan, tok.step.config.documents)


# -- reading -----------------------------------------------------------------------------------

def find_documents(shards: list[str], doc_id: str) -> list[SourceDocument]:
    """Every document whose `id` is `doc_id`, in the shards' order. A line is parsed only when it
    holds the id's JSON string (any escaping ingest may have written is matched after parsing)."""
    needles = {json.dumps(doc_id, ensure_ascii=False).encode(), json.dumps(doc_id).encode()}
    found = []
    for shard, url in enumerate(shards):
        position = 0
        for line in open_lines(url):
            if not line.strip():
                continue
            if any(n in line for n in needles) and json.loads(line).get("id") == doc_id:
                found.append(SourceDocument(doc_id, shard, position))
            position += 1
    return found


def document_at(shards: list[str], shard: int, position: int) -> SourceDocument:
    """The document at `position` of input shard `shard` (its id)."""
    k = 0
    for line in open_lines(shards[shard]):
        if not line.strip():
            continue
        if k == position:
            return SourceDocument(str(json.loads(line).get("id")), shard, position)
        k += 1
    raise VoyageError(f"--which-saw: {shards[shard]} has no document {position}: dedup's duplicates.npy does not "
                      "match the documents it read")


def _decontaminated(url: str, node: Any, shard: int, position: int) -> tuple[list[str], bool, int]:
    """(the eval sets document `position` of `shard` matches, whether it was removed, how many
    documents before it in its shard were removed) from a decontaminate output."""
    from steps.data.decontam import read_contaminated

    removing = node.step.config.mode == "remove"
    sets, before = [], 0
    for line in read_contaminated(url):
        if line["shard"] != shard:
            continue
        if line["position"] == position:
            sets = list(line["matches"])
        elif line["position"] < position and removing:
            before += 1
    return sets, bool(sets) and removing, before


def _duplicates(dedup_url: str) -> tuple[np.ndarray, np.ndarray]:
    """(removed global ids, sorted; their keepers) from a dedup output."""
    import io

    url = join(dedup_url, "duplicates.npy")
    fs, path = url_fs(url)
    try:
        pairs = np.load(io.BytesIO(fs.cat_file(path)))
    except FileNotFoundError:
        raise FileNotFoundError(2, "missing", url) from None
    except (ValueError, EOFError, OSError) as e:
        raise ValueError(f"{url} is not dedup's array of pairs ({e})") from None
    if pairs.ndim != 2 or (pairs.size and pairs.shape[1] != 2):
        raise ValueError(f"{url} is not dedup's array of pairs (shape {pairs.shape})")
    if pairs.size == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    order = np.argsort(pairs[:, 0], kind="stable")  # written sorted; sorted again for any writer
    return pairs[order, 0].astype(np.uint64), pairs[order, 1].astype(np.uint64)


def _offsets(tokens_url: str, name: str, position: int) -> np.ndarray:
    """Offsets [position, position + 1] of a token shard: two int64 read by byte range."""
    fs, path = url_fs(join(tokens_url, f"shards/{name}.offsets"))
    data = fs.cat_file(path, position * 8, (position + 2) * 8)
    if len(data) != 16:
        raise ValueError(f"{tokens_url}/shards/{name}.offsets is cut short: no offsets for document {position}")
    return np.frombuffer(data, dtype=np.int64)


def _training(plan: Plan, node: Any, mixture: dict[str, Any], sequences: list[int]) -> Training:
    from steps.train.data import phases

    cfg = node.step.config
    batch = int(cfg.data.batch_size)
    phase = node.step.type.name
    start, end = phases(mixture, batch).range_of(phase)
    steps = sorted({i // batch for i in sequences if start <= i // batch < end})
    decision = plan[node.name]
    have, skipped = [], []
    if steps and decision.status is not None:
        have = checkpoints_in(plan.path(node))
        skipped = skipped_steps(folder(plan.path(node), have[-1]), steps) if have else []
    # a step the spike guard skipped read the document but trained nothing on it: no checkpoint
    # holds it because of that step
    trained = [n for n in steps if n not in {k for k, _ in skipped}]
    first = CheckpointConfig.of(cfg.trainer, end).first_after(trained[0]) if trained else None
    now = [n for n in have if trained and n > trained[0]]
    return Training(step=node.name, phase=phase, state=str(decision.state), steps=steps, phase_steps=(start, end),
                    first_checkpoint=first, checkpoints_now=now, skipped=skipped)


def skipped_steps(checkpoint_url: str, steps: list[int]) -> list[tuple[int, str]]:
    """Of `steps`, those the spike guard skipped, by its events in a checkpoint's meta.json (the
    newest: it carries every event of the run so far)."""
    try:
        events = read_json(join(checkpoint_url, META)).get("spike_events") or []
    except FileNotFoundError:
        return []
    why: dict[int, str] = {}
    for first, last, kind in skipped_ranges(events):
        for n in range(first, last + 1):
            if kind == REWIND:
                why[n] = REWIND
            else:
                why.setdefault(n, kind)
    return [(n, why[n]) for n in steps if n in why]


def checkpoints_in(output: str) -> list[int]:
    """The steps of the complete checkpoints of a training output."""
    return [f.step for f in list_checkpoints(output)]


def first_ids(shards: list[str], n: int) -> list[str]:
    """The ids of the first `n` documents of the source (what an error shows as examples)."""
    out: list[str] = []
    for url in shards:
        for line in open_lines(url):
            if line.strip():
                out.append(str(json.loads(line).get("id")))
                if len(out) >= n:
                    return out
    return out


def _ranges(values: list[int], limit: int | None = 12) -> str:
    """`3, 7-9, 12` (at most `limit` runs, then how many more; None: all)."""
    if not values:
        return "none"
    runs, lo, prev = [], values[0], values[0]
    for v in values[1:]:
        if v == prev + 1:
            prev = v
            continue
        runs.append((lo, prev))
        lo = prev = v
    runs.append((lo, prev))
    shown = runs if limit is None else runs[:limit]
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in shown)
    return text + (f", ... ({len(runs) - len(shown)} more runs)" if len(runs) > len(shown) else "")
