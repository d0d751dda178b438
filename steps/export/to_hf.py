"""`export_hf`: a training checkpoint as a Hugging Face folder that transformers and lm-eval load.

    ex = Step("export/laptop", export_hf, ExportHFConfig(checkpoint=output_of(mid)))

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)

The folder is `hf/` inside the step's output (`output_of(ex, HF_DIR)`; import_hf and the harness
also take the step's output itself and look there), so that it holds only what a Hub repository
should, none of the executor's own files, and can be uploaded as it is:
config.json (architecture `MarinMoeForCausalLM`, registered through `auto_map`),
configuration_marin_moe.py and modeling_marin_moe.py (the model in transformers, shipped from
steps/export/hf_files), model-XXXXX-of-YYYYY.safetensors with model.safetensors.index.json,
generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json and a
README.md: the model card as the Hub reads it (steps/provenance/hub_card.py) when `card` names the
evaluation and training to describe, else a short page of what the checkpoint alone tells. Names: steps/export/names.py. Why no stock transformers architecture: docs/export.md.

Memory: the checkpoint is read one tensor at a time through DCP and each tensor is streamed into
its shard as soon as it is read (steps/export/safetensors_io.py), so the process holds the
largest tensor (and DCP's read buffer for it), never a shard or the model.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterator

from executor import StepContext, VoyageError, logical_url, step_type
from steps.provenance.card import CardConfig

DTYPES = ("float32", "bfloat16")
INDEX = "model.safetensors.index.json"
SHIPPED = ("configuration_marin_moe.py", "modeling_marin_moe.py")
HF_DIR = "hf"  # the Hub folder inside the step's output


@dataclass(frozen=True)
class ExportHFConfig:
    """Export `checkpoint` (a training step's output, its newest checkpoint, or a
    `checkpoints/step-N` folder) as a Hugging Face folder.

    Special tokens default to what the training data used (the tokenized datasets' manifests):
    `eos_token` is the document separator, `bos_token` the token in front of every document
    (usually none); `pad_token` is only for batching. The router's weights and selection bias
    stay fp32 whatever `dtype` says, as in training."""

    checkpoint: str
    tokenizer: str | None = None  # tokenizer.json or a folder holding one; None: the training data's
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    dtype: str = "float32"  # "float32" or "bfloat16"
    max_shard_bytes: int = 5_000_000_000
    # what README.md describes (evaluation, training, mixture, licences; its `export` left None)
    card: CardConfig | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise VoyageError(f"export_hf.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.max_shard_bytes < 1:
            raise VoyageError(f"export_hf.max_shard_bytes must be positive, got {self.max_shard_bytes}")


@step_type(version="2", alias=True)  # 2: the folder moved to hf/, README.md is the Hub's model card
def export_hf(config: ExportHFConfig, ctx: StepContext) -> None:
    """Write the checkpoint as a Hugging Face folder (weights, config, modeling code, tokenizer,
    model card) in `hf/` of the step's output."""
    from steps.data.tokenizer import load_tokenizer
    from steps.export.tokenizer import Specials
    from steps.train import checkpoint

    found = checkpoint.resolve(config.checkpoint, "checkpoint")
    meta = checkpoint.read_meta(found.url)
    checkpoint.verify_files(found.url, meta)  # sizes and digests (finiteness: as each tensor is read)
    data = training_data_tokens(meta, found.url)
    tokenizer = config.tokenizer or data.get("tokenizer")
    if not tokenizer:
        raise VoyageError("export_hf.tokenizer: the checkpoint names no training data to take the tokenizer from; "
                          "give `tokenizer`")
    specials = Specials(bos=config.bos_token or data.get("bos"), eos=config.eos_token or data.get("eos"),
                        pad=config.pad_token)
    started = time.time()
    # the checkpoint is named by its training step and number, never by a URL of this machine
    source = {"step": _step_name(found.url), "checkpoint": found.step, "dtype": config.dtype}
    card = None
    if config.card is not None:
        from steps.provenance.card import build_card

        card = build_card(config.card)
    summary = export_folder(found.url, ctx.path(HF_DIR), model_config=model_config_of(meta),
                            tokenizer_json=load_tokenizer(tokenizer).to_str(), specials=specials,
                            context=context_of(meta), dtype=config.dtype, max_shard_bytes=config.max_shard_bytes,
                            source=source, card=card, log=ctx.logger.info)
    ctx.results.update(checkpoint=found.url, step=found.step, tokenizer=tokenizer, folder=HF_DIR,
                       wall_s=time.time() - started, **summary)


def hf_folder(url: str) -> str:
    """The Hugging Face folder at `url`: `url` itself when it holds a config.json, else the `hf/`
    of an export_hf output."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    base = path.rstrip("/")
    if not fs.exists(f"{base}/config.json") and fs.exists(f"{base}/{HF_DIR}/config.json"):
        return f"{url.rstrip('/')}/{HF_DIR}"
    return url


def _step_name(checkpoint_url: str) -> str:
    """`midtrain/laptop` of `.../midtrain/laptop-7c3c3cf314/checkpoints/step-400` (the executor's
    `{name}-{digest[:10]}` folder), else the checkpoint folder's own name. The attempt folder a
    committed checkpoint lies in (`.attempts/0001-9f3c2a1b/`, named at random) is left out: the
    name is written into the export's README, whose bytes must not change from one run to another."""
    import re

    parts = logical_url(checkpoint_url).rstrip("/").split("/")
    if len(parts) >= 4 and parts[-2] == "checkpoints":
        m = re.fullmatch(r"(.+)-[0-9a-f]{10}", parts[-3])
        if m:
            return f"{parts[-4]}/{m.group(1)}"
    return parts[-3] if len(parts) >= 3 and parts[-2] == "checkpoints" else parts[-1]


def model_config_of(meta: dict[str, Any]):  # -> steps.moe.config.MoEConfig
    from steps.moe.config import MoEConfig

    names = {f.name for f in dataclasses.fields(MoEConfig)}
    return MoEConfig(**{k: v for k, v in meta["model"].items() if k in names})


def context_of(meta: dict[str, Any]) -> int:
    """The context the model was trained on: the mixture's sequences less the shifted target."""
    return int(meta["seq_len"]) - 1 if meta.get("seq_len") else int(meta["model"]["max_seq_len"])


def training_data_tokens(meta: dict[str, Any], url: str) -> dict[str, Any]:
    """{"tokenizer", "bos", "eos"} of the tokenized datasets the mixture of the checkpoint at `url`
    reads ({} when it names no mixture); datasets that disagree are an error. The checkpoint names
    its mixture, and the datasets their tokenizer, relative to themselves (a relocatable prefix)."""
    from steps.data.formats import read_tokens_manifest
    from steps.data.paths import resolve
    from steps.train.data import read_mixture

    if not meta.get("mixture"):
        return {}
    seen = set()
    for info in read_mixture(resolve(meta["mixture"], url))["datasets"].values():
        m = read_tokens_manifest(info["url"])
        seen.add((m.get("tokenizer"), m.get("bos"), m.get("eos")))
    if len(seen) != 1:
        raise VoyageError(f"export_hf: the mixture's datasets were tokenized differently: {sorted(map(str, seen))}")
    tokenizer, bos, eos = seen.pop()
    return {"tokenizer": tokenizer, "bos": bos, "eos": eos}


def export_folder(checkpoint_url: str, out: str, *, model_config: Any, tokenizer_json: str, specials: Any,
                  context: int, dtype: str = "float32", max_shard_bytes: int = 5_000_000_000,
                  source: dict[str, Any] | None = None, card: dict[str, Any] | None = None,
                  log: Callable[..., None] = lambda *a: None) -> dict[str, Any]:
    """Write the HF folder of a DCP checkpoint folder into `out` (any fsspec URL); returns counts."""
    import torch

    from steps.export.dcp_io import CheckpointTensors
    from steps.export.names import hf_config, hf_pieces
    from steps.export.safetensors_io import Entry, plan_shards, write_file
    from steps.export.tokenizer import hf_tokenizer_files, token_ids
    from steps.moe.config import param_counts
    from steps.moe.model import MoETransformer
    from steps.train.checkpoint import check_shapes

    check_shapes(checkpoint_url, model_config, "checkpoint")
    ids = token_ids(json.loads(tokenizer_json), specials, "export_hf")
    reader = CheckpointTensors(checkpoint_url)
    with torch.device("meta"):
        order = list(MoETransformer(model_config).state_dict())
    target = getattr(torch, dtype)
    pieces = [p for fqn in order for p in hf_pieces(fqn, reader.shape(fqn))]
    entries = [Entry(p.name, p.shape, torch.float32 if ".mlp.gate." in p.name else target) for p in pieces]
    shards = plan_shards(entries, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]

    def tensors() -> Iterator[torch.Tensor]:
        held_fqn, held = None, None
        for piece in pieces:
            if piece.fqn != held_fqn:
                held = None  # drop the last tensor before reading the next
                held_fqn, held = piece.fqn, reader.load(piece.fqn)
                if held.is_floating_point() and not torch.isfinite(held).all():  # verified on load
                    from steps.train.checkpoint import CorruptCheckpoint

                    raise CorruptCheckpoint(f"checkpoint {checkpoint_url} refused: {piece.fqn}: finiteness check: it "
                                            f"holds NaN or infinite values")
            yield held if piece.expert is None else held[piece.expert]  # write_file converts to entry.dtype

    stream = tensors()
    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        total += write_file(_join(out, name), shard, (next(stream) for _ in shard))
        weight_map.update({e.name: name for e in shard})
        log("export_hf: wrote %s (%d tensors)", name, len(shard))
    data_bytes = sum(e.nbytes for e in entries)
    n_params = param_counts(model_config)[0]  # the selection biases are buffers, not parameters
    files = {
        INDEX: {"metadata": {"total_size": data_bytes, "total_parameters": n_params}, "weight_map": weight_map},
        "config.json": hf_config(model_config, context=context, dtype=dtype, bos_id=ids["bos"], eos_id=ids["eos"],
                                 pad_id=ids["pad"]),
        "generation_config.json": {k: v for k, v in {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
                                                     "pad_token_id": ids["pad"]}.items() if v is not None},
    }
    for fname, value in files.items():
        _write_text(_join(out, fname), json.dumps(value, indent=1, sort_keys=fname == INDEX))
    for fname, text in hf_tokenizer_files(tokenizer_json, specials).items():
        _write_text(_join(out, fname), text)
    shipped = resources.files("steps.export") / "hf_files"
    for fname in SHIPPED:
        _write_text(_join(out, fname), (shipped / fname).read_text())
    if card is not None:
        from steps.provenance.hub_card import readme

        page = readme(card, {"dtype": dtype, **(source or {})})
    else:
        page = model_card(model_config, n_params, context, dtype, source or {})
    _write_text(_join(out, "README.md"), page)
    return {"shards": len(shards), "tensors": len(entries), "parameters": n_params, "bytes": total}


def model_card(cfg: Any, n_params: int, context: int, dtype: str, source: dict[str, Any]) -> str:
    """The README of an export with no card to give (the checkpoint alone): what it is and how to load it."""
    from steps.moe.config import param_counts
    from steps.provenance.hub_card import TAGS, ordinal

    _, active = param_counts(cfg)
    lines = [
        "---", "library_name: transformers", "pipeline_tag: text-generation",
        "tags: [" + ", ".join(TAGS) + "]", "---", "",
        "# marin-voyage MoE", "",
        f"A mixture-of-experts decoder trained with marin-voyage: {n_params:,} parameters, {active:,} active per "
        f"token; {cfg.n_layers} layers of width {cfg.dim}, {cfg.n_experts} routed experts (top {cfg.top_k}) and "
        f"{cfg.n_shared_experts} shared; sliding window {cfg.sliding_window} with every "
        f"{ordinal(cfg.global_every)} layer global; trained context {context}; weights in {dtype}.", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(PATH, trust_remote_code=True)",
        "tok = AutoTokenizer.from_pretrained(PATH, trust_remote_code=True)",
        "```", "",
    ]
    if source:
        lines += [f"Exported from `{source.get('step')}`, checkpoint step-{source.get('checkpoint')}."]
    return "\n".join(lines) + "\n"


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def _write_text(url: str, text: str) -> None:
    import fsspec

    with fsspec.open(url, "w") as f:
        f.write(text)
