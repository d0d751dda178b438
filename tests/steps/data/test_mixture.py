"""mixture: validation, exact quotas, stage switch, random access, worker order, epochs."""

import collections

import numpy as np
import pytest

from executor import VoyageError

from executor.testing import build_context
from steps.data.formats import TOKENS_FORMAT, TokenDataset, TokenShardWriter, read_json, write_json
from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, feistel, mixture, plan_mixture

DATASETS = {"web": "u1", "code": "u2", "books": "u3"}


def _config(**kw):
    kw.setdefault("datasets", DATASETS)
    kw.setdefault("token_budget", 64 * 20_011)
    kw.setdefault("seq_len", 64)
    if "stages" not in kw:
        kw.setdefault("weights", {"web": 0.6, "code": 0.3, "books": 0.1})
    return MixtureConfig(**kw)


SIZES = {"web": 64 * 30_000 + 5, "code": 64 * 4_000, "books": 64 * 500}


@pytest.mark.parametrize("weights,message", [
    ({"web": -1.0, "code": 2.0}, r"negative weights for \['web'\]"),
    ({"web": 1.0, "wiki": 1.0}, r"unknown datasets \['wiki'\]"),
    ({"web": 0.0, "code": 0.0}, "sum to zero"),
    ({"web": float("nan")}, "non-finite"),
])
def test_bad_weights_name_the_culprit(weights, message):
    with pytest.raises(VoyageError, match=message):
        _config(weights=weights)


def test_bad_stages_and_sizes():
    with pytest.raises(VoyageError, match="stages\\[1\\]"):
        _config(stages=(MixtureStage(0.5, {"web": 1}), MixtureStage(0.5, {"nope": 1})))
    with pytest.raises(VoyageError, match="sum to 0.9"):
        _config(stages=(MixtureStage(0.5, {"web": 1}), MixtureStage(0.4, {"code": 1})))
    with pytest.raises(VoyageError, match="either"):
        _config(weights={"web": 1}, stages=(MixtureStage(1.0, {"web": 1}),))
    with pytest.raises(VoyageError, match="token_budget"):
        _config(token_budget=10)
    with pytest.raises(VoyageError, match="less than one sequence"):
        plan_mixture(_config(), {**SIZES, "books": 10})


def test_realized_shares_and_exact_block_quotas():
    manifest = plan_mixture(_config(block_size=1000), SIZES)
    s = MixtureSampler(manifest)
    names = [s.locate(i).dataset for i in range(len(s))]
    counts = collections.Counter(names)
    for name, w in {"web": 0.6, "code": 0.3, "books": 0.1}.items():
        assert abs(counts[name] / len(s) - w) <= 3 / len(s)
    # every full block holds its exact quota
    for j in range(5):
        block = collections.Counter(names[j * 1000:(j + 1) * 1000])
        assert abs(block["books"] - 100) <= 1 and sum(block.values()) == 1000
    assert manifest["draws"] == dict(counts)


def test_stage_switch_is_exact():
    cfg = _config(stages=(MixtureStage(0.8, {"web": 1.0}), MixtureStage(0.2, {"books": 1.0})))
    manifest = plan_mixture(cfg, SIZES)
    s = MixtureSampler(manifest)
    boundary = manifest["stages"][1]["start"]
    assert boundary == round(0.8 * (cfg.token_budget // cfg.seq_len))
    assert {s.locate(i).dataset for i in range(boundary)} == {"web"}
    assert {s.locate(i).dataset for i in range(boundary, len(s))} == {"books"}
    assert s.stage_of(boundary - 1) == 0 and s.stage_of(boundary) == 1


def test_draws_continue_across_stages_and_epochs_are_permutations():
    cfg = _config(stages=(MixtureStage(0.5, {"web": 0.5, "books": 0.5}), MixtureStage(0.5, {"books": 1.0})))
    manifest = plan_mixture(cfg, SIZES)
    s = MixtureSampler(manifest)
    locs = [s.locate(i) for i in range(len(s))]
    books = [loc for loc in locs if loc.dataset == "books"]
    assert sorted(loc.draw for loc in books) == list(range(len(books)))
    for epoch in range(3):
        seqs = [loc.sequence for loc in books if loc.epoch == epoch]
        assert sorted(seqs) == list(range(500))
    assert manifest["epochs"]["books"] == pytest.approx(len(books) / 500)
    assert manifest["warnings"] and "books" in manifest["warnings"][0]


def test_random_access_is_order_free_and_workers_partition_the_stream():
    manifest = plan_mixture(_config(seed=5), SIZES)
    a, b = MixtureSampler(manifest), MixtureSampler(manifest)
    forward = [a.locate(i) for i in range(0, 6000)]
    backward = [b.locate(i) for i in reversed(range(0, 6000))][::-1]
    assert forward == backward
    for workers in (1, 3, 8):
        streams = [list(a.worker_indices(w, workers)) for w in range(workers)]
        merged = sorted(i for s in streams for i in s)
        assert merged == list(range(len(a)))
    # resuming worker 2 of 4 at step 100 continues exactly where it would have been
    full = list(a.worker_indices(2, 4))
    assert list(a.worker_indices(2, 4, start=100))[:5] == full[100:105]
    other_seed = MixtureSampler(plan_mixture(_config(seed=6), SIZES))
    assert [other_seed.locate(i).dataset for i in range(200)] != [loc.dataset for loc in forward[:200]]


def test_feistel_is_a_permutation():
    for n in (1, 2, 3, 17, 1000, 4097):
        assert sorted(feistel(i, n, (1, 2)) for i in range(n)) == list(range(n))
    assert [feistel(i, 1000, (1,)) for i in range(10)] != [feistel(i, 1000, (2,)) for i in range(10)]


def test_mixture_step_reads_token_datasets(tmp_path):
    urls = {}
    for name, n in (("a", 1000), ("b", 333)):
        root = str(tmp_path / name)
        with TokenShardWriter(f"{root}/shards", "00000", np.uint16) as w:
            w.write(np.arange(n, dtype=np.uint16) % 5000 + (10000 if name == "b" else 0), np.array([n]))
        write_json(f"{root}/manifest.json", {"format": TOKENS_FORMAT, "dtype": "uint16", "tokens": n, "documents": 1,
                                             "shards": [{"name": "00000", "tokens": n, "documents": 1}]})
        urls[name] = root
    ctx = build_context(str(tmp_path / "mix"), name="t", digest="0" * 64)
    mixture(MixtureConfig(datasets=urls, weights={"a": 3, "b": 1}, token_budget=4000, seq_len=10, block_size=16), ctx)
    assert ctx.results["sequences"] == 400 and ctx.results["tokens"] == 4000
    s = MixtureSampler(ctx.output)
    assert read_json(ctx.path("mixture.json"))["datasets"]["a"]["tokens"] == 1000
    for i in range(len(s)):
        loc, seq = s.locate(i), s.sequence(i)
        assert seq.size == 10
        expected = TokenDataset(urls[loc.dataset]).tokens(loc.token_start, 10)
        assert np.array_equal(seq, expected) and (seq >= 10000).all() == (loc.dataset == "b")
