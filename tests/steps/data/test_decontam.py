"""decontaminate: normalised 13-gram matches against eval sets (documents and lm-eval tasks),
removed or marked, counted per source and set, listed for --which-saw; a task's memory does not
grow with its shard."""

import json
import tracemalloc

import numpy as np
import pytest

from executor import VoyageError

from executor.testing import build_context
from steps.data.decontam import DecontamConfig, EvalSet, NgramHasher, _decontaminator, build_index, decontaminate, \
    read_contaminated, task_texts, words
from steps.data.shard_io import Shard
from steps.data.formats import iter_documents, read_json, write_documents, write_json

PSALM = ("The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me "
         "beside the still waters.")


def test_ngrams_are_normalised_and_short_texts_are_counted():
    assert words("Hello, WORLD! naïve_café 東京 x2") == ["hello", "world", "naïve", "café", "東京", "x2"]
    index, stats = build_index({"psalm": [PSALM, "too short to match"], "other": ["a b c"]}, 13)
    assert stats == {"psalm": {"texts": 2, "ngrams": 13, "too_short": 1}, "other": {"texts": 1, "ngrams": 0,
                                                                                   "too_short": 1}}
    h = NgramHasher(13)
    # case, punctuation and line breaks do not hide a match; 12 shared words are not one
    assert index.matches(h.ngrams("Intro.\n" + PSALM.upper().replace(";", " --"))) == ["psalm"]
    assert index.matches(h.ngrams(" ".join(PSALM.split()[:12]) + " and then something else entirely")) == []
    assert index.matches(h.ngrams("")) == []
    # a text hashes the same alone and anywhere in a batch, its words as words() splits them
    alone = NgramHasher(13).ngrams(PSALM)
    grams, owner = NgramHasher(13).batch(["x " * 5000, "", "!!", PSALM + " " + PSALM])
    assert alone.size == 13 and np.array_equal(grams[owner == 3][:13], alone) and set(owner.tolist()) == {0, 3}
    text = "Hello, WORLD! naïve_café 東京 x2  ,, a"
    hashes, _ = h.word_hashes([text, text.upper()])
    assert hashes.size == 2 * len(words(text)) and np.array_equal(hashes[:7], hashes[7:])
    with pytest.raises(VoyageError, match="exactly one of"):
        EvalSet("x")
    with pytest.raises(VoyageError, match="mode"):
        DecontamConfig(documents="d", evals=(EvalSet("x", documents="e"),), mode="drop")
    with pytest.raises(VoyageError, match="repeat"):
        DecontamConfig(documents="d", evals=(EvalSet("x", documents="e"), EvalSet("x", documents="f")))


def _corpus(tmp_path):
    docs = [{"id": f"d{i}", "text": f"plain document number {i} about nothing in particular at all today"}
            for i in range(6)]
    docs[1]["text"] = "Before. " + PSALM + " After."
    docs[4] = {"id": "d4", "text": "import os; os.path.join(a, b) joins two parts of a path into one with the "
                                    "separator of the system", "metadata": {"k": 1}}
    folder = tmp_path / "docs"
    write_documents(str(folder / "documents/00000.jsonl.zst"), docs[:3])
    write_documents(str(folder / "documents/00001.jsonl.zst"), docs[3:])
    write_json(str(folder / "manifest.json"), {
        "format": "marin-documents/1", "documents": 6,
        "shards": [{"path": "documents/00000.jsonl.zst", "documents": 3},
                   {"path": "documents/00001.jsonl.zst", "documents": 3}],
        "licenses": {"raw/src": {"id": "CC0-1.0", "url": None, "spdx": True}}})
    evals = tmp_path / "evals"
    write_documents(str(evals / "psalms.jsonl"), [{"text": PSALM}])
    write_documents(str(evals / "code.jsonl"), [{"text": "os.path.join(a, b) joins two parts of a path into one "
                                                         "with the separator"}, {"text": "short"}])
    return folder, evals


def test_contaminated_documents_are_removed_listed_and_counted(tmp_path):
    folder, evals = _corpus(tmp_path)
    ctx = build_context(str(tmp_path / "out"), name="decontam/src", digest="0" * 64)
    config = DecontamConfig(documents=str(folder), evals=(EvalSet("psalms", documents="psalms.jsonl"),
                                                           EvalSet("code", documents="code.jsonl")),
                            root=str(evals))
    decontaminate(config, ctx)
    kept = [d["id"] for k in range(2) for d in iter_documents(ctx.path(f"documents/0000{k}.jsonl.zst"))]
    assert kept == ["d0", "d2", "d3", "d5"]  # order kept
    assert read_contaminated(ctx.output) == [
        {"shard": 0, "position": 1, "id": "d1", "matches": ["psalms"]},
        {"shard": 1, "position": 1, "id": "d4", "matches": ["code"]}]
    assert ctx.results["removed"] == {"raw/src": {"psalms": 1, "code": 1}}
    assert ctx.results["evals"]["code"] == {"texts": 2, "ngrams": 4, "too_short": 1}
    manifest = read_json(ctx.path("manifest.json"))
    assert manifest["documents"] == 4 and [s["documents"] for s in manifest["shards"]] == [2, 2]
    assert manifest["decontamination"]["by_source"] == {"raw/src": {"psalms": 1, "code": 1}}
    assert ctx.provenance["licenses"] == ["CC0-1.0"]

    # mark mode: every document kept, the contaminated ones tagged
    ctx = build_context(str(tmp_path / "marked"), name="decontam/src", digest="0" * 64)
    decontaminate(DecontamConfig(documents=str(folder), evals=config.evals, root=str(evals), mode="mark"), ctx)
    docs = [d for k in range(2) for d in iter_documents(ctx.path(f"documents/0000{k}.jsonl.zst"))]
    assert [d["id"] for d in docs] == [f"d{i}" for i in range(6)]
    assert docs[1]["metadata"] == {"contamination": ["psalms"]} and docs[4]["metadata"] == {"k": 1, "contamination": ["code"]}
    assert ctx.results["marked"] == {"raw/src": {"psalms": 1, "code": 1}} and ctx.results["removed"] == {}


TASK = """
task: psalm_choice
dataset_path: json
dataset_kwargs: {data_files: {test: DATA}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]
"""


def test_an_lm_eval_task_is_read_as_the_harness_shows_it(tmp_path, monkeypatch):
    for k, v in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}.items():
        monkeypatch.setenv(k, v)
    data = tmp_path / "psalm.jsonl"
    data.write_text(json.dumps({"context": "The LORD is my shepherd; I shall not want. He maketh me to lie down in",
                                "choices": ["green pastures", "the server room"], "label": 0}) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "psalm_choice.yaml").write_text(TASK.replace("DATA", str(data)))
    texts = list(task_texts("psalm_choice", str(tasks)))
    assert texts == ["The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures",
                     "the server room"]
    with pytest.raises(Exception, match="nope"):
        list(task_texts("nope", str(tasks)))


def test_a_tasks_memory_does_not_grow_with_its_shard(tmp_path):
    """tracemalloc's peak inside the task, at 1x and 4x the documents of a shard: within 25%. The
    1x shard (3 MB) is past the reader's and the writer's 1 MB buffers, so that the fixed costs are
    all in both. (Reading the whole shard at once instead fails it: 4x.)"""
    index, _ = build_index({"psalms": [PSALM]}, 13)
    out = tmp_path / "out"
    out.mkdir()
    (out / "evals.npz").write_bytes(index.to_bytes())
    filler = " ".join(f"{chr(97 + k % 26) * 100}{k % 7}" for k in range(24))  # ~2.5 KB in few (long) words
    base = [{"id": str(i), "text": (PSALM if i % 80 == 0 else "") + filler} for i in range(1200)]
    peaks = []
    for scale in (1, 4):
        shard = str(tmp_path / f"in{scale}.jsonl")
        write_documents(shard, (dict(d, id=f"{k}-{d['id']}") for k in range(scale) for d in base))
        tracemalloc.start()
        ledger = _decontaminator(str(out), 13, "remove")(Shard(scale, shard, shard))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert ledger["documents"] == 1200 * scale and len(ledger["contaminated"]) == 15 * scale
    assert peaks[1] <= 1.25 * peaks[0], peaks
    assert np.load(out / "evals.npz")["hashes"].size == 13


def _passages(rng, vocab, count, length):
    return [" ".join(rng.choice(vocab, length)) for _ in range(count)]


def test_markup_and_accents_do_not_hide_a_span_and_clean_text_is_kept(tmp_path):
    """Planted spans: 40 eval passages, each copied (20 words of it) into a training document with
    HTML inside the span (`<em>`, `<br/>`, an entity, a link) and into one where one letter of
    the span is accented; 400 clean documents of the same words, shuffled, with the same
    markup. Default: every HTML-wrapped span found, no accented one (one accent changes a word);
    with `fold_unicode`: both; clean: none removed either way."""
    rng = np.random.default_rng(7)
    vocab = np.array([f"w{chr(97 + k % 26)}{chr(97 + k // 26 % 26)}e" for k in range(600)] + ["resume", "naive"])
    evals = _passages(rng, vocab, 40, 30)
    wrappers = [lambda w: f"<em>{w[0]}</em> " + " ".join(w[1:]),
                lambda w: " ".join(w[:7]) + "<br/>" + " ".join(w[7:]),
                lambda w: " ".join(w[:5]) + " &amp; " + " ".join(w[5:12]) + "&nbsp;" + " ".join(w[12:]),
                lambda w: "<p class=\"x\">" + " ".join(w[:9]) + " <a href='https://e.org/a b'>" + w[9] + "</a> "
                          + " ".join(w[10:]) + "</p>"]
    docs, html_ids, accent_ids = [], [], []
    for k, text in enumerate(evals):
        w = text.split()[5:25]
        docs.append({"id": f"h{k}", "text": "<div>intro text</div> " + wrappers[k % 4](w) + " <b>outro</b>"})
        html_ids.append(f"h{k}")
        w = list(w)
        w[10] = w[10].replace("e", "é", 1).upper() if k % 2 else w[10].replace("e", "e\u0301", 1)
        docs.append({"id": f"a{k}", "text": "Intro. " + " ".join(w) + " outro."})
        accent_ids.append(f"a{k}")
    for k in range(400):
        w = list(rng.choice(vocab, 40))
        docs.append({"id": f"c{k}", "text": "<p>" + " ".join(w[:20]) + "<br/>" + " &amp; ".join(w[20:25])
                                                + " <em>" + " ".join(w[25:]) + "</em></p>"})
    folder = tmp_path / "docs"
    write_documents(str(folder / "documents/00000.jsonl.zst"), docs)
    write_documents(str(tmp_path / "evals.jsonl"), [{"text": t} for t in evals])
    found = {}
    for fold in (False, True):
        ctx = build_context(str(tmp_path / f"out{fold}"), name="decontam/src", digest="0" * 64)
        decontaminate(DecontamConfig(documents=str(folder), evals=(EvalSet("planted", documents="evals.jsonl"),),
                                     root=str(tmp_path), fold_unicode=fold), ctx)
        found[fold] = {c["id"] for c in read_contaminated(ctx.output)}
    assert found[False] == set(html_ids)
    assert found[True] == set(html_ids) | set(accent_ids)
    # the option is identity: the two configs are two steps
    from executor.identity import encode
    base = DecontamConfig(documents="d", evals=(EvalSet("x", documents="e"),))
    assert "fold_unicode" not in encode(base, str)[2]  # off: left out, as every field at its default
    assert encode(DecontamConfig(documents="d", evals=base.evals, fold_unicode=True), str)[2]["fold_unicode"] == \
        ["bool", True]
    assert words("Ca<em>f</em>&eacute; na\u00efve", fold_unicode=True) == ["ca", "f", "e", "naive"]
    assert words("a < b and c > d") == ["a", "b", "and", "c", "d"]  # a "<" before a space is no tag


def test_every_task_declares_memory_and_the_index_is_built_in_tasks(tmp_path):
    """No Resources.memory_gb: the eval count, the index build (declared from the count) and the
    shard tasks each ask Ray for memory; the step's own process builds nothing."""
    import steps.data.decontam as decontam_mod
    from steps.data.budget import decontam_task_gb

    folder, evals = _corpus(tmp_path)
    asked = []

    def mapper(fn, items, resources=None):
        asked.append((fn.__name__, resources.memory_gb))
        return [fn(x) for x in items]

    ctx = build_context(str(tmp_path / "out"), name="decontam/src", digest="0" * 64, mapper=mapper)
    decontaminate(DecontamConfig(documents=str(folder), evals=(EvalSet("psalms", documents="psalms.jsonl"),
                                                               EvalSet("code", documents="code.jsonl")),
                                 root=str(evals)), ctx)
    ngrams = sum(v["ngrams"] for v in ctx.results["evals"].values())
    assert asked == [("_count_ngrams", 0.5), ("_build_index", decontam_mod.build_gb(13 + 4)),
                     ("_shard_task", decontam_task_gb(ngrams))]
