"""The model card of the laptop voyage (the session's run, tests/conftest.py):
both sources with their licences and exact token counts, eval beside its baselines, every
upstream step's digests, the code's version, and the live page's link to it."""

from executor.storage.store import Store  # outputs are read in their committed attempt
import glob
import json
import os
import re
import subprocess

import pytest

from steps.data.mixture import MixtureSampler


@pytest.fixture(scope="module")
def card(laptop_voyage):
    lv = laptop_voyage
    assert lv.summary.outcomes["card/laptop"].state == "SUCCESS", lv.summary.outcomes["card/laptop"].error
    folder = os.path.join(lv.prefix, Store(lv.prefix).served_dir(lv.plan.dag["card/laptop"].dirname))
    return lv, folder, json.load(open(os.path.join(folder, "card.json"))), open(os.path.join(folder, "MODEL_CARD.md")).read()


def test_card_names_both_sources_with_licences_and_exact_tokens(card):
    """Tokens per stage and source counted independently: every sequence of the steps trained,
    located by the sampler (a scan), times the sequence length."""
    lv, _folder, data, md = card
    sampler = MixtureSampler(os.path.join(lv.prefix, Store(lv.prefix).served_dir(lv.plan.dag["mixture/laptop"].dirname)))
    counts = {"pretrain": {}, "midtrain": {}}
    B = lv.batch_size
    for i in range(lv.steps * B):  # pretrain's steps, then midtrain's, of 32 sequences
        phase = "pretrain" if i < lv.pretrain_steps * B else "midtrain"
        name = sampler.locate(i).dataset
        counts[phase][name] = counts[phase].get(name, 0) + sampler.seq_len
    stages = {s["phase"]: {n: c["tokens"] for n, c in s["by_dataset"].items()} for s in data["data"]["stages"]}
    assert stages == counts
    licences = {"kjv": ["public domain"], "pydocs": ["PSF-2.0"]}
    for name, v in data["data"]["by_source"].items():
        assert v["licenses"] == licences[name]
        assert v["tokens"] == counts["pretrain"][name] + counts["midtrain"][name]
    assert data["data"]["total"]["tokens"] == lv.steps * B * 65 == lv.plan.dag["mixture/laptop"].step.config.token_budget
    assert data["data"]["by_license"]["PSF-2.0"]["tokens"] == data["data"]["by_source"]["pydocs"]["tokens"]
    kjv, pydocs = data["data"]["by_source"]["kjv"]["tokens"], data["data"]["by_source"]["pydocs"]["tokens"]
    assert re.search(rf"\| kjv \| public domain \| {counts['pretrain']['kjv']:,} \| {counts['midtrain']['kjv']:,} "
                     rf"\| {kjv:,} \|", md), md
    assert "| pydocs | PSF-2.0 |" in md and f"{pydocs:,}" in md and "| **all** |" in md
    # the trainer's count (predicted tokens: 819,200 in the README's 400 steps) beside the card's
    # count of tokens read (832,000 there), and why
    targets = lv.steps * B * 64
    assert data["data"]["trained_targets"] == targets
    assert f"The trainer's checkpoints count {targets:,} tokens: the predicted ones, 64 of each sequence of 65" in md
    assert data["training"]["schedule"] == {"warmup": min(30, lv.steps // 10), "decay_start": lv.pretrain_steps,
                                            "total": lv.steps, "floor": 0.1}
    assert data["training"]["optimizer"]["lr"] == 0.01 and data["language"] == ["en"]


def test_card_holds_the_model_eval_digests_and_code(card):
    lv, _folder, data, md = card
    plan = lv.plan
    assert data["model"]["parameters"] == {"total": 363_072, "active": 215_616}  # docs/training.md: tiny
    assert data["model"]["trained_steps"] == lv.steps and data["model"]["context"] == 64
    results = json.load(open(os.path.join(lv.prefix, Store(lv.prefix).served_dir(plan.dag["eval/laptop"].dirname), "results.json")))
    ev = data["evaluation"]["overall"]
    assert (ev["loss"], ev["unigram_loss"], ev["bpb"], ev["unigram_bpb"]) == (
        results["loss"], results["unigram_loss"], results["bpb"], results["unigram_bpb"])
    assert set(data["evaluation"]["datasets"]) == {"kjv", "pydocs", "heldout"}
    # decontamination: the chapters and sections holding the held-out passages (data/evals/SOURCE.md)
    removed = {d["step"]: d["removed"] for d in data["data"]["decontamination"]}
    assert removed == {"decontam/kjv": {"raw/kjv": {"heldout": 4}}, "decontam/pydocs": {"raw/pydocs": {"heldout": 2}}}
    assert "| decontam/kjv (removed, 13-grams) | raw/kjv | heldout | 4 | 1,189 |" in md
    # cross-source dedup: its counts as the dedup step recorded them, per pair of sources
    dedup = json.load(open(os.path.join(lv.prefix, Store(lv.prefix).served_dir(plan.dag["dedup/corpus"].dirname),
                                        "report.json")))
    (dd,) = data["data"]["deduplication"]
    assert dd["step"] == "dedup/corpus" and dd["documents_in"] == dedup["documents_in"] == 1_189 + 822
    assert dd["removed"] == dedup["removed"] and dd["removed_by_pair"] == dedup["removed_by_pair"]
    assert f"| dedup/corpus | {dd['documents_in']:,} | {dd['removed']:,} |" in md
    assert f"| all | {results['loss']:.4f} | {results['unigram_loss']:.4f} |" in md
    # every upstream step, by name, with the recipe and output digests the prefix holds
    upstream = plan.dag.upstream(["card/laptop"]) - {"card/laptop"}
    assert {u["name"] for u in data["upstream"]} == upstream and "export/laptop" in upstream  # the card links it
    for u in data["upstream"]:
        d = plan[u["name"]]
        assert u["digest"] == d.node.digest and u["output_digest"] == d.status.output_digest, u["name"]
        assert f"`{u['digest'][:16]}`" in md
    head = subprocess.run(["git", "-C", lv.root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert data["code"]["git"]["commit"] == head and isinstance(data["code"]["git"]["dirty"], bool)
    assert {"python", "torch", "ray", "tokenizers"} <= set(data["code"]["packages"])
    assert f"git commit `{head}`" in md


def test_live_page_links_the_card(card):
    lv, folder, _data, _md = card
    pages = glob.glob(os.path.join(lv.prefix, "voyages", "535b", "*", "index.html"))
    page = open(pages[0]).read()
    href = re.search(r'<nav id="model-cards">model card: <a href="([^"]+)">card/laptop</a></nav>', page).group(1)
    assert os.path.samefile(os.path.join(os.path.dirname(pages[0]), href), os.path.join(folder, "MODEL_CARD.md"))
    run = json.load(open(os.path.join(os.path.dirname(pages[0]), "voyage.json")))["run"]
    assert run["cards"] == {"card/laptop": href}


def test_the_card_of_a_ladder_target_carries_its_verdict(card, tmp_path):
    """A model that was a ladder's target (docs/ladder.md): its card states the sealed prediction
    and how it landed, the check's own line. The verdict is a real check's (tests/kits/ladderkit.py)."""
    from kits import ladderkit
    from steps.provenance.card import CardConfig, build_card, render

    lv = card[0]
    lad = str(tmp_path / "ladder")
    plan, summary = ladderkit.run_inline(ladderkit.all_steps(ladderkit.ladder()), lad)
    assert summary.exit_code == 0
    verdict = os.path.join(lad, Store(lad).served_dir(plan["ladder/check"].node.dirname))
    url = lambda name: os.path.join(lv.prefix, Store(lv.prefix).served_dir(lv.plan.dag[name].dirname))  # noqa: E731
    data = build_card(CardConfig(evaluation=url("eval/laptop"), training=(url("pretrain/laptop"), url("midtrain/laptop")),
                                 mixture=url("mixture/laptop"), verdict=verdict))
    line = json.load(open(os.path.join(verdict, "verdict.json")))["line"]
    assert data["prediction"]["line"] == line and line.startswith("HIT: predicted ")
    md = render(data)
    assert "### Against its sealed prediction" in md and f"**{line}**" in md
