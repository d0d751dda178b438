"""Which checkpoints saw a document. The answer (the mixture's arithmetic run
backwards) is checked against a scan of every sequence's `locate` and against the batches the
trainer's data loader (steps/train/data.py) yields at the steps it names."""

from executor.storage.store import Store  # outputs are read in their committed attempt
import dataclasses
import json
import os
import random
import shutil

import numpy as np
import pytest

from steps.data.formats import TokenDataset, document_shards, iter_documents
from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, feistel, plan_mixture
from steps.provenance.inverse import MixtureInverse, feistel_inverse
from steps.provenance.which_saw import which_saw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def reads_by_window(sampler):
    """(dataset, window) -> every global sequence that reads it: the oracle, by scanning."""
    seen = {}
    for i in range(len(sampler)):
        loc = sampler.locate(i)
        seen.setdefault((loc.dataset, loc.sequence), []).append(i)
    return seen


def expected_sequences(sampler, seen, dataset, start, end):
    """The sequences that read any of tokens [start, end) (the caller leaves out separators)."""
    L, N = sampler.seq_len, int(sampler.windows[sampler.names.index(dataset)])
    return sorted(i for w in range(start // L, min((end - 1) // L + 1, N)) for i in seen.get((dataset, w), []))


def test_feistel_inverse_undoes_the_permutation():
    rng = random.Random(0)
    for n in (1, 2, 3, 5, 64, 65, 1000, 27_159, 4_577_636_719):
        for _ in range(40):
            i, key = rng.randrange(n), (rng.randrange(4), rng.randrange(9), rng.randrange(5))
            assert feistel_inverse(feistel(i, n, key), n, key) == i
    with pytest.raises(ValueError):
        feistel_inverse(10, 10, (0, 0, 0))


def test_inverse_equals_a_scan_on_stages_blocks_and_epochs():
    """Four datasets, three stages (one too short for block quotas: largest remainder), uneven
    blocks, zero weights, several epochs: every window's reads equal the scan's."""
    cfg = MixtureConfig(datasets={n: f"memory://{n}" for n in "abcd"}, token_budget=5_003 * 8, seq_len=8,
                        stages=(MixtureStage(0.6, {"a": 5, "b": 3, "c": 1}), MixtureStage(0.399, {"b": 1, "d": 2}),
                                MixtureStage(0.001, {"a": 1, "c": 1, "d": 1})), block_size=37, seed=3)
    manifest = plan_mixture(cfg, {"a": 800 * 8 + 5, "b": 3000 * 8, "c": 90 * 8 + 7, "d": 1500 * 8})
    sampler = MixtureSampler(manifest, datasets={})
    assert manifest["epochs"]["c"] > 3  # several epochs of c
    inverse, seen = MixtureInverse(sampler), reads_by_window(sampler)
    for d, name in enumerate(sampler.names):
        N = int(sampler.windows[d])
        for w in range(N):
            assert [r.index for r in inverse.reads(name, w * 8, w * 8 + 8)] == sorted(seen.get((name, w), [])), (name, w)
        # a span over three windows, and the tail past the last whole window (never drawn)
        assert [r.index for r in inverse.reads(name, 8 * 2 + 3, 8 * 5 - 1)] == expected_sequences(
            sampler, seen, name, 19, 39)
        assert inverse.reads(name, N * 8, N * 8 + 3) == []


def test_first_checkpoint_follows_the_trainers_schedule():
    from steps.train.checkpoint_policy import CheckpointConfig

    def first_saved(step, end, every, permanent):
        return CheckpointConfig(every=every, final_step=end, permanent_every=permanent).first_after(step)

    assert first_saved(0, 320, 100, 0) == 100
    assert first_saved(99, 320, 100, 0) == 100  # step 99 done is checkpoint step-100
    assert first_saved(100, 320, 100, 0) == 200
    assert first_saved(301, 320, 100, 0) == 320  # the phase's last step is always saved
    assert first_saved(361, 400, 100, 0) == 400
    assert first_saved(120, 10_000, 500, 128) == 128  # permanent_every saves too


# -- the laptop voyage ---------------------------------------------------------------------------


def ids_of(prefix, plan, step):
    """The documents (id, global position) of an ingest step's output, in order."""
    return [d["id"] for url in document_shards(os.path.join(prefix, Store(prefix).served_dir(plan.dag[step].dirname)))
            for d in iter_documents(url)]


def check_against_loader(answer, plan, prefix, sampler, seen):
    """The answer's sequences equal the scan's, and the trainer's own batches at the steps it
    names hold the document's tokens where it says."""
    from steps.train.data import Batches

    dataset = TokenDataset(os.path.join(prefix, Store(prefix).served_dir(plan.dag[answer.dataset].dirname)))
    doc = dataset.document(answer.document)
    start, end = answer.span
    assert end - start == doc.size
    assert np.array_equal(dataset.tokens(start, end - start), doc)
    name = answer.dataset.split("/", 1)[1]
    # the document's own tokens: the end-of-document token tokenize appends is a separator
    assert answer.sequences == expected_sequences(sampler, seen, name, start, end - 1)
    manifest = sampler.manifest
    L = sampler.seq_len
    for t in answer.training:
        cfg = plan.dag[t.step].step.config
        batches = Batches(manifest, cfg.data.batch_size, rank=0, workers=1, microbatch=0)
        B = cfg.data.batch_size
        assert t.steps == sorted({i // B for i in answer.sequences if t.phase_steps[0] <= i // B < t.phase_steps[1]})
        for s in t.steps[:3] + t.steps[-2:]:
            rows = batches.step(s)[0]
            hits = [i for i in answer.sequences if i // B == s]
            for i in hits:
                loc = sampler.locate(i)
                row = rows[i - s * B]
                lo, hi = max(start, loc.token_start), min(end, loc.token_start + L)
                assert lo < hi and lo < end - 1  # the row holds some of the document's own tokens ...
                assert np.array_equal(row[lo - loc.token_start:hi - loc.token_start], doc[lo - start:hi - start])
        # ... and no other step of the phase reads a window of it
        others = set(range(*t.phase_steps)) - set(t.steps)
        assert all(i // B not in others for i in answer.sequences)


@pytest.fixture(scope="module")
def laptop(laptop_voyage):
    lv = laptop_voyage
    assert all(lv.summary.outcomes[n].state in ("SUCCESS", "CACHED") for n in
               ("mixture/laptop", "pretrain/laptop", "midtrain/laptop")), lv.summary.outcomes
    sampler = MixtureSampler(os.path.join(lv.prefix, Store(lv.prefix).served_dir(lv.plan.dag["mixture/laptop"].dirname)))
    return lv, sampler, reads_by_window(sampler)


def test_documents_of_both_sources_match_the_loader(laptop):
    """The first document of each source, the shortest, one read at a block boundary and one read at
    the stage switch (the first sequence of a block, of midtrain's stage): every answer matches the
    scan and the loader's batches."""
    lv, sampler, seen = laptop
    plan, prefix = lv.plan, lv.prefix
    picks = []
    for source in ("kjv", "pydocs"):
        ids = ids_of(prefix, plan, f"raw/{source}")
        data = TokenDataset(os.path.join(prefix, Store(prefix).served_dir(plan.dag[f"tokenized/{source}"].dirname)))
        lengths = np.diff(data.offsets(0))
        picks += [(source, ids[0]), (source, ids[int(np.argmin(lengths))])]
    switch = lv.pretrain_steps * lv.batch_size  # midtrain's first sequence
    for index in (256, 255, switch):  # a block's first and last slot; the switch to midtrain's stage
        loc = sampler.locate(index)
        data = TokenDataset(os.path.join(prefix, Store(prefix).served_dir(plan.dag[f"tokenized/{loc.dataset}"].dirname)))
        doc = int(np.searchsorted(data.offsets(0), loc.token_start, side="right")) - 1
        # the token dataset's documents are decontamination's (its removed ones are not in it)
        picks.append((loc.dataset, ids_of(prefix, plan, f"decontam/{loc.dataset}")[doc]))
    answers = {}
    for source, doc_id in picks:
        answer = which_saw(plan, source, doc_id)
        assert answer.survived and answer.keeper is None
        check_against_loader(answer, plan, prefix, sampler, seen)
        answers[(source, doc_id)] = answer
    boundary = answers[picks[-3]]
    assert 256 in boundary.sequences and 8 in boundary.training[0].steps  # sequence 256 is step 8 of pretrain
    at_switch = answers[picks[-1]]
    assert switch in at_switch.sequences
    assert lv.pretrain_steps in next(t for t in at_switch.training if t.phase == "midtrain").steps
    long = answers[picks[0]]
    assert long.span[1] - long.span[0] > 10 * 65 and len(long.sequences) > 1
    pre = next(t for t in long.training if t.phase == "pretrain")
    assert pre.state == "CACHED" and pre.checkpoints_now and all(n > pre.steps[0] for n in pre.checkpoints_now)
    assert json.loads(json.dumps(long.to_json()))["training"][0]["optimizer_steps"] == pre.steps


def test_cli_answers_and_refuses_bad_queries(laptop, capsys):
    """marin-run --which-saw: the answer in a few lines; a missing id, an unknown source (with the
    close name) and a malformed query are one line each, exit 2, nothing written."""
    from executor.cli import main

    lv, _sampler, _seen = laptop
    before = sorted(os.path.relpath(os.path.join(d, f), lv.prefix) for d, _, fs in os.walk(lv.prefix) for f in fs)
    args = [lv.voyage_path, *lv.args, "--prefix", lv.prefix, "--which-saw"]
    assert main(args + ["kjv:kjv/Ge1"]) == 0
    out = capsys.readouterr().out
    assert "kjv:kjv/Ge1" in out and "dedup      kept" in out and "first checkpoint that includes it: step-" in out
    assert "pretrain/laptop [CACHED]" in out and "midtrain/laptop [CACHED]" in out
    for query, message in [("kjv:kjv/Nowhere99", "source 'kjv' has no document with id 'kjv/Nowhere99'"),
                           ("kvj:kjv/Ge1", "no source 'kvj' in the voyage's mixtures (sources: kjv, pydocs); "
                                           "did you mean kjv?"),
                           ("kjv", "'kjv' is not SOURCE:DOC_ID")]:
        assert main(args + [query]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and message in captured.err and captured.err.count("\n") == 1, captured.err
    after = sorted(os.path.relpath(os.path.join(d, f), lv.prefix) for d, _, fs in os.walk(lv.prefix) for f in fs)
    assert after == before


def test_a_relocated_prefix_answers_from_the_copy(laptop, laptop_copy, tmp_path):
    """The prefix copied elsewhere and the original moved away: the same answer, read from the
    copy. (The "original" is this test's own copy of the session's prefix, which other workers read.)"""
    from executor.api import plan_steps

    lv, _sampler, _seen = laptop
    want = which_saw(lv.plan, "pydocs", "pydocs/faq/design/2").to_json()
    copy, away = str(tmp_path / "copy"), str(tmp_path / "away")
    shutil.copytree(laptop_copy, copy, symlinks=True)
    shutil.move(laptop_copy, away)
    plan = plan_steps(lv.module.voyage(lv.config), copy)
    got = which_saw(plan, "pydocs", "pydocs/faq/design/2")
    assert all(url.startswith(copy) for url in got.steps_read.values())
    assert dict(got.to_json(), read=None) == dict(want, read=None)


# -- a document removed by dedup -------------------------------------------------------------------


@pytest.fixture(scope="module")
def v535():
    """voyages/535b.py as a module (the same name as the session's laptop run loads it under)."""
    import importlib.util
    import sys

    from ray import cloudpickle

    path = os.path.join(ROOT, "voyages", "535b.py")
    spec = importlib.util.spec_from_file_location("voyage_535b_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def test_a_document_removed_by_dedup_names_its_keeper(v535, ray_local, tmp_path):
    """The laptop voyage's DAG over a slice of the bundled corpus with one planted duplicate per
    source (the bundled corpus has none): the data steps run, the training steps do not. A removed
    document names the document it was merged with, and the keeper's exposure is checked against
    the scan and the loader, at the steps training would take (several epochs here)."""
    from executor.api import run_steps
    from executor.plan import Selection

    sources, planted = [], {}
    kjv = list(iter_documents(os.path.join(ROOT, v535.LAPTOP_SOURCES[0].url)))[:40]
    for src in v535.LAPTOP_SOURCES:
        docs = list(iter_documents(os.path.join(ROOT, src.url)))[:40]
        dup = dict(docs[7], id=f"{src.name}/copy-of-{docs[7]['id']}")
        docs.insert(30, dup)
        docs.append({"id": docs[3]["id"], "text": f"A text of its own, under the id of {src.name}'s fourth document."})
        if src.name == "pydocs":  # one dedup covers both sources: a copy of a kjv document is merged with it
            docs.append(dict(kjv[11], id="pydocs/copy-of-kjv"))
        planted[src.name] = (dup["id"], docs[7]["id"])
        path = tmp_path / f"{src.name}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
        sources.append(dataclasses.replace(src, url=str(path)))
    scale = dataclasses.replace(v535.LAPTOP, sources=tuple(sources))
    original = v535.LAPTOP
    v535.LAPTOP = scale
    try:
        steps = v535.voyage(v535.VoyageConfig(laptop=True))
    finally:
        v535.LAPTOP = original
    prefix = str(tmp_path / "out")
    plan, summary = run_steps(steps, prefix, Selection(only=("mixture/laptop",)))
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    from executor.api import plan_steps

    plan = plan_steps(steps, prefix)
    sampler = MixtureSampler(os.path.join(prefix, Store(prefix).served_dir(plan.dag["mixture/laptop"].dirname)))
    seen = reads_by_window(sampler)
    for source, (dup_id, keeper_id) in planted.items():
        answer = which_saw(plan, source, dup_id)
        assert not answer.survived and answer.keeper.id == keeper_id
        assert (answer.found.shard, answer.found.position) == (0, 30) and answer.keeper.position == 7
        kept = which_saw(plan, source, keeper_id)
        assert kept.survived and (kept.span, kept.sequences) == (answer.span, answer.sequences)
        assert [t.state for t in answer.training] == ["RUN", "RUN"] and not answer.training[0].checkpoints_now
        check_against_loader(answer, plan, prefix, sampler, seen)
        assert f"removed: merged with {source}:{keeper_id}" in answer.describe()
        # the document after the removed one moved up by one in the token dataset
        after = which_saw(plan, source, ids_of(prefix, plan, f"raw/{source}")[31])
        assert after.document == 30
        # an id that is not unique: answered for the first, the others named
        twice = which_saw(plan, source, ids_of(prefix, plan, f"raw/{source}")[3])
        assert twice.found.position == 3 and [(f.shard, f.position) for f in twice.also] == [(0, 41)]
        assert "the id is not unique: also shard 0 document 41" in twice.describe()
    assert max(sampler.manifest["epochs"].values()) > 1
    # the keeper in another source: its chain (tokens, mixture dataset) is that source's
    cross, original = which_saw(plan, "pydocs", "pydocs/copy-of-kjv"), which_saw(plan, "kjv", kjv[11]["id"])
    assert not cross.survived and cross.keeper.source == "kjv" and cross.keeper.id == kjv[11]["id"]
    assert (cross.dataset, cross.span, cross.sequences) == ("tokenized/kjv", original.span, original.sequences)
    assert f"removed: merged with kjv:{kjv[11]['id']}" in cross.describe()
    assert cross.to_json()["merged_with"]["source"] == "kjv"


def test_a_document_removed_by_decontamination_names_the_eval_set(laptop, capsys):
    """Psalm 23 holds a held-out passage (data/evals/heldout_passages.jsonl): --which-saw says it
    was removed by decontamination and never trained on; the chapter after it is answered in its
    place in the token dataset, one document earlier than in the source."""
    from executor.cli import main

    lv, sampler, seen = laptop
    answer = which_saw(lv.plan, "kjv", "kjv/Psa23")
    assert answer.survived and answer.decontam_removed and answer.contamination == ["heldout"]
    assert answer.sequences == [] and answer.training == []
    assert "decontam   removed by decontamination: matches heldout" in answer.describe()
    assert answer.to_json()["decontamination"] == {"matches": ["heldout"], "removed": True}
    after = which_saw(lv.plan, "kjv", "kjv/Psa24")
    assert after.contamination == [] and after.document == ids_of(lv.prefix, lv.plan, "raw/kjv").index("kjv/Psa24") - 1
    check_against_loader(after, lv.plan, lv.prefix, sampler, seen)
    assert main([lv.voyage_path, *lv.args, "--prefix", lv.prefix, "--which-saw", "kjv:kjv/Psa23"]) == 0
    assert "removed by decontamination: matches heldout" in capsys.readouterr().out


def test_outputs_missing_or_cut_short_are_one_error(v535, laptop, tmp_path):
    """A fresh prefix names the first step without output; a copy with dedup's ledger of
    duplicates deleted, or a token shard's offsets cut short, names the file."""
    from executor import VoyageError
    from executor.api import plan_steps

    lv, _sampler, _seen = laptop
    with pytest.raises(VoyageError, match=r"mixture/laptop has no output under .* yet \(RUN\); run the voyage first"):
        which_saw(plan_steps(v535.voyage(v535.VoyageConfig(laptop=True)), str(tmp_path / "empty")), "kjv", "kjv/Ge1")
    copy = str(tmp_path / "copy")
    for name in ("raw", "dedup", "decontam", "tokenized", "mixture", "pretrain", "midtrain"):
        shutil.copytree(os.path.join(lv.prefix, name), os.path.join(copy, name), symlinks=True)
    plan = plan_steps(lv.module.voyage(lv.config), copy)
    dups = os.path.join(Store(copy).served_dir(plan.dag["dedup/corpus"].dirname), "duplicates.npy")
    os.remove(os.path.join(copy, dups))
    with pytest.raises(VoyageError, match=r"duplicates.npy is missing, though its step is marked done"):
        which_saw(plan, "kjv", "kjv/Ge1")
    shutil.copy(os.path.join(lv.prefix, dups), os.path.join(copy, dups))  # pydocs shares that dedup
    offsets = os.path.join(copy, Store(copy).served_dir(plan.dag["tokenized/pydocs"].dirname), "shards", "00000.offsets")
    with open(offsets, "r+b") as f:
        f.truncate(8 * 3)
    with pytest.raises(VoyageError, match=r"00000.offsets is cut short: no offsets for document 5"):
        which_saw(plan, "pydocs", ids_of(copy, plan, "raw/pydocs")[5])


# -- descendants, separators, the JSON form -------------------------------------


def test_midtrain_and_the_export_hold_what_pretrain_saw(laptop, capsys):
    """A document read by pretrain only (the issue's kjv/Psa33, or the next chapter that is):
    midtrain, started from pretrain's last checkpoint, and the export of midtrain's last one hold
    it; the CLI says so, and --json lists every step whole."""
    from executor.cli import main

    lv, _sampler, _seen = laptop
    P, S = lv.pretrain_steps, lv.steps  # pretrain's steps 0..P-1, midtrain's P..S-1
    ids = ids_of(lv.prefix, lv.plan, "raw/kjv")
    for doc in ids[ids.index("kjv/Psa33"):]:  # the document, or the first after it that fits
        answer = which_saw(lv.plan, "kjv", doc)
        pre, mid = answer.training
        if pre.steps and not mid.steps:
            break
    assert pre.steps and max(pre.steps) < P and not mid.steps  # what the issue saw: midtrain never read it
    assert mid.holds and (mid.made_from.step, mid.made_from.checkpoint) == ("pretrain/laptop", P)
    assert mid.checkpoints_now == [S] and mid.first_checkpoint == S
    assert [(d.step, d.kind, d.parent.step, d.parent.checkpoint) for d in answer.descendants] == [
        ("export/laptop", "export_hf", "midtrain/laptop", S)]
    assert answer.holders() == [("pretrain/laptop", pre.checkpoints_now), ("midtrain/laptop", [S]),
                                ("export/laptop", None)]
    args = [lv.voyage_path, *lv.args, "--prefix", lv.prefix, "--which-saw", f"kjv:{doc}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "never (" not in out
    assert (f"midtrain/laptop [CACHED]: holds it from its start: initialised from pretrain/laptop step-{P}, which "
            f"holds it (its own steps {P}-{S - 1} did not read it)") in out
    assert f"export/laptop [CACHED]: holds it: made from midtrain/laptop step-{S}" in out
    assert main(args + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(json.dumps(answer.to_json()))
    assert got["training"][1]["phase_steps"] == {"first": P, "last": S - 1}
    assert [h["step"] for h in got["held_by"]] == ["pretrain/laptop", "midtrain/laptop", "export/laptop"]
    # one convention for step ranges: --lineage prints midtrain's steps as which-saw does
    assert main([lv.voyage_path, *lv.args, "--prefix", lv.prefix, "--lineage", "midtrain/laptop"]) == 0
    assert f"consumed {(S - P) * lv.batch_size * 65:,} tokens in steps {P}-{S - 1}:" in capsys.readouterr().out
    assert main([lv.voyage_path, *lv.args, "--prefix", lv.prefix, "--json"]) == 2
    assert "--json: only with --which-saw" in capsys.readouterr().err


def test_never_only_when_no_ancestor_saw_it(laptop):
    """A document whose windows no sequence draws: every training step says never, nothing holds it."""
    lv, sampler, seen = laptop
    prefix, plan = lv.prefix, lv.plan
    data = TokenDataset(os.path.join(prefix, Store(prefix).served_dir(plan.dag["tokenized/kjv"].dirname)))
    offsets = data.offsets(0)
    unread = next(d for d in range(len(offsets) - 1)
                  if not expected_sequences(sampler, seen, "kjv", int(offsets[d]), int(offsets[d + 1])))
    answer = which_saw(plan, "kjv", ids_of(prefix, plan, "raw/kjv")[unread])
    assert answer.sequences == [] and not any(t.holds for t in answer.training) and answer.descendants == []
    text = answer.describe()
    P, S = lv.pretrain_steps, lv.steps
    assert f"midtrain/laptop [CACHED]: never (none of its steps {P}-{S - 1} held it, and it was made from no " \
           "checkpoint that did)" in text
    assert f"pretrain/laptop [CACHED]: never (none of its steps 0-{P - 1} held it" in text
    assert "held by    nothing" in text


def test_a_window_that_reads_only_the_end_of_document_token_does_not_count(laptop):
    """A document whose last token (the end-of-document token) opens a window that the mixture
    draws: that window's sequences are not the document's, they are the next document's."""
    lv, sampler, seen = laptop
    prefix, plan = lv.prefix, lv.plan
    L = sampler.seq_len
    for source in ("kjv", "pydocs"):
        data = TokenDataset(os.path.join(prefix, Store(prefix).served_dir(plan.dag[f"tokenized/{source}"].dirname)))
        offsets = [int(x) for x in data.offsets(0)]
        picks = [d for d in range(len(offsets) - 2) if (offsets[d + 1] - 1) % L == 0
                 and offsets[d + 1] - offsets[d] > 1 and seen.get((source, (offsets[d + 1] - 1) // L))]
        if picks:
            break
    d = picks[0]
    only_eos = seen[(source, (offsets[d + 1] - 1) // L)]
    ids = ids_of(prefix, plan, f"raw/{source}")
    answer = which_saw(plan, source, ids[d])
    assert answer.span == (offsets[d], offsets[d + 1])
    assert not set(only_eos) & set(answer.sequences)
    assert set(only_eos) <= set(which_saw(plan, source, ids[d + 1]).sequences)


def test_descendants_through_import_and_export(v535, tmp_path):
    """From the DAG alone (nothing run): an export of midtrain, an import of that export and a
    midtrain started from the import all hold what pretrain saw; an export of pretrain's step-100
    holds it only if pretrain read it before step 100."""
    from executor import Step, output_of
    from executor.api import plan_steps
    from steps.export.from_hf import ImportHFConfig, import_hf
    from steps.export.to_hf import ExportHFConfig, export_hf
    from steps.provenance.holders import holdings
    from steps.train.pretrain import midtrain

    steps = v535.voyage(v535.VoyageConfig(laptop=True))
    pre, mid, ex = (next(s for s in steps if s.name == n) for n in ("pretrain/laptop", "midtrain/laptop",
                                                                      "export/laptop"))
    imp = Step("import/laptop", import_hf, ImportHFConfig(hf=output_of(ex)))
    again = Step("midtrain/again", midtrain, dataclasses.replace(mid.config, init_from=output_of(imp)))
    early = Step("export/early", export_hf, dataclasses.replace(ex.config,
                                                                checkpoint=output_of(pre, "checkpoints/step-100")))
    plan = plan_steps(steps + [imp, again, early], str(tmp_path / "out"))
    ends = {"pretrain/laptop": 320, "midtrain/laptop": 400, "midtrain/again": 400}

    def held(first):
        h = holdings(plan, {"pretrain/laptop": first}, lambda url: [], lambda node: ends[node.name])
        return {n: (x.parent.describe() if x.parent else x.holds) for n, x in h.items() if x.holds}

    assert held(150) == {"pretrain/laptop": True, "midtrain/laptop": "pretrain/laptop step-320",
                         "export/laptop": "midtrain/laptop step-400", "import/laptop": "export/laptop",
                         "midtrain/again": "import/laptop step-0"}
    assert held(42)["export/early"] == "pretrain/laptop step-100"
    assert held(None) == {}


def test_the_text_cuts_long_lists_and_says_so_the_json_never_does():
    from steps.provenance.which_saw import Answer, SourceDocument, Training

    steps = list(range(0, 60, 2))  # 30 runs of one step
    t = Training(step="pretrain/x", phase="pretrain", state="CACHED", steps=steps, phase_steps=(0, 64),
                 first_checkpoint=1, checkpoints_now=[64])
    answer = Answer(source="s", id="d", found=SourceDocument("d", 0, 0), survived=True, keeper=None, dataset="tokenized/s",
                    document=0, span=(0, 10), sequences=[s * 4 for s in steps], untrained=[], training=[t])
    text = answer.describe()
    assert "... (18 more runs)" in text and "(lists cut short; --json gives them whole)" in text
    whole = answer.describe(limit=None)
    assert "more runs" not in whole and "cut short" not in whole and "58" in whole
    assert answer.to_json()["training"][0]["optimizer_steps"] == steps
    assert answer.to_json()["training"][0]["phase_steps"] == {"first": 0, "last": 63}
