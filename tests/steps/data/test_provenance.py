"""Licences through the data steps (steps.data.provenance): ingest -> dedup -> tokenizer ->
tokenize -> mixture on two small sources, run through the real runner and worker in this process.
Manifests and records carry the licences; the mixture's tokens per source and licence are exact;
a licence corrected after a cached run re-addresses the source and everything after it; a copied
prefix keeps every licence and count; records written before these fields still load."""

from executor.storage.store import Store  # outputs are read in their committed attempt
import collections
import json
import os
import random
import shutil
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from kits.vizkit import replan, run_inline  # noqa: E402

from executor import License, Step, output_of  # noqa: E402
from executor.cli import main  # noqa: E402
from executor.storage.store import Record  # noqa: E402
from steps.dedup.dedup import DedupConfig, dedup  # noqa: E402
from steps.data.formats import read_json  # noqa: E402
from steps.data.ingest import IngestConfig, ingest  # noqa: E402
from steps.data.mixture import MixtureConfig, MixtureSampler, MixtureStage, load_mixture, mixture  # noqa: E402
from steps.data.mixture import consumption  # noqa: E402
from steps.data.tokenize import TokenizeConfig, tokenize  # noqa: E402
from steps.data.tokenizer import TrainTokenizerConfig, train_tokenizer  # noqa: E402

WIKI = License("CC-BY-SA-4.0")
SYLLABLES = "ka lo mi nu pe ra si to vu xe ba do fi gu".split()


def write_corpus(folder):
    """Two sources of distinct documents (random words: dedup keeps them all)."""
    os.makedirs(folder, exist_ok=True)
    for name, n in (("web", 160), ("wiki", 120)):
        rng = random.Random(name)
        with open(os.path.join(folder, f"{name}.jsonl"), "w") as f:
            for i in range(n):
                words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(40 + i % 30)]
                f.write(json.dumps({"id": f"{name}-{i}", "text": " ".join(words)}) + "\n")


def data_voyage(corpus, web_license=None):
    """web (its licence as given; None: undeclared) and wiki (CC-BY-SA-4.0), one tokenizer, a
    two-stage mixture."""
    docs = {}
    for name, lic in (("web", web_license), ("wiki", WIKI)):
        raw = Step(f"raw/{name}", ingest, IngestConfig(input=f"{name}.jsonl", root=corpus, license=lic))
        docs[name] = Step(f"dedup/{name}", dedup, DedupConfig(documents=output_of(raw)))
    tok = Step("tokenizer/bpe", train_tokenizer, TrainTokenizerConfig(
        documents=tuple(output_of(d) for d in docs.values()), vocab_size=320, min_frequency=1))
    tokenized = {n: Step(f"tokenized/{n}", tokenize, TokenizeConfig(documents=output_of(d), tokenizer=output_of(tok),
                                                                       bos=None, eos="<|eos|>"))
                 for n, d in docs.items()}
    mix = Step("mixture/m", mixture, MixtureConfig(
        datasets={n: output_of(t) for n, t in tokenized.items()}, token_budget=17 * 600, seq_len=17, block_size=16,
        stages=(MixtureStage(0.75, {"web": 0.8, "wiki": 0.2}), MixtureStage(0.25, {"web": 0.3, "wiki": 0.7}))))
    return [mix]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("prov")
    corpus = str(root / "corpus")
    write_corpus(corpus)
    prefix = str(root / "out")
    plan, summary = run_inline(data_voyage(corpus, License("MIT")), prefix)
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    return root, corpus, prefix, plan


def _record(prefix, plan, name):
    return json.load(open(os.path.join(prefix, Store(prefix).served_dir(plan.dag[name].dirname), ".step.json")))


def _folder(prefix, plan, name):
    return os.path.join(prefix, Store(prefix).served_dir(plan.dag[name].dirname))


def test_licences_are_kept_in_every_manifest(made):
    _, _, prefix, plan = made
    mit = {"raw/web": {"id": "MIT", "url": "", "spdx": True}}
    for name in ("raw/web", "dedup/web", "tokenized/web"):
        assert read_json(os.path.join(_folder(prefix, plan, name), "manifest.json"))["licenses"] == mit, name
    mix = load_mixture(_folder(prefix, plan, "mixture/m"))
    assert mix["datasets"]["web"]["licenses"] == mit
    assert mix["datasets"]["wiki"]["licenses"] == {"raw/wiki": {"id": "CC-BY-SA-4.0", "url": "", "spdx": True}}


def test_every_record_carries_the_licences_it_consumed(made):
    _, _, prefix, plan = made
    assert _record(prefix, plan, "raw/wiki")["provenance"]["licenses"] == ["CC-BY-SA-4.0"]
    # the tokenizer learned from both sources, so everything tokenized with it carries both
    for name in ("tokenizer/bpe", "tokenized/web", "mixture/m"):
        prov = _record(prefix, plan, name)["provenance"]
        assert prov["licenses"] == ["CC-BY-SA-4.0", "MIT"], name
        assert set(prov["sources"]) == {"raw/web", "raw/wiki"}
    env = _record(prefix, plan, "mixture/m")["environment"]
    assert env["packages"]["python"] and "commit" in env["git"]


def test_mixture_tokens_per_source_and_licence_are_exact(made):
    _, _, prefix, plan = made
    tokens = _record(prefix, plan, "mixture/m")["provenance"]["tokens"]
    manifest = load_mixture(_folder(prefix, plan, "mixture/m"))
    sampler = MixtureSampler(manifest)
    drawn = collections.Counter(sampler.locate(i).dataset for i in range(len(sampler)))  # every sequence, one by one
    assert tokens["total"] == {"sequences": 600, "tokens": 600 * 17}
    assert tokens["by_source"] == {
        "raw/web": {"sequences": drawn["web"], "tokens": 17 * drawn["web"], "license": "MIT"},
        "raw/wiki": {"sequences": drawn["wiki"], "tokens": 17 * drawn["wiki"], "license": "CC-BY-SA-4.0"}}
    assert tokens["by_license"]["MIT"]["tokens"] + tokens["by_license"]["CC-BY-SA-4.0"]["tokens"] == 600 * 17
    stage0 = collections.Counter(sampler.locate(i).dataset for i in range(450))
    assert tokens["stages"][0]["by_dataset"]["wiki"]["sequences"] == stage0["wiki"] == 90  # 0.2 of 450, exactly
    # any range, e.g. the sequences of optimizer steps 7..19 at batch 16
    part = consumption(manifest, 7 * 16, 19 * 16)
    assert part["by_source"]["raw/wiki"]["sequences"] == sum(
        sampler.locate(i).dataset == "wiki" for i in range(7 * 16, 19 * 16))


def test_a_licence_corrected_after_a_cached_run_re_addresses_the_source_and_what_follows(made):
    """The licence is data: the corrected source is a new output (RUN, the reason names the
    change) and everything built from it gets a new address; the other source stays CACHED."""
    _, corpus, prefix, _ = made
    plan = replan(data_voyage(corpus, License("Apache-2.0")), prefix)
    states = {d.name: d.state for d in plan.decisions}
    assert states["raw/wiki"] == states["dedup/wiki"] == "CACHED"
    assert {n for n, s in states.items() if s == "RUN"} == {"raw/web", "dedup/web", "tokenizer/bpe", "tokenized/web",
                                                           "tokenized/wiki", "mixture/m"}
    assert "config.license" in plan["raw/web"].reason and "MIT" in plan["raw/web"].reason
    assert "Apache-2.0" in plan["raw/web"].reason


def test_a_source_without_licence_is_noassertion_everywhere(made, tmp_path):
    _, corpus, _, _ = made
    prefix = str(tmp_path / "out")
    steps = [Step("raw/web", ingest, IngestConfig(input="web.jsonl", root=corpus))]
    _, summary = run_inline(steps, prefix)
    assert summary.exit_code == 0
    plan = replan(steps, prefix)
    manifest = read_json(os.path.join(_folder(prefix, plan, "raw/web"), "manifest.json"))
    assert manifest["licenses"] == {"raw/web": {"id": "NOASSERTION", "url": "", "spdx": False}}
    assert _record(prefix, plan, "raw/web")["provenance"]["licenses"] == ["NOASSERTION"]


def test_a_copied_prefix_keeps_its_licences_and_counts(made, tmp_path, capsys):
    """The prefix copied elsewhere and the original moved away: everything is CACHED, and
    --lineage through the real CLI shows the sources, licences and token counts from the copy."""
    root, corpus, prefix, _ = made
    copy = str(tmp_path / "copy")
    shutil.copytree(prefix, copy)
    away = str(root / "away")
    shutil.move(prefix, away)
    try:
        voyage = tmp_path / "v.py"
        voyage.write_text(textwrap.dedent(f"""
            from dataclasses import dataclass
            from executor import License
            from test_provenance import data_voyage

            @dataclass(frozen=True)
            class Config:
                corpus: str = {corpus!r}

            def voyage(config: Config):
                return data_voyage(config.corpus, License("MIT"))
            """))
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        assert main([str(voyage), "--prefix", copy, "--lineage", "mixture/m"]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0] == "lineage of mixture/m: 7 upstream steps, 2 sources (CC-BY-SA-4.0, MIT)"
        assert lines[1].startswith("mixture/m  CACHED  licences CC-BY-SA-4.0, MIT  consumed 10,200 tokens: raw/web ")
        assert "(MIT); raw/wiki " in lines[1] and lines[1].endswith("(CC-BY-SA-4.0)")
        assert any("raw/wiki  CACHED  SOURCE under CC-BY-SA-4.0  120 documents" in line for line in lines)
        assert main([str(voyage), "--prefix", copy, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0].endswith(": CACHED 8")
        plan = replan(data_voyage(corpus, License("MIT")), copy)
        assert load_mixture(_folder(copy, plan, "mixture/m"))["datasets"]["web"]["licenses"]["raw/web"]["id"] == "MIT"
    finally:
        shutil.move(away, prefix)


def test_a_record_written_before_these_fields_still_loads_and_shows(made, tmp_path, capsys):
    _, _, prefix, plan = made
    path = os.path.join(_folder(prefix, plan, "dedup/wiki"), ".step.json")
    data = json.load(open(path))
    old = {k: v for k, v in data.items() if k not in ("provenance", "environment")}
    rec = Record.model_validate(old)
    assert rec.provenance == {} and rec.environment == {}
    from executor.views.lineage_view import amounts

    assert amounts(old) == "120 of 120 documents kept"
    assert amounts({"results": {}}) == "" and amounts(None) == ""


def test_datasets_made_before_licences_were_kept_count_as_unknown():
    """A mixture over token datasets whose manifests have no `licenses` (made before): counted,
    under an unknown source and NOASSERTION, never dropped."""
    manifest = {"seq_len": 4, "datasets": {"old": {}, "new": {"licenses": {"raw/n": {"id": "MIT"}}}}}
    from steps.data.mixture import tally

    got = tally(manifest, {"old": 3, "new": 5}, 0, 8)
    assert got["by_source"] == {"raw/n": {"sequences": 5, "tokens": 20, "license": "MIT"},
                                "unknown:old": {"sequences": 3, "tokens": 12, "license": "NOASSERTION"}}
    assert got["total"] == {"sequences": 8, "tokens": 32}
