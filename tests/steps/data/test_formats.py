"""Document and token shard formats: round trips, atomic commits, cross-shard reads."""

import gzip
import json

import fsspec
import numpy as np
import pytest

from steps.data.formats import (TOKENS_FORMAT, AtomicFile, TokenDataset, TokenShardWriter, document_shards, expand,
                                iter_documents, iter_text_batches, token_dtype, write_documents, write_json)


def test_token_dtype_fits_the_vocabulary():
    assert token_dtype(50_000) == np.uint16
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32
    assert token_dtype(128_256) == np.uint32


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst", ".jsonl.gz"])
def test_documents_round_trip(tmp_path, suffix):
    docs = [{"id": str(i), "text": f"doc {i} é ✓"} for i in range(2500)]
    url = str(tmp_path / f"shard{suffix}")
    assert write_documents(url, docs) == 2500
    assert list(iter_documents(url)) == docs
    batches = list(iter_text_batches(url, 1000))
    assert [len(b) for b in batches] == [1000, 1000, 500]


def test_atomic_file_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with AtomicFile(str(tmp_path / "x.bin")) as f:
            f.write(b"half")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_expand_globs_and_folders_skip_hidden_and_control_files(tmp_path):
    for name in ["a.jsonl", "b.jsonl.zst", "c.parquet", ".tmp-x-d.jsonl", "_ignored/e.jsonl", "notes.txt"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = [p.split("/")[-1] for p in expand(str(tmp_path))]
    assert found == ["a.jsonl", "b.jsonl.zst", "c.parquet"]
    assert [p.split("/")[-1] for p in expand(str(tmp_path / "*.jsonl*"))] == ["a.jsonl", "b.jsonl.zst"]
    with pytest.raises(FileNotFoundError):
        expand(str(tmp_path / "missing.jsonl"))


def test_document_shards_from_memory_filesystem():
    fs = fsspec.filesystem("memory")
    write_documents("memory://fmt/docs/x.jsonl", [{"id": "1", "text": "hi"}])
    (shard,) = document_shards("memory://fmt/docs")
    assert shard.endswith("/fmt/docs/x.jsonl") and list(iter_documents(shard)) == [{"id": "1", "text": "hi"}]
    fs.rm("/fmt", recursive=True)


def _write_tokens(root, shards, dtype=np.uint16):
    entries = []
    for k, docs in enumerate(shards):
        with TokenShardWriter(f"{root}/shards", f"{k:05d}", dtype) as w:
            for batch in (docs[:1], docs[1:]):
                if batch:
                    w.write(np.concatenate(batch), np.array([len(d) for d in batch]))
        entries.append({"name": f"{k:05d}", "tokens": w.tokens, "documents": w.documents})
    write_json(f"{root}/manifest.json", {"format": TOKENS_FORMAT, "dtype": np.dtype(dtype).name, "shards": entries,
                                         "tokens": sum(e["tokens"] for e in entries),
                                         "documents": sum(e["documents"] for e in entries)})


@pytest.mark.parametrize("protocol", ["local", "memory"])
def test_token_dataset_reads_across_shards(tmp_path, protocol):
    root = str(tmp_path / "tok") if protocol == "local" else "memory://tokfmt"
    rng = np.random.default_rng(0)
    shards = [[rng.integers(0, 60000, n).astype(np.uint16) for n in sizes] for sizes in ([3, 5, 0, 7], [4], [2, 9])]
    _write_tokens(root, shards)
    ds = TokenDataset(root)
    flat = np.concatenate([d for s in shards for d in s])
    assert ds.num_tokens == flat.size and ds.num_documents == 7
    assert np.array_equal(ds.tokens(0, flat.size), flat)
    assert np.array_equal(ds.tokens(13, 6), flat[13:19])  # crosses the first shard boundary
    docs = [d for s in shards for d in s]
    for i, d in enumerate(docs):
        assert np.array_equal(ds.document(i), d)
    assert ds.offsets(0).tolist() == [0, 3, 8, 8, 15]
    with pytest.raises(IndexError):
        ds.tokens(flat.size - 2, 5)
    if protocol == "memory":
        fsspec.filesystem("memory").rm("/tokfmt", recursive=True)


def test_gzip_is_read_by_suffix(tmp_path):
    p = tmp_path / "x.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"text": "a"}\n\n{"text": "b"}\n'))
    assert [d["text"] for d in iter_documents(str(p))] == ["a", "b"]
    assert json.loads(json.dumps(list(iter_text_batches(str(p), 10)))) == [["a", "b"]]
