"""ingest: formats, rejects by reason, sharding, resume after a crash."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import steps.data.ingest as ingest_mod
from executor.testing import build_context
from steps.data.formats import iter_documents, read_json
from steps.data.ingest import IngestConfig, ingest


def _ctx(tmp_path, name="out"):
    return build_context(str(tmp_path / name), name="t", digest="0" * 64)


def _docs(ctx):
    manifest = read_json(ctx.path("manifest.json"))
    return [d for s in manifest["shards"] for d in iter_documents(ctx.path(s["path"]))]


def test_bad_records_are_counted_and_kept_never_fatal(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = [
        b'{"id": 1, "text": "good one", "lang": "en"}',
        b'{"text": "no id here"}',
        b'{"id": 2, "text": "broken',  # invalid JSON
        b'{"id": 3, "text": "bad \xff\xfe utf8"}',  # invalid UTF-8
        b'{"id": 4, "body": "no text field"}',
        b'{"id": 5, "text": 17}',
        b'{"id": 6, "text": "   \\n "}',
        b'[1, 2, 3]',
        b'{"id": 7, "text": "lone \\ud800 surrogate"}',
        b'',
        b'{"id": 8, "text": "last good"}',
    ]
    (raw / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ctx = _ctx(tmp_path)
    ingest(IngestConfig(input=str(raw), max_reject_share=0.8), ctx)  # 7 of 10 rejected, on purpose
    assert ctx.results["rejects"] == {"empty_text": 1, "invalid_json": 1, "invalid_utf8": 2, "no_text": 2,
                                      "not_an_object": 1}
    assert ctx.results["documents"] == 3
    docs = _docs(ctx)
    assert [d["text"] for d in docs] == ["good one", "no id here", "last good"]
    assert docs[0] == {"id": "1", "text": "good one", "metadata": {"lang": "en"}}
    assert docs[1]["id"] == "a.jsonl:2"
    rejects = list(iter_documents(ctx.path("rejects/00000.jsonl.zst")))
    assert [r["line"] for r in rejects] == [3, 4, 5, 6, 7, 8, 9]
    assert {r["reason"] for r in rejects} >= {"invalid_json", "invalid_utf8"}


def test_compressed_jsonl_and_parquet_and_sharding(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    docs = [{"id": f"z{i}", "text": f"zstd {i}"} for i in range(5)]
    (raw / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(d) + "\n" for d in docs).encode()))
    (raw / "b.jsonl.gz").write_bytes(gzip.compress(b'{"id": "g", "text": "gzip"}\n'))
    pq.write_table(pa.table({"id": ["p0", "p1", "p2"], "content": ["parquet 0", "", "parquet 2"], "n": [1, 2, 3]}),
                   raw / "c.parquet")
    ctx = _ctx(tmp_path)
    ingest(IngestConfig(input=(str(raw / "*.jsonl.*"),), max_docs_per_shard=2), ctx)
    assert ctx.results["documents"] == 6 and ctx.results["shards"] == 4  # 2 + 2 + 1 from a, 1 from b
    assert [d["id"] for d in _docs(ctx)] == ["z0", "z1", "z2", "z3", "z4", "g"]
    ctx2 = _ctx(tmp_path, "pq")
    ingest(IngestConfig(input=str(raw / "c.parquet"), text_field="content", max_reject_share=0.5), ctx2)
    assert [(d["id"], d["text"], d["metadata"]) for d in _docs(ctx2)] == [("p0", "parquet 0", {"n": 1}),
                                                                          ("p2", "parquet 2", {"n": 3})]
    assert ctx2.results["rejects"] == {"empty_text": 1}


def test_truncated_gzip_keeps_what_was_read(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    data = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)))
    (raw / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    ctx = _ctx(tmp_path)
    ingest(IngestConfig(input=str(raw)), ctx)
    assert ctx.results["rejects"] == {"corrupt_file": 1}
    assert 0 < ctx.results["documents"] < 2000


def test_resume_redoes_only_unfinished_files(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    for k in range(3):
        (raw / f"{k}.jsonl").write_text("".join(json.dumps({"text": f"file {k} doc {i}"}) + "\n" for i in range(4)))
    ctx = _ctx(tmp_path)
    real = ingest_mod._ingest_one
    seen = []

    def crash_on_third(output, index, url, config, name=None):
        seen.append(index)
        if index == 2:
            raise RuntimeError("worker died")
        return real(output, index, url, config, name)

    monkeypatch.setattr(ingest_mod, "_ingest_one", crash_on_third)
    with pytest.raises(RuntimeError, match=r"ingest: 1 of 3 shards failed.*2\.jsonl \(RuntimeError: worker died\)"):
        ingest(IngestConfig(input=str(raw)), ctx)
    assert not ctx.exists("manifest.json") and not ctx.exists("documents/00002-0000.jsonl.zst")
    monkeypatch.setattr(ingest_mod, "_ingest_one", lambda *a: (seen.append(a[1]), real(*a))[1])
    ingest(IngestConfig(input=str(raw)), ctx)
    assert seen == [0, 1, 2, 2]
    assert ctx.results["documents"] == 12


def test_relative_inputs_are_read_from_root_whatever_the_working_directory(tmp_path, monkeypatch):
    """`root` is run-only: the same relative input is the same step from any checkout."""
    from executor.identity import step_digest

    for checkout in ("a", "b"):
        corpus = tmp_path / checkout / "data"
        corpus.mkdir(parents=True)
        (corpus / "c.jsonl").write_text('{"id": "x", "text": "in %s"}\n' % checkout)
    monkeypatch.chdir(tmp_path)  # neither checkout
    configs = [IngestConfig(input="data/c.jsonl", root=str(tmp_path / c)) for c in ("a", "b")]
    no_inputs = lambda ref: None  # noqa: E731
    assert step_digest(ingest, configs[0], no_inputs) == step_digest(ingest, configs[1], no_inputs)
    ctx = _ctx(tmp_path, "out-b")
    ingest(configs[1], ctx)
    assert [d["text"] for d in _docs(ctx)] == ["in b"]
    with pytest.raises(FileNotFoundError, match="data/c.jsonl"):
        ingest(IngestConfig(input="data/c.jsonl"), _ctx(tmp_path, "out-cwd"))


def test_a_source_whose_records_are_rejected_fails_naming_the_reasons_and_an_example(tmp_path):
    """Item 14: text under another field (code corpora use `content`) must not give a SUCCESS
    with 0 documents; the step fails at once, naming the reasons, one example and its fields."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "code.jsonl").write_text("".join(json.dumps({"id": i, "content": f"print({i})", "lang": "py"}) + "\n"
                                            for i in range(100)))
    ctx = _ctx(tmp_path)
    with pytest.raises(ingest_mod.TooManyRejects) as caught:
        ingest(IngestConfig(input=str(raw)), ctx)
    message = str(caught.value)
    assert "100 of 100 records rejected (100.0%, more than max_reject_share 0.01): no_text 100" in message
    assert 'code.jsonl line 1 (no_text): {"id": 0, "content": "print(0)", "lang": "py"}' in message
    assert "fields content, id, lang; text_field is 'text'" in message
    assert not ctx.exists("manifest.json")  # never looks done
    ingest(IngestConfig(input=str(raw), text_field="content"), _ctx(tmp_path, "right"))  # the fix


def test_rejects_within_the_declared_share_pass(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(99)] + ['{"text": ""}']
    (raw / "a.jsonl").write_text("\n".join(lines) + "\n")
    ctx = _ctx(tmp_path)
    ingest(IngestConfig(input=str(raw)), ctx)  # 1% is the default limit, and not more than it
    assert ctx.results["rejected"] == 1 and ctx.results["documents"] == 99
    with pytest.raises(ingest_mod.TooManyRejects, match="empty_text 1"):
        ingest(IngestConfig(input=str(raw), max_reject_share=0.0), _ctx(tmp_path, "strict"))
    everything = tmp_path / "bad"
    everything.mkdir()
    (everything / "b.jsonl").write_text('{"text": ""}\n[1]\n')
    with pytest.raises(ingest_mod.TooManyRejects, match=r"2 of 2 records rejected \(100.0%, no document left\)"):
        ingest(IngestConfig(input=str(everything), max_reject_share=1.0), _ctx(tmp_path, "lenient"))
    from executor import VoyageError
    with pytest.raises(VoyageError, match="max_reject_share"):
        IngestConfig(input="x", max_reject_share=1.5)
