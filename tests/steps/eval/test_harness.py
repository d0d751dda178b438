"""lm-eval-harness against our checkpoints: the adapter's log-likelihoods equal the model's own,
and an eval step runs three harness tasks (multiple choice, rolling log-likelihood, greedy
generation) defined over a local data file, with no network."""

import json
import math
import os
import sys

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval==0.4.13)")

from kits.trainkit import make_mixture, run_step  # noqa: E402

from steps.train.config import DataConfig, OptimizerConfig, TrackerConfig, TrainConfig, TrainerConfig  # noqa: E402
from steps.eval.evaluate import EvalConfig, HarnessConfig, evaluate  # noqa: E402
from steps.train.pretrain import pretrain  # noqa: E402

TASKS = {
    "verse_choice": """
task: verse_choice
dataset_path: json
dataset_kwargs: {data_files: {test: DATA}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]
""",
    "verse_perplexity": """
task: verse_perplexity
dataset_path: json
dataset_kwargs: {data_files: {test: DATA}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{context}} {{choices[label]}}"
metric_list:
  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}
""",
    "verse_complete": """
task: verse_complete
dataset_path: json
dataset_kwargs: {data_files: {test: DATA}}
test_split: test
output_type: generate_until
doc_to_text: "{{context}}"
doc_to_target: "{{choices[label]}}"
generation_kwargs: {until: ["\\n", "."], max_gen_toks: 6, do_sample: false}
metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]
""",
}
DOCS = [
    {"context": "In the beginning God created the", "choices": [" heaven", " keyboard"], "label": 0},
    {"context": "And God said, Let there be", "choices": [" light", " compilers"], "label": 0},
    {"context": "The LORD is my", "choices": [" shepherd", " subprocess"], "label": 0},
    {"context": "import os and call", "choices": [" os.path.join", " the waters"], "label": 0},
]


@pytest.fixture(scope="module")
def trained(tokens, tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    mix = make_mixture(tokens, root / "mix", sequences=480)
    cfg = TrainConfig(data=DataConfig(mixture=mix, batch_size=16), optimizer=OptimizerConfig(lr=1e-2, warmup_steps=3),
                      trainer=TrainerConfig(checkpoint_every=100, tracker=TrackerConfig(kind="none")))
    return run_step(pretrain, cfg, root / "pre", name="pre").output


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_adapter_loglikelihood_is_the_models_own(trained, tokens):
    import torch
    import torch.nn.functional as F
    from lm_eval.api.instance import Instance

    from steps.data.tokenizer import load_tokenizer
    from steps.train import checkpoint
    from steps.eval.evaluate import load_model
    from steps.eval.harness import HarnessLM

    found = checkpoint.resolve(trained, "checkpoint")
    meta = checkpoint.read_meta(found.url)
    model = load_model(found.url, meta, torch.device("cpu"))
    tok = load_tokenizer(tokens["tokenizer"])
    lm = HarnessLM(model, tok, torch.device("cpu"), max_length=32, eot_id=tok.token_to_id("<|eos|>"))
    req = Instance("loglikelihood", {}, ("In the beginning God created the ", "heaven"), 0)
    (score, greedy), = lm.loglikelihood([req])
    ids = [tok.token_to_id("<|eos|>")] + tok.encode("In the beginning God created the").ids
    cont = tok.encode(" heaven").ids
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids + cont[:-1]]))
    logp = F.log_softmax(logits[0], -1)[len(ids) - 1:]
    assert score == pytest.approx(sum(logp[i, t].item() for i, t in enumerate(cont)), abs=1e-4)
    rolling, = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("word " * 50,), 0)])
    assert rolling < 0 and math.isfinite(rolling)
    text, = lm.generate_until([Instance("generate_until", {}, ("The LORD", {"until": ["\n"], "max_gen_toks": 4}), 0)])
    assert isinstance(text, str) and "\n" not in text


def test_eval_step_runs_harness_tasks_from_a_local_file(trained, tmp_path, offline):
    data = tmp_path / "verses.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, text in TASKS.items():
        (tasks / f"{name}.yaml").write_text(text.replace("DATA", str(data)))
    harness = HarnessConfig(tasks=tuple(TASKS), include_path=str(tasks))
    ev = run_step(evaluate, EvalConfig(checkpoint=trained, max_sequences=16, harness=harness), tmp_path / "eval")
    got = json.load(open(tmp_path / "eval/results.json"))["harness"]
    assert set(got) == set(TASKS)
    assert 0 <= got["verse_choice"]["acc,none"] <= 1
    assert got["verse_perplexity"]["bits_per_byte,none"] > 0
    assert 0 <= got["verse_complete"]["exact_match,none"] <= 1
    assert ev.results["harness"] == got
