"""train_tokenizer and tokenize: BPE at a given size, shards equal to direct encoding, BOS/EOS,
dtype, resume per shard."""

import json

import numpy as np
import pytest

import steps.data.tokenize as tokenize_mod
from executor import VoyageError
from executor.testing import build_context
from steps.data.formats import TokenDataset, iter_documents, read_json, write_documents
from steps.data.tokenize import TokenizeConfig, encode_batches, prefetch, tokenize
from steps.data.tokenizer import TrainTokenizerConfig, load_tokenizer, train_tokenizer

CORPUS = "data/corpus/kjv.jsonl.zst"


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    docs = []
    for d in iter_documents(CORPUS):
        docs.append(d)
        if len(docs) == 120:
            break
    docs.append({"id": "unicode", "text": "naïve café — 東京 🙂"})
    for k in range(3):
        write_documents(str(root / f"{k}.jsonl.zst"), docs[k::3])
    return root


@pytest.fixture(scope="module")
def tokenizer_dir(docs_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    ctx = build_context(str(out), name="t", digest="0" * 64)
    train_tokenizer(TrainTokenizerConfig(documents=str(docs_dir), vocab_size=600), ctx)
    assert ctx.results["vocab_size"] == 600
    return out


def test_trained_tokenizer_is_byte_level_and_lossless(tokenizer_dir):
    tok = load_tokenizer(str(tokenizer_dir))
    assert tok.token_to_id("<|bos|>") == 0 and tok.token_to_id("<|eos|>") == 1
    for text in ["In the beginning", "naïve café — 東京 🙂", "  spaces\tand\nnewlines "]:
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    assert load_tokenizer(str(tokenizer_dir / "tokenizer.json")).get_vocab_size() == 600
    with pytest.raises(VoyageError):
        TrainTokenizerConfig(documents="x", vocab_size=100)


def test_tokenize_matches_direct_encoding(docs_dir, tokenizer_dir, tmp_path):
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    tokenize(TokenizeConfig(documents=str(docs_dir), tokenizer=str(tokenizer_dir), bos="<|bos|>", eos="<|eos|>",
                            batch_docs=7), ctx)
    manifest = read_json(ctx.path("manifest.json"))
    assert manifest["dtype"] == "uint16" and manifest["bos_id"] == 0 and manifest["eos_id"] == 1
    assert manifest["documents"] == 121 == ctx.results["documents"]
    ds = TokenDataset(ctx.output)
    tok = load_tokenizer(str(tokenizer_dir))
    texts = [d["text"] for k in range(3) for d in iter_documents(str(docs_dir / f"{k}.jsonl.zst"))]
    expected = [[0, *tok.encode(t, add_special_tokens=False).ids, 1] for t in texts]
    assert [ds.document(i).tolist() for i in range(ds.num_documents)] == expected
    assert ds.num_tokens == sum(map(len, expected)) == ctx.results["tokens"]


@pytest.mark.parametrize("bos,eos", [(None, None), (0, None), (None, 1)])
def test_bos_eos_are_optional(tokenizer_dir, bos, eos):
    tok = load_tokenizer(str(tokenizer_dir))
    texts = ["a b", "", "In the beginning God"]
    (flat, lengths), = list(encode_batches(tok, [texts], bos, eos, np.dtype(np.uint16)))
    expected = [([bos] if bos is not None else []) + tok.encode(t, add_special_tokens=False).ids
                + ([eos] if eos is not None else []) for t in texts]
    assert lengths.tolist() == [len(e) for e in expected]
    assert flat.tolist() == [t for e in expected for t in e]


def test_unknown_special_token_is_an_error(docs_dir, tokenizer_dir, tmp_path):
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    with pytest.raises(VoyageError, match="<s>"):
        tokenize(TokenizeConfig(documents=str(docs_dir), tokenizer=str(tokenizer_dir), bos="<s>", eos=None), ctx)


def test_large_vocab_uses_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    write_documents(str(tmp_path / "d.jsonl"), [{"id": "0", "text": "w1 w69999 w65536"}])
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    tokenize(TokenizeConfig(documents=str(tmp_path / "d.jsonl"), tokenizer=str(tmp_path), bos=None, eos="[UNK]"), ctx)
    ds = TokenDataset(ctx.output)
    assert ds.dtype == np.uint32 and ds.document(0).tolist() == [1, 69999, 65536, 70000]


def test_resume_skips_finished_shards(docs_dir, tokenizer_dir, tmp_path, monkeypatch):
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    config = TokenizeConfig(documents=str(docs_dir), tokenizer=str(tokenizer_dir), bos=None, eos="<|eos|>")
    real = tokenize_mod.TokenShardWriter
    opened = []

    class Crashing(real):
        def write(self, flat, lengths):
            if self._tok.path.endswith("00001.tokens"):
                raise RuntimeError("node lost")
            super().write(flat, lengths)

    monkeypatch.setattr(tokenize_mod, "TokenShardWriter", Crashing)
    with pytest.raises(RuntimeError, match=r"1 of 3 shards failed.*1\.jsonl\.zst \(RuntimeError: node lost\)"):
        tokenize(config, ctx)
    # the failing shard is quarantined; its neighbours finish
    assert ctx.exists("ledger/00000.json") and ctx.exists("ledger/00002.json") and not ctx.exists("ledger/00001.json")
    assert not ctx.exists("shards/00001.tokens")  # never half-written under its final name
    assert not ctx.exists("manifest.json")

    class Counting(real):
        def __init__(self, url, name, dtype):
            opened.append(name)
            super().__init__(url, name, dtype)

    monkeypatch.setattr(tokenize_mod, "TokenShardWriter", Counting)
    tokenize(config, ctx)
    assert opened == ["00001"]
    assert ctx.results["documents"] == 121


def test_prefetch_propagates_errors():
    def gen():
        yield 1
        raise ValueError("bad shard")

    with pytest.raises(ValueError, match="bad shard"):
        list(prefetch(gen()))
    assert list(prefetch(iter(range(5)), depth=1)) == [0, 1, 2, 3, 4]
    assert json.dumps(list(prefetch(iter([])))) == "[]"


def test_pin_tokenizer_copies_a_tokenizer_and_checks_its_size(tmp_path):
    from tokenizers import Tokenizer, models

    from executor import VoyageError
    from steps.data.tokenizer import PinTokenizerConfig, load_tokenizer, pin_tokenizer

    src = tmp_path / "src"
    src.mkdir()
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    (src / "tokenizer.json").write_text(tok.to_str())
    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64)
    pin_tokenizer.fn(PinTokenizerConfig(source=str(src), expect_vocab_size=3), ctx)
    assert load_tokenizer(str(tmp_path / "out")).get_vocab_size() == 3
    assert ctx.results["vocab_size"] == 3
    with pytest.raises(VoyageError, match="has 3 tokens, expected 128256"):
        pin_tokenizer.fn(PinTokenizerConfig(source=str(src), expect_vocab_size=128256), ctx)


def test_every_task_declares_the_plans_memory_when_the_voyage_gives_none(docs_dir, tokenizer_dir, tmp_path):
    """No Resources.memory_gb (the laptop voyage): each task still asks Ray for the data plan's
    figure for a tokenize task, and checks itself against it."""
    from steps.data.budget import tokenize_task_gb

    asked = []

    def mapper(fn, items, resources=None):
        asked.append(resources)
        return [fn(x) for x in items]

    ctx = build_context(str(tmp_path / "out"), name="t", digest="0" * 64, mapper=mapper)
    tokenize(TokenizeConfig(documents=str(docs_dir), tokenizer=str(tokenizer_dir), bos=None, eos="<|eos|>"), ctx)
    assert [r.memory_gb for r in asked] == [tokenize_task_gb(1024)] and tokenize_task_gb(1024) > 0.5
