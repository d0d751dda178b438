"""steps.data.paths: outputs name other outputs of their prefix relative to themselves."""

import pytest

from executor import StepContext

from executor.testing import build_context
from steps.data.paths import prefix_of, ref, resolve

DIGEST = "0123456789" + "a" * 54


def _ctx(output: str, name: str = "tokenized/kjv") -> StepContext:
    return build_context(output, name=name, digest=DIGEST)


@pytest.mark.parametrize("prefix", ["/tmp/p", "gs://bucket/voyages", "memory://m/x"])
def test_inside_the_prefix_relative_and_back(prefix):
    ctx = _ctx(f"{prefix}/tokenized/kjv-0123456789")
    assert prefix_of(ctx) == prefix
    tokenizer = f"{prefix}/tokenizer/bpe-512-abcdef0123"
    name = ref(ctx, tokenizer)
    assert name == "../../tokenizer/bpe-512-abcdef0123"
    if prefix.startswith("gs://"):
        return  # resolving reads the target's .status: there is no such bucket here
    assert resolve(name, ctx.output) == tokenizer
    ledger = ctx.path("ledger")
    shard = f"{prefix}/dedup/kjv-1111111111/documents/00000.jsonl.zst"
    assert resolve(ref(ctx, shard, ledger), ledger) == shard
    assert ref(ctx, ctx.path("shards/00000.tokens")) == "./shards/00000.tokens"  # never a bare name


def test_outside_the_prefix_and_names_that_are_not_paths_stay_as_given():
    ctx = _ctx("gs://bucket/voyages/tokenized/kjv-0123456789")
    for url in ("gs://other-bucket/raw/x.jsonl", "gs://bucket/raw/x.jsonl", "/local/corpus.jsonl",
                "meta-llama/Llama-3.1-8B", "gs://bucket/voyages-old/tokenizer/t-0123456789"):
        assert ref(ctx, url) == url
        assert resolve(url, ctx.output) == url


def test_a_step_run_by_hand_outside_the_executors_naming_has_no_prefix():
    ctx = _ctx("/tmp/somewhere/out", name="t")
    assert prefix_of(ctx) is None
    assert ref(ctx, "/tmp/somewhere/tokenizer") == "/tmp/somewhere/tokenizer"


def test_names_hold_no_attempt_and_resolve_into_the_committed_one():
    """An output's files are in `.attempts/<id>/`; a name written by another output
    leaves the attempt out, and is read in the attempt the target's `.status` commits now."""
    from executor.storage.store import Status, Store

    prefix = "memory://refs-attempts/p"
    store = Store(prefix)
    tok = "tokenizer/bpe-512-abcdef0123"
    store.write_status(tok, Status(state="SUCCESS", digest="ab" * 32, output_digest="cd" * 32,
                                   dir=".attempts/0002-0000beef"))
    ctx = _ctx(f"{prefix}/tokenized/kjv-0123456789/.attempts/0001-12345678")
    assert prefix_of(ctx) == prefix
    name = ref(ctx, f"{prefix}/{tok}/.attempts/0001-00000000/vocab.json")
    assert name == "../../tokenizer/bpe-512-abcdef0123/vocab.json"
    assert resolve(name, ctx.output) == f"{prefix}/{tok}/.attempts/0002-0000beef/vocab.json"
    # inside its own attempt (not committed yet) a name stays there
    assert ref(ctx, ctx.path("shards/0.bin"), ctx.path("ledger")) == "../shards/0.bin"
    assert resolve("../shards/0.bin", ctx.path("ledger")) == ctx.path("shards/0.bin")
