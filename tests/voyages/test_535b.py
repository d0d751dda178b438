"""voyages/535b.py: the full plan with its budget, and the laptop rehearsal end to end."""

import collections
import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOYAGE = os.path.join(ROOT, "voyages", "535b.py")


@pytest.fixture(scope="module")
def v535():
    spec = importlib.util.spec_from_file_location("voyage_535b_under_test", VOYAGE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def shape(steps):
    """(kind of step, kinds of its inputs) for every step. The tokenizer is one kind: pinned from
    the hub at full scale (no inputs), trained on the deduplicated corpus on a laptop."""
    from executor.dag import build_dag

    dag = build_dag(steps)
    kind = {"pin_tokenizer": "tokenizer", "train_tokenizer": "tokenizer"}
    name = lambda n: kind.get(n.step.type.name, n.step.type.name)  # noqa: E731
    return {(name(n), frozenset(name(d) for d in n.deps) if name(n) != "tokenizer" else None)
            for n in dag}, dag


def test_full_plan_budget_and_unplaceable_steps(capsys, tmp_path):
    from executor.cli import main

    code = main([VOYAGE, "--dry-run", "--prefix", str(tmp_path / "p")])
    out = capsys.readouterr().out
    assert code == 0
    assert "plan of 30 steps" in out
    assert "533.8B total, 22.83B active" in out  # within 1% of 535.3B and 22.76B
    assert "18.75T = 15T pretrain + 3.75T midtrain (switch at 80%)" in out
    assert "11,264 x 4,096" in out and "406,395 optimizer steps" in out
    assert "= 2.70e+24" in out and "(6 x N_active" in out
    assert "days on 792 GB200" in out
    pretrain_line = next(line for line in out.splitlines() if line.startswith("pretrain/535b-a23b"))
    assert "CANNOT BE PLACED" in pretrain_line and "GB200" in pretrain_line
    assert not (tmp_path / "p").exists()


def test_laptop_has_the_same_dag_shape(v535):
    full, full_dag = shape(v535.voyage(v535.VoyageConfig()))
    laptop, laptop_dag = shape(v535.voyage(v535.VoyageConfig(laptop=True)))
    assert full == laptop
    counts = collections.Counter(n.step.type.name for n in full_dag)
    assert counts["ingest"] == counts["dedup"] == counts["tokenize"] == len(v535.FULL_SOURCES)
    mix = full_dag["mixture/535b"].step.config
    assert mix.token_budget == int(18.75e12) and mix.seq_len == 4096
    assert [round(s.fraction, 6) for s in mix.stages] == [0.8, 0.2]
    pre = full_dag["pretrain/535b-a23b"].step
    assert pre.config.data.batch_size == 11_264 and pre.resources.workers == 792
    assert pre.resources.accelerator == "GB200" and pre.config.model.preset == "535b-a23b"
    assert full_dag["tokenizer/llama3"].step.config.expect_vocab_size == 128_256


def test_laptop_voyage_end_to_end(v535, tmp_path, ray_local, monkeypatch):
    from ray import cloudpickle

    from executor.api import plan_steps, run_steps
    from executor.plan import Selection

    monkeypatch.chdir(ROOT)  # the bundled corpus is named by repository-relative paths
    cloudpickle.register_pickle_by_value(v535)
    config = v535.VoyageConfig(laptop=True)
    prefix = str(tmp_path / "out")
    plan, summary = run_steps(v535.voyage(config), prefix, voyage="535b")
    assert summary.exit_code == 0, [(o.name, o.error) for o in summary.failed]
    ev = plan.dag["eval/laptop"]
    results = json.load(open(os.path.join(prefix, ev.dirname, "results.json")))
    assert results["loss"] < 0.75 * results["unigram_loss"], results
    hf_folder_loads_and_scores(os.path.join(prefix, plan.dag["export/laptop"].dirname), tmp_path, monkeypatch)
    pages = list((tmp_path / "out" / "voyages" / "535b").glob("*/index.html"))
    assert pages, "the live page was not written"

    again, _ = plan_steps(v535.voyage(config), prefix)
    assert again.counts() == {"CACHED": len(again.decisions)}
    # dedup is deterministic: a rerun makes identical bytes, so nothing downstream goes stale
    _, summary = run_steps(v535.voyage(config), prefix, Selection(rerun=("dedup/kjv",)))
    assert summary.outcomes["dedup/kjv"].state == "SUCCESS" and summary.stale_after == []
    after, _ = plan_steps(v535.voyage(config), prefix)
    assert after.counts() == {"CACHED": len(after.decisions)}


def hf_folder_loads_and_scores(folder, tmp_path, monkeypatch):
    """The voyage's Hugging Face folder loads with transformers, generates, and lm-eval's own `hf`
    model scores it on a local task (the export itself is tested in tests/steps/export)."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))  # read when transformers is imported
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steps.export.harness_hf import run_hf_tasks
    from steps.train.eval import HarnessConfig

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(folder)
    out = model.generate(**tok("And God said", return_tensors="pt"), max_new_tokens=20, min_new_tokens=20)
    assert out.shape[1] == len(tok("And God said").input_ids) + 20
    (tmp_path / "tasks").mkdir()
    (tmp_path / "verses.jsonl").write_text(json.dumps({"text": "The LORD is my shepherd; I shall not want."}) + "\n")
    (tmp_path / "tasks" / "verses.yaml").write_text(
        "task: verses\ndataset_path: json\ndataset_kwargs: {data_files: {test: %s}}\ntest_split: test\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list: [{metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}]\n"
        % (tmp_path / "verses.jsonl"))
    for k, v in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}.items():
        monkeypatch.setenv(k, v)
    got = run_hf_tasks(folder, HarnessConfig(tasks=("verses",), include_path=str(tmp_path / "tasks")), "cpu", 4)
    assert 0 < got["verses"]["bits_per_byte,none"] < 8
