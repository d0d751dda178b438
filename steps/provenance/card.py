"""card: the model card of a trained, evaluated model, `MODEL_CARD.md` and `card.json`.

    card = Step("card/laptop", model_card, CardConfig(evaluation=output_of(ev),
                training=(output_of(pre), output_of(mid)), mixture=output_of(mix), export=output_of(ex)))

A step of its own after eval (not eval itself): the card is cheap and is rewritten whenever its
code or any upstream output changes, while eval of a 535B checkpoint needs GPUs; and the card
describes eval's results, so it comes after them. What it holds, each read from the outputs:

- the architecture and its parameter counts (total, active), from the newest checkpoint's
  `meta.json` of the last training step;
- tokens per stage, per source and per licence: exact, from the mixture's sampler arithmetic over
  the sequences each training step actually trained (its newest checkpoint's step; step s reads
  sequences s*B .. s*B+B-1), the same counts the training records carry (`provenance.tokens`)
  where they do, which the card prefers;
- the evaluation results beside their baselines (the unigram model of the trained tokens; the
  harness's tasks when run);
- every upstream step, by walking the records (`.step.json`) from the card's inputs: name, step
  type and version, recipe digest, output digest, and the code version it recorded;
- the code version of the card itself (git commit and whether the tree was dirty) and the
  versions of the key packages.

Nothing in the card depends on the time or the prefix: the same outputs and code give the same
bytes, so an identical rerun cuts off. Torch-free.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor import InputPath, StepContext, VoyageError, step_type
from executor import logical_url as logical
from executor import served_url as served
from steps.data.formats import join, read_json, write_bytes
from steps.data.mixture import consumption, load_mixture
from steps.moe.config import MoEConfig, param_counts
from steps.provenance.which_saw import checkpoints_in

CARD_MD, CARD_JSON = "MODEL_CARD.md", "card.json"
PACKAGES = ("torch", "ray", "tokenizers", "triton", "numpy", "transformers", "lm_eval")
RECORD = ".step.json"


@dataclass(frozen=True)
class CardConfig:
    """What the card describes: the eval step's output, the training steps in order, the mixture
    they read, and optionally the Hugging Face export."""

    evaluation: InputPath  # output_of(eval step)
    training: tuple[InputPath, ...]  # output_of(pretrain), output_of(midtrain): in order
    mixture: InputPath  # output_of(mixture step)
    export: InputPath | None = None  # output_of(export_hf step)
    # dataset -> licence as the voyage declares it; used for a dataset whose manifests carry none
    licenses: dict[str, str] = field(default_factory=dict)
    title: str = ""
    language: tuple[str, ...] = ()  # ISO 639-1 codes of the sources' text (the Hub's `language`)
    # a ladder's check step (steps/ladder/steps.py), when the model was the target of a sealed
    # prediction: its verdict goes into the card (docs/ladder.md)
    verdict: InputPath | None = None

    def __post_init__(self) -> None:
        if not self.training:
            raise VoyageError("card: training names no training step (give output_of(pretrain), output_of(midtrain))")


@step_type(version="3")  # 2: the optimizer, the schedule, licence links and languages; 3: dedup counts
def model_card(config: CardConfig, ctx: StepContext) -> None:
    """Write MODEL_CARD.md and card.json: architecture, tokens per stage, source and licence,
    evaluation against its baselines, every upstream step's digests, the code's version."""
    card = build_card(config)
    write_bytes(ctx.path(CARD_JSON), (json.dumps(card, indent=1, sort_keys=True) + "\n").encode())
    write_bytes(ctx.path(CARD_MD), render(card).encode())
    ctx.results.update(model_card=CARD_MD, card=CARD_JSON, parameters=card["model"]["parameters"],
                       tokens=card["data"]["total"], sources=card["data"]["by_source"],
                       licenses=card["data"]["by_license"])


def build_card(config: CardConfig) -> dict[str, Any]:
    """The card as plain JSON (what card.json holds)."""
    mixture = load_mixture(config.mixture)
    licenses = dataset_licenses(mixture, config.licenses)
    stages, last_meta, last_record = [], None, {}
    for url in config.training:
        record = last_record = _record(url)
        steps = checkpoints_in(url)
        if not steps:
            raise VoyageError(f"card: {url} holds no checkpoint")
        meta = read_json(join(url, f"checkpoints/step-{steps[-1]}/meta.json"))
        last_meta = meta
        stages.append(stage_tokens(record, meta, mixture, licenses))
    model = dict(last_meta["model"])
    cfg = MoEConfig(**{f.name: model[f.name] for f in dataclasses.fields(MoEConfig) if f.name in model})
    total, active = param_counts(cfg)
    results = read_json(join(config.evaluation, "results.json"))
    upstream = upstream_records([config.evaluation, *config.training, config.mixture,
                                 *([config.export] if config.export else [])])
    names = {u["name"] for u in upstream}
    title = config.title or next((u["name"] for u in upstream if u["step_type"] in ("midtrain", "pretrain")), "model")
    return {
        "format": "marin-model-card/1",
        "title": title,
        "model": {"architecture": "MoE decoder (steps/moe/model.py)", "config": model,
                  "parameters": {"total": total, "active": active}, "context": int(last_meta["seq_len"]) - 1,
                  "trained_steps": int(last_meta["step"]), "batch_size": int(last_meta["batch_size"])},
        "data": {"stages": stages, **_sum_stages(stages, licenses), "decontamination": decontamination(upstream),
                 "deduplication": deduplication(upstream),
                 "license_links": license_links(mixture), "seq_len": int(last_meta["seq_len"]),
                 # the trainer counts predicted tokens: seq_len - 1 targets a sequence read
                 "trained_targets": int(last_meta["tokens"]) if "tokens" in last_meta else None},
        "training": optimization(last_record, last_meta),
        "language": list(config.language),
        "evaluation": evaluation(results),
        "export": _name_of(config.export, upstream) if config.export else None,
        "upstream": upstream,
        "code": environment(),
        "steps": sorted(names),
        **({"prediction": read_json(join(config.verdict, "verdict.json"))} if config.verdict else {}),
    }


# -- tokens ---------------------------------------------------------------------------------------

def dataset_licenses(mixture: dict[str, Any], declared: dict[str, str]) -> dict[str, list[str]]:
    """dataset -> the licence ids of its sources: from the mixture's manifest (`licenses`, written
    from the documents' manifests) where it carries them, else as the voyage declares them."""
    out = {}
    for name, info in sorted(mixture["datasets"].items()):
        found = info.get("licenses") or {}
        ids = sorted({(v.get("id") if isinstance(v, dict) else str(v)) for v in found.values()})
        out[name] = ids or ([declared[name]] if name in declared else ["NOASSERTION"])
    return out


def license_links(mixture: dict[str, Any]) -> dict[str, str]:
    """licence id -> the URL of its terms: what the sources declared, else SPDX's page of the id."""
    out: dict[str, str] = {}
    for info in mixture["datasets"].values():
        for v in (info.get("licenses") or {}).values():
            if isinstance(v, dict) and v.get("id"):
                url = v.get("url") or (f"https://spdx.org/licenses/{v['id']}.html" if v.get("spdx") else "")
                if url:
                    out.setdefault(v["id"], url)
    return dict(sorted(out.items()))


def optimization(record: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The optimizer of the last training step (from its record's config) and the learning-rate
    schedule it implies over the whole run (steps.train.config.OptimizerConfig.schedule)."""
    from steps.train.config import OptimizerConfig

    given = ((record.get("config") or {}).get("optimizer")) or {}
    names = {f.name for f in dataclasses.fields(OptimizerConfig)}
    opt = OptimizerConfig(**{k: v for k, v in given.items() if k in names})
    sched = opt.schedule(int(meta.get("total_steps") or meta["step"]), int(meta.get("switch_step") or 0))
    return {"optimizer": dataclasses.asdict(opt), "schedule": dataclasses.asdict(sched)}


def stage_tokens(record: dict[str, Any], meta: dict[str, Any], mixture: dict[str, Any],
                 licenses: dict[str, list[str]]) -> dict[str, Any]:
    """One training step's exact consumption: the sequences of the optimizer steps it trained
    (its phase's first step to its newest checkpoint), per dataset and per licence."""
    batch, phase, done = int(meta["batch_size"]), str(meta.get("phase", record.get("step_type"))), int(meta["step"])
    first = 0 if phase == "pretrain" else int(meta.get("switch_step", 0))
    by_dataset = {n: {"sequences": v["sequences"], "tokens": v["tokens"]}
                  for n, v in consumption(mixture, first * batch, done * batch)["by_dataset"].items() if v["sequences"]}
    recorded = (record.get("provenance") or {}).get("tokens") or {}
    if recorded.get("by_dataset"):  # the training record's own count wins
        by_dataset = {n: {"sequences": int(v["sequences"]), "tokens": int(v["tokens"])}
                      for n, v in recorded["by_dataset"].items()}
    return {"step": record.get("name", ""), "phase": phase, "optimizer_steps": [first, done],
            "sequences": [first * batch, done * batch], "by_dataset": by_dataset,
            "by_license": _by_license(by_dataset, licenses)}


def _by_license(by_dataset: dict[str, dict[str, int]], licenses: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, c in by_dataset.items():
        key = " + ".join(licenses.get(name, ["NOASSERTION"]))  # a dataset of several sources: their licences
        slot = out.setdefault(key, {"sequences": 0, "tokens": 0})
        slot["sequences"] += c["sequences"]
        slot["tokens"] += c["tokens"]
    return dict(sorted(out.items()))


def _sum_stages(stages: list[dict[str, Any]], licenses: dict[str, list[str]]) -> dict[str, Any]:
    by_source: dict[str, dict[str, Any]] = {}
    for st in stages:
        for name, c in st["by_dataset"].items():
            slot = by_source.setdefault(name, {"sequences": 0, "tokens": 0, "licenses": licenses.get(name, [])})
            slot["sequences"] += c["sequences"]
            slot["tokens"] += c["tokens"]
    plain = {n: {"sequences": v["sequences"], "tokens": v["tokens"]} for n, v in by_source.items()}
    total = {"sequences": sum(v["sequences"] for v in plain.values()), "tokens": sum(v["tokens"] for v in plain.values())}
    return {"by_source": dict(sorted(by_source.items())), "by_license": _by_license(plain, licenses), "total": total}


# -- evaluation, upstream, environment -----------------------------------------------------------

def evaluation(results: dict[str, Any]) -> dict[str, Any]:
    """Eval's figures with their baselines: loss and bits per byte against the unigram model of
    the trained tokens, overall and per dataset; harness tasks as reported."""
    keys = ("loss", "unigram_loss", "bpb", "unigram_bpb", "sequences", "tokens")
    out = {"checkpoint_step": results.get("step"),
           "overall": {k: results[k] for k in ("loss", "unigram_loss", "bpb", "unigram_bpb") if k in results},
           "datasets": {n: {k: v[k] for k in keys if k in v} for n, v in sorted((results.get("datasets") or {}).items())}}
    for key in ("harness", "harness_hf"):
        if results.get(key):
            out[key] = results[key]
    return out


def decontamination(upstream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per decontaminate step upstream: its mode, n-gram and documents removed (or marked) per
    source and eval set."""
    return [dict(u["decontamination"], step=u["name"]) for u in upstream if u.get("decontamination")]


def deduplication(upstream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dedup step upstream: documents in and removed, exact and fuzzy, and (a dedup of several
    sources) the removals per pair of sources ("A <- B": documents of A whose keeper is in B)."""
    return [dict(u["deduplication"], step=u["name"]) for u in upstream if u.get("deduplication")]


def upstream_records(urls: list[str]) -> list[dict[str, Any]]:
    """Every step upstream of `urls` (included), by their records' inputs, breadth first: name,
    step type, version, recipe and output digests, and the environment it recorded. Inputs are
    found by name and digest under the same prefix (never by the absolute path a record keeps),
    so a copied prefix reads its own copy."""
    seen: dict[str, dict[str, Any]] = {}
    queue = []
    for url in urls:
        rec = _record(url)
        queue.append((url, rec))
    while queue:
        url, rec = queue.pop(0)
        if rec["name"] in seen:
            continue
        env = rec.get("environment") or {}
        seen[rec["name"]] = {"name": rec["name"], "step_type": rec.get("step_type"), "version": rec.get("version"),
                             "digest": rec.get("digest"), "output_digest": rec.get("output_digest"),
                             "git": env.get("git"), "licenses": (rec.get("provenance") or {}).get("licenses")}
        if rec.get("step_type") == "decontaminate":  # its counts go into the card's data section
            seen[rec["name"]]["decontamination"] = {k: (rec.get("results") or {}).get(k)
                                                    for k in ("mode", "ngram", "documents", "contaminated", "removed",
                                                              "marked")}
        if rec.get("step_type") == "dedup":  # its counts too
            seen[rec["name"]]["deduplication"] = {k: (rec.get("results") or {}).get(k)
                                                  for k in ("documents_in", "removed", "exact_duplicates_removed",
                                                            "fuzzy_duplicates_removed", "removed_by_pair")}
        prefix = _prefix(url, rec)
        for inp in rec.get("inputs") or []:
            if inp["name"] not in seen:
                dep = served(f"{prefix}/{inp['name']}-{inp['digest'][:10]}")  # its committed attempt
                queue.append((dep, _record(dep)))
    return sorted(seen.values(), key=lambda u: u["name"])


def _prefix(url: str, rec: dict[str, Any]) -> str:
    tail = f"/{rec['name']}-{rec['digest'][:10]}"
    url = logical(url)
    if not url.endswith(tail):
        raise VoyageError(f"card: {url} is not the executor's folder of {rec['name']} (expected it to end in {tail})")
    return url[: -len(tail)]


def _record(url: str) -> dict[str, Any]:
    try:
        return read_json(join(served(url), RECORD))
    except FileNotFoundError:
        raise VoyageError(f"card: {url} has no record ({RECORD}): not an executor output") from None


def _name_of(url: str, upstream: list[dict[str, Any]]) -> dict[str, Any]:
    rec = _record(url)
    # the Hub folder inside the export's output (export_hf's `folder`), named relative to it
    return {"step": rec["name"], "output_digest": rec.get("output_digest"),
            "folder": (rec.get("results") or {}).get("folder")}


def environment() -> dict[str, Any]:
    """The git commit of the code (and whether its tree had changes) and the key packages'
    versions: the executor's own record of them (`executor.current_environment`)
    where its public API has it, else read here the same way."""
    try:
        from executor import current_environment  # type: ignore[attr-defined]

        return current_environment()
    except ImportError:
        pass
    repo = Path(__file__).resolve().parents[2]
    git: dict[str, Any] = {"commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=False)
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=False)
        if commit.returncode == 0:
            git = {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
        else:
            git["describe"] = "not a git checkout"
    except (OSError, subprocess.SubprocessError) as e:
        git["describe"] = f"git not available ({type(e).__name__})"
    packages = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"git": git, "packages": packages}


# -- the page ----------------------------------------------------------------------------------

def render(card: dict[str, Any]) -> str:
    """MODEL_CARD.md from the card's JSON."""
    m, d, ev, code = card["model"], card["data"], card["evaluation"], card["code"]
    cfg = m["config"]
    out = [f"# Model card: {card['title']}", ""]
    out += ["## Model", "",
            f"{m['architecture']}: {cfg.get('n_layers')} layers, hidden {cfg.get('dim')}, {cfg.get('n_heads')} heads "
            f"of {cfg.get('head_dim')} ({cfg.get('n_kv_heads')} KV heads), {cfg.get('n_experts')} routed experts "
            f"(top-{cfg.get('top_k')}) of width {cfg.get('expert_dim')} and {cfg.get('n_shared_experts')} shared, "
            f"vocabulary {cfg.get('vocab_size'):,}, context {m['context']:,}.", "",
            f"- parameters: **{m['parameters']['total']:,}** total, **{m['parameters']['active']:,}** active per token",
            f"- trained: {m['trained_steps']:,} optimizer steps of {m['batch_size']:,} sequences", ""]
    out += ["## Training data", "",
            "Exact counts of the sequences each training step read (tokens = sequences x the mixture's sequence "
            "length), from the mixture's sampler arithmetic over the steps actually trained."
            + (f" The trainer's checkpoints count {d['trained_targets']:,} tokens: the predicted ones, "
               f"{d['seq_len'] - 1} of each sequence of {d['seq_len']} (its first token is never a target)."
               if d.get("trained_targets") else ""), "",
            "| source | licence | " + " | ".join(f"{s['phase']} tokens" for s in d["stages"]) + " | total tokens |",
            "|---|---|" + "---:|" * (len(d["stages"]) + 1)]
    for name, v in d["by_source"].items():
        per = [f"{s['by_dataset'].get(name, {}).get('tokens', 0):,}" for s in d["stages"]]
        out.append(f"| {name} | {', '.join(v['licenses']) or 'NOASSERTION'} | " + " | ".join(per)
                   + f" | {v['tokens']:,} |")
    out.append("| **all** | | " + " | ".join(f"{sum(c['tokens'] for c in s['by_dataset'].values()):,}"
                                             for s in d["stages"]) + f" | **{d['total']['tokens']:,}** |")
    out += ["", "| licence | tokens | sequences |", "|---|---:|---:|"]
    out += [f"| {lic} | {v['tokens']:,} | {v['sequences']:,} |" for lic, v in d["by_license"].items()]
    if d.get("deduplication"):
        out += ["", "Deduplication (MinHash, sources deduplicated together share one id space; \"A <- B\" counts "
                    "documents of A removed as copies of a document of B).", "",
                "| step | documents | removed | exact | near | removed per pair of sources |", "|---|---:|---:|---:|---:|---|"]
        for dd in d["deduplication"]:
            by_pair = dd.get("removed_by_pair")  # None: a dedup of one source
            pairs = "one source" if by_pair is None else ", ".join(f"{k}: {v:,}" for k, v in by_pair.items()) or "none"
            out.append(f"| {dd['step']} | {dd.get('documents_in') or 0:,} | {dd.get('removed') or 0:,} | "
                       f"{dd.get('exact_duplicates_removed') or 0:,} | {dd.get('fuzzy_duplicates_removed') or 0:,} | "
                       f"{pairs} |")
    if d.get("decontamination"):
        out += ["", "Decontamination: training documents sharing a normalised n-gram with an eval set, per source "
                    "and eval set.", "", "| step | source | eval set | documents | of |", "|---|---|---|---:|---:|"]
        for dc in d["decontamination"]:
            verb = "removed" if dc.get("mode") == "remove" else "marked"
            for source, sets in sorted((dc.get(verb) or {}).items()):
                for name, n in sorted(sets.items()):
                    out.append(f"| {dc['step']} ({verb}, {dc.get('ngram')}-grams) | {source} | {name} | {n:,} | "
                               f"{dc.get('documents') or 0:,} |")
    out += ["", "## Evaluation", "",
            f"Held-out windows of each dataset that the mixture never drew, at checkpoint step "
            f"{ev['checkpoint_step']}; the baseline is the unigram model of the trained tokens.", "",
            "| data | loss (nats) | unigram baseline | bits per byte | unigram baseline |", "|---|---:|---:|---:|---:|"]
    rows = [("all", ev["overall"])] + list(ev["datasets"].items())
    for name, v in rows:
        out.append(f"| {name} | {_f(v.get('loss'))} | {_f(v.get('unigram_loss'))} | {_f(v.get('bpb'))} | "
                   f"{_f(v.get('unigram_bpb'))} |")
    for key in ("harness", "harness_hf"):
        for task, metrics in (ev.get(key) or {}).items():
            shown = ", ".join(f"{k} {_f(v)}" for k, v in sorted(metrics.items()) if isinstance(v, (int, float)))
            out.append(f"\n{key} `{task}`: {shown}")
    if card.get("prediction"):  # a ladder's sealed prediction for this model and its verdict (docs/ladder.md)
        p = card["prediction"]
        out += ["", "### Against its sealed prediction", "",
                f"**{p['line']}** (held-out `{p['prediction']['metric']}`; the scaling ladder's law, sealed before "
                f"training began; {p['prediction']['level']:.0%} band)."]
    out += ["", "## Provenance", "",
            "Every step upstream of this card, with its recipe digest (its output folder is "
            "`{name}-{digest[:10]}` under the prefix) and the digest of what it wrote.", "",
            "| step | type (version) | recipe digest | output digest | code |", "|---|---|---|---|---|"]
    for u in card["upstream"]:
        git = u.get("git") or {}
        ver = (git.get("commit") or "")[:12] + (" (dirty)" if git.get("dirty") else "") if git.get("commit") else "-"
        out.append(f"| {u['name']} | {u['step_type']} ({u['version']}) | `{(u['digest'] or '')[:16]}` | "
                   f"`{(u['output_digest'] or '')[:16]}` | {ver} |")
    if card.get("export"):
        folder = card["export"].get("folder")
        out += ["", f"Hugging Face folder: `{card['export']['step']}`" + (f", its `{folder}/`" if folder else "")
                + f" (output digest `{(card['export']['output_digest'] or '')[:16]}`)."]
    git = code["git"]
    commit = git.get("commit") or f"unknown ({git.get('describe', 'not recorded')})"
    out += ["", "## Code", "",
            f"- git commit `{commit}`" + (", with uncommitted changes (dirty)" if git.get("dirty") else
                                          (", clean" if git.get("dirty") is False else "")),
            "- " + ", ".join(f"{k} {v}" for k, v in code["packages"].items()), ""]
    return "\n".join(out)


def _f(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))
