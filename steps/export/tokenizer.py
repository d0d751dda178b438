"""The tokenizer of an export: our `tokenizers` file plus the config transformers' AutoTokenizer
reads (PreTrainedTokenizerFast), with the special tokens the training data used.

Encoding with the exported tokenizer gives the ids the training data holds for the same text:
the data steps encode with `add_special_tokens=False` and add BOS/EOS around whole documents
themselves (steps/data/tokenize.py). So the exported tokenizer adds BOS in front of a text only
when the data had one in front of every document, and never appends EOS (it ends documents, not
prompts); any post-processor of the source file (Llama 3's adds <|begin_of_text|>) is replaced
accordingly. No chat template: the model is a base model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from executor import VoyageError


@dataclass(frozen=True)
class Specials:
    """The special tokens of an export (token strings; None when the model has no such token)."""

    bos: str | None
    eos: str | None
    pad: str | None


def token_ids(spec: dict[str, Any], specials: Specials, field: str) -> dict[str, int | None]:
    """{"bos": id, "eos": id, "pad": id} of the special tokens, or a VoyageError naming the one
    the vocabulary lacks."""
    vocab = dict((spec.get("model") or {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in spec.get("added_tokens", [])})
    out = {}
    for role in ("bos", "eos", "pad"):
        token = getattr(specials, role)
        if token is not None and token not in vocab:
            raise VoyageError(f"{field}.{role}_token: {token!r} is not in the tokenizer's vocabulary")
        out[role] = vocab[token] if token is not None else None
    return out


def hf_tokenizer_files(tokenizer_json: str, specials: Specials) -> dict[str, str]:
    """{file name: text} of tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    spec = json.loads(tokenizer_json)
    ids = token_ids(spec, specials, "export")
    if specials.bos is not None:
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": specials.bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": specials.bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {specials.bos: {"id": specials.bos, "ids": [ids["bos"]], "tokens": [specials.bos]}}}
    else:
        spec["post_processor"] = None
    named = {f"{role}_token": getattr(specials, role) for role in ("bos", "eos", "pad")}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **named,
        "unk_token": None,
        "add_bos_token": specials.bos is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # byte-level BPE decodes spaces exactly as encoded
        "padding_side": "right",
    }
    # No `model_max_length`: the tokenizer has no length limit to state. transformers would warn
    # that longer inputs "will result in indexing errors", which is false of a model with rotary
    # positions and no position table; the trained context is config.json's
    # max_position_embeddings, which generate and lm-eval cut inputs to, and the card says it.
    special_map = {k: v for k, v in named.items() if v is not None}
    return {"tokenizer.json": json.dumps(spec, ensure_ascii=False),
            "tokenizer_config.json": json.dumps(config, indent=1),
            "special_tokens_map.json": json.dumps(special_map, indent=1)}
