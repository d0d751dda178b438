"""The laptop voyage's export is a folder the Hub takes as it is. Its files are
only the model's; README.md's metadata is what huggingface_hub's own parser reads (licence,
datasets, language, tags, model-index with eval's figures); no path of this machine; transformers
loads it, tokenizes past the trained context and generates with no warning; the card links it."""

import json
import logging
import os
import warnings

import pytest

from executor.storage.store import Store

HUB_FILES = {"README.md", "config.json", "configuration_marin_moe.py", "modeling_marin_moe.py",
             "generation_config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


@pytest.fixture(scope="module")
def hub(laptop_voyage):
    lv = laptop_voyage
    assert lv.summary.outcomes["export/laptop"].state in ("SUCCESS", "CACHED")
    from steps.export.to_hf import HF_DIR

    # the output's path as the executor resolves it (plan.path), the Hub folder inside it
    folder = os.path.join(lv.plan.path(lv.plan.dag["export/laptop"]), HF_DIR)
    results = json.load(open(os.path.join(lv.plan.path(lv.plan.dag["eval/laptop"]), "results.json")))
    return lv, folder, results


def test_the_folder_holds_only_the_model_and_no_path_of_this_machine(hub):
    lv, folder, _ = hub
    assert set(os.listdir(folder)) == HUB_FILES  # no .status, .lease, .step.json: those stay one level up
    here = {lv.prefix, os.path.dirname(lv.prefix), lv.ran_at, lv.root, os.path.expanduser("~")}
    for name in HUB_FILES - {"model-00001-of-00001.safetensors"}:
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        assert not [p for p in here if p in text], name
    readme = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "2th" not in readme and "every 2nd layer global" in readme


def test_huggingface_hub_reads_the_metadata(hub):
    """The Hub's own parser: licence `other` (public domain + PSF-2.0 is no single SPDX id), named and
    linked; datasets, language, tags; every result of model-index equal to eval's results.json."""
    from huggingface_hub import ModelCard

    lv, folder, results = hub
    card = ModelCard.load(os.path.join(folder, "README.md"))
    data = card.data
    assert (data.license, data.license_name) == ("other", "psf-2.0-and-public-domain")
    assert data.license_link == "README.md#licences" and "### Licences" in card.text
    assert data.datasets == ["kjv", "pydocs"] and data.language == ["en"]
    assert {"moe", "custom_code"} <= set(data.tags)
    assert (data.library_name, data.pipeline_tag) == ("transformers", "text-generation")
    got = {(r.dataset_type, r.metric_type): r.metric_value for r in data.eval_results}
    want = {("all", "loss"): results["loss"], ("all", "bits_per_byte"): results["bpb"]}
    for name, v in results["datasets"].items():
        want.update({(name, "loss"): v["loss"], (name, "bits_per_byte"): v["bpb"]})
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-6 for k in want)
    for heading in ("## Architecture", "## Training data", "## Training", "## Evaluation", "## Intended use",
                    "## Limitations"):
        assert heading in card.text
    text = card.text
    warmup = min(30, lv.steps // 10)  # the recipe's 30, or a tenth of the tests' shorter run
    assert "optimizer: AdamW, peak learning rate 0.01" in text and f"linear warmup over {warmup} steps" in text
    # the two token counts, both said, and why they differ (832,000 and 819,200 in the README's 400 steps)
    sequences = lv.steps * lv.batch_size
    assert f"{sequences * 65:,} tokens read in {sequences:,} sequences of 65 tokens" in text
    assert f"predict {sequences * 64:,} tokens" in text


def test_transformers_loads_it_with_no_warning(hub, hf_modules):
    """Config, tokenizer and model through the Auto classes; a text longer than the trained context
    is tokenized and run with no warning (no false "indexing errors": there is no position table)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _lv, folder, _ = hub
    said = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                said.append(record.getMessage())

    handler = Keep()
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
            model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
            ids = tok("In the beginning God created the heaven and the earth. " * 12, return_tensors="pt").input_ids
            assert ids.shape[1] > model.config.max_position_embeddings == 64
            with torch.no_grad():
                logits = model(ids).logits
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert torch.isfinite(logits).all()
    assert said == [] and [str(w.message) for w in caught] == []


def test_the_card_links_the_export(hub):
    lv, _folder, _ = hub
    card = json.load(open(os.path.join(lv.prefix, Store(lv.prefix).served_dir(lv.plan.dag["card/laptop"].dirname), "card.json")))
    record = json.load(open(os.path.join(lv.prefix, Store(lv.prefix).served_dir(lv.plan.dag["export/laptop"].dirname), ".step.json")))
    assert card["export"] == {"step": "export/laptop", "output_digest": record["output_digest"], "folder": "hf"}


def test_the_hub_licence_is_one_spdx_id_or_other_named_and_linked():
    from steps.provenance.hub_card import hub_license, ordinal

    def card(*licences, links=None):
        return {"data": {"by_source": {f"s{i}": {"licenses": [lic]} for i, lic in enumerate(licences)},
                         "license_links": links or {}}}

    assert hub_license(card("CC-BY-4.0", "CC-BY-4.0")) == {"license": "cc-by-4.0"}
    assert hub_license(card("NVIDIA data agreement", links={"NVIDIA data agreement": "https://x/terms"})) == {
        "license": "other", "license_name": "nvidia-data-agreement", "license_link": "https://x/terms"}
    assert hub_license(card("GPL-3.0-only")) == {"license": "other", "license_name": "gpl-3.0-only",
                                                 "license_link": "README.md#licences"}
    assert hub_license(card("CC-BY-4.0", "MIT"))["license_name"] == "cc-by-4.0-and-mit"
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_the_readme_snippet_runs_as_written_on_the_laptop_prefix(hub, hf_modules, tmp_path, monkeypatch):
    """README.md's Python block, as written, from a folder whose `out` is the laptop voyage's
    prefix: every path it names exists (the export's alias), and it loads the model."""
    import re

    lv, folder, _ = hub
    readme = open(os.path.join(lv.root, "README.md"), encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "from_pretrained" in b]
    assert len(blocks) == 1
    paths = set(re.findall(r'"(out/[^"]+)"', blocks[0]))
    assert paths == {"out/export/laptop/hf"}
    os.symlink(lv.prefix, tmp_path / "out")
    monkeypatch.chdir(tmp_path)
    assert os.path.realpath("out/export/laptop/hf") == os.path.realpath(folder)  # the served attempt
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert scope["model"].config.model_type and scope["tokenizer"]("In the beginning").input_ids
