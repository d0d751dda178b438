"""dedup: exact and near duplicates across shards, deterministic keepers, report, resume."""

import random

import numpy as np
import pytest

import steps.dedup.dedup as dedup_mod
from executor import VoyageError
from executor.testing import build_context
from steps.dedup.dedup import DedupConfig, connected_components, dedup
from steps.data.formats import iter_documents, read_json, write_documents


def _words(rng, n):
    return [f"w{rng.randrange(10**7)}" for _ in range(n)]


def _variant(words, rng, keep):
    return [w if rng.random() < keep else f"v{rng.randrange(10**7)}" for w in words]


@pytest.fixture()
def corpus(tmp_path):
    """Three shards: 60 unrelated documents, plus an exact copy and near copies across shards."""
    rng = random.Random(0)
    base = [_words(rng, 300) for _ in range(60)]
    docs = [{"id": f"d{i}", "text": " ".join(w)} for i, w in enumerate(base)]
    shards = [docs[0:20], docs[20:40], docs[40:60]]
    shards[1].append({"id": "copy-of-d3", "text": docs[3]["text"]})
    shards[2].append({"id": "near-d5", "text": " ".join(_variant(base[5], rng, 0.99))})
    shards[2].append({"id": "near-near-d5", "text": " ".join(_variant(base[5], rng, 0.99))})
    shards[0].insert(0, {"id": "near-d30", "text": " ".join(_variant(base[30], rng, 0.995))})
    shards[1].append({"id": "empty-words", "text": "!!!"})
    shards[2].append({"id": "empty-words-2", "text": "..."})
    for k, s in enumerate(shards):
        write_documents(str(tmp_path / f"in/{k}.jsonl.zst"), s)
    return tmp_path / "in"


def _kept(ctx):
    manifest = read_json(ctx.path("manifest.json"))
    return [d["id"] for s in manifest["shards"] for d in iter_documents(ctx.path(s["path"]))]


@pytest.mark.parametrize("verify", [None, 0.7])
def test_removes_exact_and_near_duplicates_keeping_the_smallest_id(corpus, tmp_path, verify):
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    dedup(DedupConfig(documents=str(corpus), verify_threshold=verify), ctx)
    kept = _kept(ctx)
    # near-d30 sits first in shard 0, so it is the keeper of its cluster and d30 goes
    assert "near-d30" in kept and "d30" not in kept
    for gone in ("copy-of-d3", "near-d5", "near-near-d5"):
        assert gone not in kept
    assert {f"d{i}" for i in range(60) if i != 30} <= set(kept)
    assert "empty-words" in kept and "empty-words-2" in kept  # no shingles: never fuzzy-matched
    r = ctx.results
    assert r["exact_duplicates_removed"] == 1 and r["fuzzy_duplicates_removed"] == 3
    assert r["clusters"] == 3 and r["largest_cluster"] == 3 and r["documents_kept"] == len(kept) == 62
    report = read_json(ctx.path("report.json"))
    assert report["cluster_sizes"] == {"2": 2, "3": 1}
    assert report["example_pairs"] and all(p["first"]["text"] for p in report["example_pairs"])
    assert not ctx.exists("work")
    dup = np.load(ctx.fs_path("duplicates.npy"))
    assert dup.shape == (4, 2) and (dup[:, 1] < dup[:, 0]).all()


def test_exact_only_and_fuzzy_only(corpus, tmp_path):
    ctx = build_context(str(tmp_path / "exact"), name="t", digest="0" * 64)
    dedup(DedupConfig(documents=str(corpus), fuzzy=False), ctx)
    assert ctx.results["removed"] == 1 and "copy-of-d3" not in _kept(ctx)
    ctx = build_context(str(tmp_path / "fuzzy"), name="t", digest="0" * 64)
    dedup(DedupConfig(documents=str(corpus), exact=False), ctx)
    assert ctx.results["removed"] == 4 and ctx.results["exact_duplicates_removed"] == 0


def test_result_does_not_depend_on_task_grouping(corpus, tmp_path):
    outs = []
    for per in (1, 3):
        ctx = build_context(str(tmp_path / f"g{per}"), name="t", digest="0" * 64)
        dedup(DedupConfig(documents=str(corpus), shards_per_task=per, batch_docs=4), ctx)
        outs.append(_kept(ctx))
    assert outs[0] == outs[1]


def test_resume_after_a_crash_in_the_last_pass(corpus, tmp_path, monkeypatch):
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    real_write, real_sig = dedup_mod._write_kept, dedup_mod._signatures
    calls = []

    def crash(job):
        raise RuntimeError("preempted")

    monkeypatch.setattr(dedup_mod, "_write_kept", crash)
    with pytest.raises(RuntimeError):
        dedup(DedupConfig(documents=str(corpus)), ctx)
    monkeypatch.setattr(dedup_mod, "_write_kept", real_write)
    monkeypatch.setattr(dedup_mod, "_signatures", lambda job: (calls.append(job), real_sig(job)))
    dedup(DedupConfig(documents=str(corpus)), ctx)
    assert calls == []  # signatures were not computed again
    assert ctx.results["removed"] == 4


def test_connected_components_keeper_is_the_smallest_id():
    pairs = np.array([[5, 9], [9, 12], [1, 3], [12, 20], [3, 7], [30, 31]], dtype=np.uint64)
    nodes, keeper = connected_components(pairs)
    assert dict(zip(nodes.tolist(), keeper.tolist())) == {1: 1, 3: 1, 7: 1, 5: 5, 9: 5, 12: 5, 20: 5, 30: 30, 31: 30}
    chain = np.array([[i, i + 1] for i in range(999, 0, -1)], dtype=np.uint64)  # a long path, reversed
    assert set(connected_components(chain)[1].tolist()) == {1}


def test_bad_config_is_a_voyage_error():
    with pytest.raises(VoyageError):
        DedupConfig(documents="x", bands=0)
    with pytest.raises(VoyageError):
        DedupConfig(documents="x", verify_threshold=1.5)


def test_ingest_dedup_tokenize_on_a_memory_filesystem():
    """No local paths anywhere: every step reads and writes through fsspec URLs."""
    import fsspec

    from steps.data.formats import TokenDataset
    from steps.data.ingest import IngestConfig, ingest
    from steps.data.tokenize import TokenizeConfig, tokenize
    from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer

    fs = fsspec.filesystem("memory")
    rng = random.Random(3)
    base = [" ".join(_words(rng, 80)) for _ in range(30)]
    fs.pipe("/memdata/raw/a.jsonl", "".join(f'{{"text": "{t}"}}\n' for t in base + base[:2]).encode())

    def ctx(name):
        return build_context(f"memory://memdata/{name}", name=name, digest="0" * 64)

    try:
        a, d, t, z = ctx("ing"), ctx("dd"), ctx("tok"), ctx("tz")
        ingest(IngestConfig(input="memory://memdata/raw/*.jsonl", max_docs_per_shard=10), a)
        dedup(DedupConfig(documents=a.output, verify_threshold=0.7), d)
        assert d.results["removed"] == 2 and d.results["documents_kept"] == 30
        train_tokenizer(TrainTokenizerConfig(documents=d.output, vocab_size=300), t)
        tokenize(TokenizeConfig(documents=d.output, tokenizer=t.output, bos="<|bos|>", eos=None), z)
        ds = TokenDataset(z.output)
        assert ds.num_documents == 30 and ds.document(0)[0] == 0
    finally:
        fs.rm("/memdata", recursive=True)


# -- several sources in one id space ------------------------------------------------------------

def _ingested(tmp_path, name, docs, license_id):
    from executor import License
    from steps.data.ingest import IngestConfig, ingest

    raw = tmp_path / f"raw-{name}.jsonl"
    raw.write_text("".join(__import__("json").dumps(d) + "\n" for d in docs))
    ctx = build_context(str(tmp_path / f"ingest-{name}"), name=f"raw/{name}", digest="0" * 64)
    ingest(IngestConfig(input=str(raw), max_docs_per_shard=7, license=License(license_id)), ctx)
    return ctx.output


def test_cross_source_dedup_keeps_sources_apart_but_finds_their_overlap(tmp_path):
    """Two sources deduplicated together: one id space (the same clusters as one folder of both
    sources' shards), a keeper in the other source, removals per pair of sources, and each
    source's own folder, manifest and licence."""
    rng = random.Random(5)
    base = [" ".join(_words(rng, 200)) for _ in range(30)]
    web_a = [{"id": f"a{i}", "text": t} for i, t in enumerate(base[:20])]
    web_a.append({"id": "a-copy-a3", "text": base[3]})
    web_b = [{"id": f"b{i}", "text": t} for i, t in enumerate(base[20:])]
    web_b += [{"id": "b-copy-a5", "text": base[5]},
              {"id": "b-near-a7", "text": " ".join(_variant(base[7].split(), rng, 0.99))},
              {"id": "b-copy-b2", "text": base[22]}]
    a = _ingested(tmp_path, "web-a", web_a, "CC-BY-4.0")
    b = _ingested(tmp_path, "web-b", web_b, "ODC-By-1.0")

    ctx = build_context(str(tmp_path / "both"), name="dedup/web", digest="0" * 64)
    dedup(DedupConfig(documents={"web-b": b, "web-a": a}), ctx)  # ids follow the names: web-a first
    r = ctx.results
    assert r["removed"] == 4 and r["removed_by_pair"] == {"web-a <- web-a": 1, "web-b <- web-a": 2,
                                                          "web-b <- web-b": 1}
    kept = {s: [d["id"] for sh in read_json(ctx.path(s, "manifest.json"))["shards"]
                for d in iter_documents(ctx.path(s, sh["path"]))] for s in ("web-a", "web-b")}
    assert "a5" in kept["web-a"] and "b-copy-a5" not in kept["web-b"] and "b-near-a7" not in kept["web-b"]
    assert len(kept["web-a"]) == 20 and len(kept["web-b"]) == 10
    assert list(read_json(ctx.path("web-a", "manifest.json"))["licenses"].values())[0]["id"] == "CC-BY-4.0"
    assert list(read_json(ctx.path("web-b", "manifest.json"))["licenses"].values())[0]["id"] == "ODC-By-1.0"
    root = read_json(ctx.path("manifest.json"))
    assert root["documents"] == 30 and len(root["licenses"]) == 2
    report = read_json(ctx.path("report.json"))
    assert report["by_source"]["web-b"] == {"documents_in": 13, "documents_kept": 10}
    firsts = {s["name"]: s["first_shard"] for s in read_json(ctx.path("sources.json"))["sources"]}
    assert firsts["web-a"] == 0 and firsts["web-b"] == 3  # 21 documents, 7 a shard

    # the same clusters as one id space given by hand: both sources' shards in name order
    one = build_context(str(tmp_path / "one"), name="t", digest="0" * 64)
    from steps.data.formats import document_shards
    dedup(DedupConfig(documents=document_shards(a) + document_shards(b)), one)
    assert np.array_equal(np.load(ctx.fs_path("duplicates.npy")), np.load(one.fs_path("duplicates.npy")))


def test_a_bad_source_name_is_a_voyage_error():
    for bad in ({}, {"": "x"}, {"a/b": "x"}, {".hidden": "x"}):
        with pytest.raises(VoyageError):
            DedupConfig(documents=bad)
