"""lm-eval-harness both ways: the eval step runs local tasks through our
adapter on the checkpoint and through lm-eval's own `hf` model (transformers, trust_remote_code)
on its export; the scores agree to 1e-6. No network: the tasks read a local JSONL file.

A rolling log-likelihood task (texts of one to three windows) and a greedy generation task: both
sides condition them alike. Multiple-choice log-likelihoods differ by design: our adapter puts the
end-of-text token before each context, the `hf` model only before an empty one
(docs/export.md)."""

import json

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[eval]')")

from steps.eval.evaluate import EvalConfig, HarnessConfig, evaluate  # noqa: E402
from kits.trainkit import run_step  # noqa: E402  (on sys.path through conftest)

TASKS = {
    "psalm_perplexity": """
task: psalm_perplexity
dataset_path: json
dataset_kwargs: {data_files: {test: DATA}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}
""",
    "psalm_complete": """
task: psalm_complete
dataset_path: json
dataset_kwargs: {data_files: {test: DATA}}
test_split: test
output_type: generate_until
doc_to_text: "{{context}}"
doc_to_target: "{{choices[label]}}"
generation_kwargs: {until: ["\\n"], max_gen_toks: 6, do_sample: false}
metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]
""",
}
DOCS = [
    # texts of one, two and three windows of the trained context (32 tokens)
    {"text": "The LORD is my shepherd; I shall not want.", "context": "The LORD is my", "choices": [" shepherd"],
     "label": 0},
    {"text": "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
             "darkness was upon the face of the deep.", "context": "In the beginning God", "choices": [" created"],
     "label": 0},
    {"text": "The os.path module implements some useful functions on pathnames. To read or write files see open(), "
             "and for accessing the filesystem see the os module." * 2, "context": "import os and call",
     "choices": [" os.path.join"], "label": 0},
]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_eval_step_scores_a_local_task_both_ways(laptop, exported, tmp_path, offline):
    data = tmp_path / "psalms.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, text in TASKS.items():
        (tasks / f"{name}.yaml").write_text(text.replace("DATA", str(data)))
    harness = HarnessConfig(tasks=tuple(TASKS), include_path=str(tasks), hf_model=exported["path"])
    ev = run_step(evaluate, EvalConfig(checkpoint=laptop["midtrain"], max_sequences=8, harness=harness), tmp_path / "ev")
    ours, theirs = ev.results["harness"], ev.results["harness_hf"]
    assert set(ours) == set(theirs) == set(TASKS)
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert theirs["psalm_perplexity"][metric] == pytest.approx(ours["psalm_perplexity"][metric], rel=1e-6, abs=1e-6)
    assert theirs["psalm_complete"]["exact_match,none"] == ours["psalm_complete"]["exact_match,none"]
    assert json.load(open(tmp_path / "ev/results.json"))["harness_hf"] == theirs
