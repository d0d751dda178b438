"""The README.md of an exported folder: the model card as the Hugging Face Hub reads it.

The Hub shows a repository's README.md and reads its YAML front matter (huggingface_hub's
`ModelCardData`): `license` (an id of the Hub's list, else `other` with `license_name` and
`license_link`), `datasets`, `language`, `tags`, `library_name`, `pipeline_tag` and
`model-index`, the evaluation results in the Papers-with-Code form the Hub turns into its
results widget. The text below it says what the model is, what it was trained on under which
licence, how (optimizer and schedule), how it scores, and what it is and is not for.

Everything comes from the card's JSON (steps/provenance/card.py `build_card`), so MODEL_CARD.md,
card.json and this page never disagree, and nothing in it names a machine, a path or a time: the
same outputs give the same bytes.
"""

from __future__ import annotations

import re
from typing import Any

from executor import License

# Licence ids of the Hub's list that are SPDX ids too (lower-cased there). A licence outside it
# is written as `other`, named and linked, as the Hub asks.
HUB_LICENSES = frozenset({
    "apache-2.0", "mit", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0",
    "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-permissive-1.0",
    "cdla-permissive-2.0", "cdla-sharing-1.0", "ecl-2.0", "epl-1.0", "epl-2.0", "eupl-1.1", "agpl-3.0",
    "gpl-2.0", "gpl-3.0", "lgpl-2.1", "lgpl-3.0", "isc", "lppl-1.3c", "ms-pl", "mpl-2.0", "odbl",
    "osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib", "pddl",
})
TAGS = ("moe", "mixture-of-experts", "custom_code", "marin-voyage")
LICENSE_SECTION = "licences"  # the README's own section that a composite licence links to


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def hub_license(card: dict[str, Any]) -> dict[str, str]:
    """`license` (and `license_name`, `license_link` for `other`) of the model: the one licence of
    all its sources when that is an SPDX id the Hub lists, else `other`, named after the licences
    it combines and linked to the README's table of sources and licences (or to the terms of a
    single non-SPDX licence)."""
    ids = sorted({lic for v in card["data"]["by_source"].values() for lic in (v["licenses"] or ["NOASSERTION"])})
    if len(ids) == 1:
        hub = ids[0].lower()
        if hub in HUB_LICENSES and License(ids[0]).spdx:
            return {"license": hub}
        link = (card["data"].get("license_links") or {}).get(ids[0]) or f"README.md#{LICENSE_SECTION}"
        return {"license": "other", "license_name": _slug(ids[0]), "license_link": link}
    return {"license": "other", "license_name": _slug("-and-".join(ids)), "license_link": f"README.md#{LICENSE_SECTION}"}


def _slug(text: str) -> str:
    """The Hub's form of a licence name: lower case, letters, digits, '-' and '.'."""
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9.-]+", "-", text.lower())).strip("-")


def model_index(card: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The evaluation as the Hub's `model-index`: one result a held-out dataset (and all of them),
    loss in nats and bits per byte; the harness's tasks as reported."""
    ev = card["evaluation"]
    results = []
    rows = [("all", "held-out windows of every source", ev["overall"])]
    rows += [(n, f"held-out windows of {n}", v) for n, v in ev["datasets"].items()]
    for key, label, v in rows:
        metrics = [{"type": "loss", "name": "held-out loss (nats per token)", "value": round(float(v["loss"]), 6)}
                   for _ in [0] if isinstance(v.get("loss"), (int, float))]
        if isinstance(v.get("bpb"), (int, float)):
            metrics.append({"type": "bits_per_byte", "name": "bits per byte", "value": round(float(v["bpb"]), 6)})
        if metrics:
            results.append({"task": {"type": "text-generation", "name": "Language modelling"},
                            "dataset": {"type": key, "name": label, "split": "held-out"}, "metrics": metrics})
    for source in ("harness", "harness_hf"):
        for task, got in (ev.get(source) or {}).items():
            metrics = [{"type": k.split(",")[0], "name": k, "value": float(v)} for k, v in sorted(got.items())
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and "stderr" not in k]
            if metrics:
                results.append({"task": {"type": "text-generation"}, "dataset": {"type": task, "name": task},
                                "metrics": metrics})
    return [{"name": name, "results": results}]


def metadata(card: dict[str, Any], name: str) -> dict[str, Any]:
    """The YAML front matter, as a dict."""
    meta: dict[str, Any] = {**hub_license(card)}
    meta["datasets"] = sorted(card["data"]["by_source"])
    if card.get("language"):
        meta["language"] = list(card["language"])
    meta["library_name"] = "transformers"
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = list(TAGS)
    meta["model-index"] = model_index(card, name)
    return meta


def readme(card: dict[str, Any], export: dict[str, Any]) -> str:
    """README.md of an exported folder. `export`: {"step" (the checkpoint's training step name),
    "checkpoint" (its step number), "dtype"}."""
    import yaml

    name = _slug(card["title"].split(" ")[0]) or "model"
    m, d, tr, ev = card["model"], card["data"], card.get("training") or {}, card["evaluation"]
    cfg = m["config"]
    total = d["total"]
    seq_len = int(card["data"].get("seq_len") or m["context"] + 1)
    out = ["---", yaml.safe_dump(metadata(card, name), sort_keys=False, allow_unicode=True).rstrip(), "---", ""]
    out += [f"# {card['title']}", "",
            f"A mixture-of-experts decoder trained with marin-voyage: "
            f"**{m['parameters']['total']:,} parameters, {m['parameters']['active']:,} active per token**, "
            f"weights in {export['dtype']}. A base model: no instruction tuning, no chat template.", "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "model = AutoModelForCausalLM.from_pretrained(REPO, trust_remote_code=True)  # the code ships here",
            "tok = AutoTokenizer.from_pretrained(REPO, trust_remote_code=True)  # it reads config.json",
            "```", ""]
    out += ["## Architecture", "",
            f"- {cfg['n_layers']} decoder layers of width {cfg['dim']}, every one a mixture-of-experts layer: "
            f"{cfg['n_experts']} routed experts (top-{cfg['top_k']}) of width {cfg['expert_dim']} and "
            f"{cfg['n_shared_experts']} shared expert(s) of the same width on every token",
            f"- attention: {cfg['n_heads']} heads of {cfg['head_dim']} with {cfg['n_kv_heads']} key/value heads "
            f"(grouped), rotary positions (theta {cfg['rope_theta']:g}); a sliding window of {cfg['sliding_window']} "
            f"tokens, with every {ordinal(int(cfg['global_every']))} layer global",
            f"- vocabulary {cfg['vocab_size']:,}; trained context **{m['context']:,} tokens**. The model has no "
            f"position table, so longer inputs run, but they are beyond what it was trained on; "
            f"`max_position_embeddings` in config.json says {m['context']:,}, and generation and lm-eval cut "
            f"inputs to it.", ""]
    out += ["## Training data", "",
            f"{len(d['by_source'])} sources, read through one mixture in {len(d['stages'])} stage(s). Counts are exact: "
            f"the sequences each training step read, from the mixture's sampler arithmetic.", "",
            "| source | licence | " + " | ".join(f"{s['phase']} tokens" for s in d["stages"]) + " | total tokens |",
            "|---|---|" + "---:|" * (len(d["stages"]) + 1)]
    for src, v in d["by_source"].items():
        per = [f"{s['by_dataset'].get(src, {}).get('tokens', 0):,}" for s in d["stages"]]
        out.append(f"| {src} | {', '.join(v['licenses']) or 'NOASSERTION'} | " + " | ".join(per) + f" | {v['tokens']:,} |")
    out += ["", f"{total['tokens']:,} tokens read in {total['sequences']:,} sequences of {seq_len} tokens. Of each "
                f"sequence, the first {seq_len - 1} tokens are inputs and the last {seq_len - 1} are the targets "
                f"(shifted by one), so the model was trained to predict "
                f"{total['sequences'] * (seq_len - 1):,} tokens: the trainer's own count in its checkpoints."]
    out += ["", f"### {LICENSE_SECTION.capitalize()}", "",
            "The weights are derived from data under these licences; each holds for the share of training it "
            "gave. Where no single licence covers them all, the metadata says `other`.", "",
            "| licence | terms | tokens |", "|---|---|---:|"]
    links = d.get("license_links") or {}
    for lic, v in d["by_license"].items():
        terms = " + ".join(f"<{links[x]}>" if links.get(x) else "-" for x in lic.split(" + "))
        out.append(f"| {lic} | {terms} | {v['tokens']:,} |")
    out += ["", "## Training", ""]
    opt, sched = tr.get("optimizer") or {}, tr.get("schedule") or {}
    if opt:
        clip = f", gradient norm clipped at {opt['grad_clip']:g}" if opt.get("grad_clip") else ", no gradient clipping"
        out.append(f"- optimizer: AdamW, peak learning rate {opt['lr']:g}, betas ({opt['beta1']:g}, {opt['beta2']:g}), "
                   f"eps {opt['eps']:g}, weight decay {opt['weight_decay']:g}{clip}")
    if sched:
        out.append(f"- schedule: linear warmup over {sched['warmup']:,} steps, constant to step {sched['decay_start']:,}, "
                   f"then linear decay to {sched['floor']:g} x the peak at step {sched['total']:,}")
    out += [f"- {m['trained_steps']:,} optimizer steps of {m['batch_size']:,} sequences: "
            + "; ".join(f"{s['phase']} steps {s['optimizer_steps'][0]:,}-{s['optimizer_steps'][1] - 1:,} "
                        f"(`{s['step']}`)" for s in d["stages"]),
            f"- exported from `{export['step']}`, checkpoint step-{export['checkpoint']}"]
    out += ["", "## Evaluation", "",
            f"Held-out windows of each source that the mixture never drew, at checkpoint step "
            f"{ev['checkpoint_step']}; the baseline is the unigram model of the trained tokens.", "",
            "| data | loss (nats) | unigram baseline | bits per byte | unigram baseline |", "|---|---:|---:|---:|---:|"]
    for label, v in [("all", ev["overall"])] + list(ev["datasets"].items()):
        out.append(f"| {label} | {_f(v.get('loss'))} | {_f(v.get('unigram_loss'))} | {_f(v.get('bpb'))} | "
                   f"{_f(v.get('unigram_bpb'))} |")
    out += ["", "## Intended use", "",
            "Research on training and evaluating mixture-of-experts language models: a base model to study, "
            "fine-tune or compare, with the provenance of every training token recorded (the upstream steps' "
            "digests are in the voyage's card.json).", "",
            "## Limitations", "",
            f"- A base model trained on {total['tokens']:,} tokens of {', '.join(d['by_source'])}: it continues text "
            "in the style of its sources, knows only what they hold, and is not tuned to follow instructions "
            "or to be safe in conversation. Do not use it for decisions about people.",
            f"- Trained on contexts of {m['context']:,} tokens; quality past that is unmeasured.",
            "- Its outputs may reproduce text of its sources; their licences (above) govern that text.",
            "- Evaluated by held-out loss only" + (" and the harness tasks above." if ev.get("harness") or
                                                   ev.get("harness_hf") else "; no downstream benchmark was run."),
            ""]
    return "\n".join(out)


def _f(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))
