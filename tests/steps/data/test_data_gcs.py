"""The data steps with their outputs on GCS: ingest -> train_tokenizer -> pin_tokenizer -> dedup ->
tokenize -> staged mixture through the executor on a real local Ray, on a `gs://` prefix through
gcsfs against the GCS emulator; then the same voyage (the same raw input, on gs://) on a local
prefix.

The two runs must agree: every step SUCCESS in the same folders (the digest is the recipe, not
the place), the same results (documents, rejects, duplicates removed, tokens, mixture draws), and
the same files with the same bytes, so the same output digests: outputs name their inputs
relative to themselves (steps/data/paths.py). The GCS outputs read back through gcsfs (documents,
tokenizer, token datasets by byte range, the mixture sampler), a second run on GCS is all cached,
and a copy of the local prefix is all cached and reads only from itself."""

import gzip
import io
import json
import pathlib
import uuid

import numpy as np
import pytest
import zstandard

ray = pytest.importorskip("ray")
pytest.importorskip("gcsfs")

from executor import Step, output_of  # noqa: E402
from executor.api import run_steps  # noqa: E402
from executor.storage.store import SUCCESS, Store, output_digest  # noqa: E402
from steps.dedup.dedup import DedupConfig, dedup  # noqa: E402
from steps.data.formats import TokenDataset, iter_documents, read_json  # noqa: E402
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, mixture  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.data.tokenizer import PinTokenizerConfig, TrainTokenizerConfig, load_tokenizer, pin_tokenizer, \
    train_tokenizer  # noqa: E402

CORPUS = pathlib.Path(__file__).resolve().parents[3] / "data" / "corpus"
SEQ = 128
SEQUENCES = 1200
BAD_LINES = [b"{not json", b'{"id": "e", "text": "   "}', b'{"id": "n", "title": "no text"}', b"[1, 2]"]
EXACT, NEAR = 8, 6  # planted duplicates in the kjv input


def _corpus(name: str, n: int) -> list[dict]:
    with open(CORPUS / f"{name}.jsonl.zst", "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read()
    return [json.loads(line) for line in data.splitlines()[:n]]


def _input_files() -> dict[str, bytes]:
    """Raw input: two zstd JSONL files of KJV chapters (the second with exact and near copies of
    chapters of the first, and bad records), one gzip JSONL file of Python docs."""
    kjv = _corpus("kjv", 160)
    exact = [dict(d, id=f"copy/{d['id']}") for d in kjv[:EXACT]]
    near = []
    for d in kjv[20:20 + NEAR]:  # one word in the middle changed: 5-gram Jaccard well above 0.9
        words = d["text"].split(" ")
        words[len(words) // 2] = "NEARDUP"
        near.append(dict(d, id=f"near/{d['id']}", text=" ".join(words)))

    def lines(docs: list[dict]) -> list[bytes]:
        return [json.dumps(d).encode() for d in docs]

    zstd = zstandard.ZstdCompressor(level=3)
    return {
        "kjv-a.jsonl.zst": zstd.compress(b"\n".join(lines(kjv[:100])) + b"\n"),
        "kjv-b.jsonl.zst": zstd.compress(b"\n".join(lines(kjv[100:110] + exact) + BAD_LINES
                                                    + lines(kjv[110:] + near)) + b"\n"),
        "pydocs.jsonl.gz": gzip.compress(b"\n".join(lines(_corpus("pydocs", 120))) + b"\n", mtime=0),
    }


def _voyage(inputs: str) -> list[Step]:
    kjv = Step("raw/kjv", ingest, IngestConfig(input=f"{inputs}/kjv-*.jsonl.zst", max_docs_per_shard=60,
                                               max_reject_share=0.05))  # 4 bad records of 178, planted
    py = Step("raw/pydocs", ingest, IngestConfig(input=f"{inputs}/pydocs.jsonl.gz"))
    tok = Step("tokenizer", train_tokenizer, TrainTokenizerConfig(documents=output_of(kjv), vocab_size=400,
                                                                  max_documents=80))
    pinned = Step("tokenizer/pinned", pin_tokenizer, PinTokenizerConfig(source=output_of(tok),
                                                                         expect_vocab_size=400))
    clean = Step("dedup/kjv", dedup, DedupConfig(documents=output_of(kjv)))
    tok_kjv = Step("tokens/kjv", tokenize, TokenizeConfig(documents=output_of(clean), tokenizer=output_of(pinned),
                                                          bos=None, eos="<|eos|>"))
    tok_py = Step("tokens/pydocs", tokenize, TokenizeConfig(documents=output_of(py), tokenizer=output_of(tok),
                                                            bos="<|bos|>", eos="<|eos|>"))
    mix = Step("mixture", mixture, MixtureConfig(
        datasets={"kjv": output_of(tok_kjv), "pydocs": output_of(tok_py)}, token_budget=SEQ * SEQUENCES,
        seq_len=SEQ, block_size=256,
        stages=(MixtureStage(0.75, {"kjv": 0.6, "pydocs": 0.4}), MixtureStage(0.25, {"pydocs": 1.0}))))
    return [mix]


@pytest.fixture(scope="module")
def runs(gcs_emulator, ray_local, tmp_path_factory):
    """The voyage, reading its raw input from gs://, run on a gs:// prefix and then on a local one."""
    root = f"marin-test/data-{uuid.uuid4().hex[:8]}"
    fs = Store(f"gs://{root}").fs
    for name, data in _input_files().items():
        fs.pipe_file(f"{root}/input/{name}", data)
    inputs = f"gs://{root}/input"
    gcs = run_steps(_voyage(inputs), prefix=f"gs://{root}/prefix")
    local = run_steps(_voyage(inputs), prefix=str(tmp_path_factory.mktemp("prefix")))
    return {"gcs": gcs, "local": local, "inputs": inputs}


def _outputs(plan) -> dict[str, str]:
    return {d.name: plan.path(d.node) for d in plan.decisions}


def test_every_step_succeeds_on_gcs_and_locally(runs):
    for where in ("gcs", "local"):
        plan, summary = runs[where]
        assert summary.exit_code == 0, (where, [(o.name, o.error) for o in summary.failed])
        assert len(plan.decisions) == 8 and all(d.will_run for d in plan.decisions)
        store = plan.store
        for d in plan.decisions:
            status, record = store.read_status(d.node.dirname), store.read_record(d.node.dirname)
            assert status.state == SUCCESS and record.state == SUCCESS, (where, d.name)
            assert [a.state for a in record.attempts] == [SUCCESS], (where, d.name)
            # the record's manifest is what the folder holds, and the status repeats its digest
            assert store.manifest(store.served_dir(d.node.dirname)) == record.manifest
            assert output_digest(record.manifest) == record.output_digest == status.output_digest
            # nothing temporary left behind: no hidden name anywhere in the output
            assert not [e.path for e in record.manifest if any(p.startswith(".") for p in e.path.split("/"))]
    assert runs["gcs"][0].path(runs["gcs"][0].decisions[0].node).startswith("gs://marin-test/")


def test_results_agree_and_are_right(runs):
    (gplan, _), (lplan, _) = runs["gcs"], runs["local"]
    out, local_out = _outputs(gplan), _outputs(lplan)
    for d, e in zip(gplan.decisions, lplan.decisions):
        assert d.name == e.name and d.node.dirname == e.node.dirname  # the digest does not see the prefix
        g, loc = gplan.store.read_record(d.node.dirname), lplan.store.read_record(e.node.dirname)
        gr, lr = dict(g.results), dict(loc.results)
        if d.name == "tokenizer/pinned":
            assert (gr.pop("source"), lr.pop("source")) == (out["tokenizer"], local_out["tokenizer"])
        assert gr == lr, d.name

    res = {d.name: gplan.store.read_record(d.node.dirname).results for d in gplan.decisions}
    kjv = res["raw/kjv"]
    assert kjv["documents"] == 160 + EXACT + NEAR and kjv["input_files"] == 2 and kjv["shards"] == 4
    assert kjv["rejects"] == {"empty_text": 1, "invalid_json": 1, "no_text": 1, "not_an_object": 1}
    assert res["raw/pydocs"]["documents"] == 120 and res["raw/pydocs"]["rejected"] == 0
    assert res["tokenizer"]["vocab_size"] == 400 == res["tokenizer/pinned"]["vocab_size"]
    dd = res["dedup/kjv"]
    assert (dd["documents_in"], dd["documents_kept"]) == (160 + EXACT + NEAR, 160)
    assert dd["exact_duplicates_removed"] == EXACT and dd["fuzzy_duplicates_removed"] == NEAR
    assert dd["clusters"] == EXACT + NEAR and dd["largest_cluster"] == 2

    # what was removed, read back from GCS: every planted copy, each with its original as keeper
    fs = gplan.store.fs
    dups = np.load(io.BytesIO(fs.cat_file(out["dedup/kjv"] + "/duplicates.npy")))
    assert dups.dtype == np.uint64 and dups.shape == (EXACT + NEAR, 2)
    ingested = read_json(out["raw/kjv"] + "/manifest.json")["shards"]
    id_of = {(i << 32) | pos: doc["id"] for i, shard in enumerate(ingested)
             for pos, doc in enumerate(iter_documents(f"{out['raw/kjv']}/{shard['path']}"))}
    originals = [d["id"] for d in _corpus("kjv", 160)]
    assert sorted((id_of[int(a)], id_of[int(b)]) for a, b in dups) == sorted(
        [(f"copy/{i}", i) for i in originals[:EXACT]] + [(f"near/{i}", i) for i in originals[20:20 + NEAR]])
    kept = [doc for i in range(4) for doc in iter_documents(f"{out['dedup/kjv']}/documents/{i:05d}.jsonl.zst")]
    assert [d["id"] for d in kept] == originals

    # token counts: the kept documents encoded here with the pinned tokenizer (read from GCS), one EOS each
    tok = load_tokenizer(out["tokenizer/pinned"])
    want = sum(len(e.ids) + 1 for e in tok.encode_batch([d["text"] for d in kept], add_special_tokens=False))
    tokens = TokenDataset(out["tokens/kjv"])
    assert not tokens._local and tokens.num_tokens == want == res["tokens/kjv"]["tokens"]
    assert tokens.num_documents == 160 and res["tokens/kjv"]["dtype"] == "uint16"
    eos = tok.token_to_id("<|eos|>")
    first = tokens.document(0)
    assert first[-1] == eos and tok.decode(first[:-1].tolist()) == kept[0]["text"]
    py = TokenDataset(out["tokens/pydocs"])
    assert py.num_documents == 120 and py.document(119)[0] == tok.token_to_id("<|bos|>")

    # the mixture, sampled from GCS: stage switch where it belongs, shares as weighted
    sampler = MixtureSampler(out["mixture"])
    assert len(sampler) == SEQUENCES
    first_stage = [sampler.locate(i).dataset for i in range(900)]
    assert first_stage.count("kjv") == 540 and first_stage.count("pydocs") == 360
    assert {sampler.locate(i).dataset for i in range(900, SEQUENCES)} == {"pydocs"}
    seq = sampler.sequence(1)
    assert seq.dtype == np.uint16 and seq.size == SEQ and int(seq.max()) < 400
    # read by byte range from GCS, memory-mapped locally: the same tokens
    local_sampler = MixtureSampler(local_out["mixture"])
    for i in range(0, SEQUENCES, 37):
        assert sampler.locate(i) == local_sampler.locate(i)
        assert np.array_equal(sampler.sequence(i), local_sampler.sequence(i)), i


def test_the_same_bytes_and_output_digests_on_gcs_and_locally(runs):
    """Item 10: outputs name their inputs relative to themselves, so the same voyage under two
    prefixes (here on two stores) writes the same files with the same bytes: every output digest
    agrees, the ledgers, token manifests and mixture included."""
    (gplan, _), (lplan, _) = runs["gcs"], runs["local"]
    for d in gplan.decisions:
        g, loc = gplan.store.read_record(d.node.dirname), lplan.store.read_record(d.node.dirname)
        assert [(e.path, e.size, e.checksum) for e in g.manifest] == \
            [(e.path, e.size, e.checksum) for e in loc.manifest], d.name
        assert g.output_digest == loc.output_digest, d.name
    mixture = read_json(_outputs(gplan)["mixture"] + "/mixture.json")
    assert {n: i["url"] for n, i in mixture["datasets"].items()} == {
        "kjv": "../" + gplan.dag["tokens/kjv"].dirname, "pydocs": "../" + gplan.dag["tokens/pydocs"].dirname}


def test_a_copied_prefix_is_cached_and_reads_only_from_itself(runs, tmp_path):
    """`cp -r` of the local prefix, the original moved away: every step plans CACHED with the same
    output digests, and what the outputs name (the mixture's datasets, a dataset's tokenizer)
    is read from the copy."""
    import shutil

    from executor.api import plan_steps
    from steps.data.formats import read_tokens_manifest

    plan, _ = runs["local"]
    original = plan.store.prefix
    before = {d.name: plan.store.read_status(d.node.dirname).output_digest for d in plan.decisions}
    copy, away = str(tmp_path / "copy"), str(tmp_path / "away")
    shutil.copytree(original, copy)
    shutil.move(original, away)  # reading the old prefix now fails
    try:
        again = plan_steps(_voyage(runs["inputs"]), copy)
        assert {d.state for d in again.decisions} == {"CACHED"}
        assert {d.name: d.status.output_digest for d in again.decisions} == before
        out = _outputs(again)
        sampler = MixtureSampler(out["mixture"])
        assert all(sampler.dataset(n).url.startswith(copy + "/") for n in sampler.names)
        assert sampler.sequence(0).size == SEQ and sampler.sequence(SEQUENCES - 1).size == SEQ
        tokenizer = read_tokens_manifest(out["tokens/kjv"])["tokenizer"]
        assert tokenizer == out["tokenizer/pinned"] and load_tokenizer(tokenizer).get_vocab_size() == 400
    finally:
        shutil.move(away, original)


def test_second_run_on_gcs_is_all_cached(runs):
    plan, summary = run_steps(_voyage(runs["inputs"]), prefix=runs["gcs"][0].store.prefix)
    assert not plan.to_run() and summary.exit_code == 0
    assert {d.state for d in plan.decisions} == {"CACHED"}, [(d.name, d.state, d.reason) for d in plan.decisions]
