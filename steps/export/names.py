"""Our model's state-dict names (FQNs) and their Hugging Face names, both ways, and the MoEConfig
as an HF config.json and back. Torch-free.

HF names follow the DeepSeek-V3 / GLM-4.5 hub layout, so tools that know those checkpoints read
ours by the same names:

    embed.weight                       model.embed_tokens.weight
    blocks.{i}.attn_norm.weight        model.layers.{i}.input_layernorm.weight
    blocks.{i}.attn.w{q,k,v,o}.weight  model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
    blocks.{i}.moe_norm.weight         model.layers.{i}.post_attention_layernorm.weight
    blocks.{i}.moe.router.weight       model.layers.{i}.mlp.gate.weight
    blocks.{i}.moe.expert_bias_E       model.layers.{i}.mlp.gate.e_score_correction_bias
    blocks.{i}.moe.w1_EFD [E, F, D]    model.layers.{i}.mlp.experts.{e}.gate_proj.weight [F, D], e < E
    blocks.{i}.moe.w3_EFD [E, F, D]    model.layers.{i}.mlp.experts.{e}.up_proj.weight [F, D]
    blocks.{i}.moe.w2_EDF [E, D, F]    model.layers.{i}.mlp.experts.{e}.down_proj.weight [D, F]
    blocks.{i}.moe.shared.w{1,3,2}     model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
    norm.weight                        model.norm.weight
    head.weight                        lm_head.weight

A routed expert tensor is one FQN and E HF tensors (slices along dim 0); everything else is one
to one. Shape legend: E routed experts, F expert width, D model width.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from executor import VoyageError

MODEL_TYPE = "marin_moe"
ARCHITECTURE = "MarinMoeForCausalLM"
AUTO_MAP = {"AutoConfig": "configuration_marin_moe.MarinMoeConfig",
            "AutoModelForCausalLM": "modeling_marin_moe.MarinMoeForCausalLM"}

_PLAIN = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "moe_norm.weight": "post_attention_layernorm.weight",
    "moe.router.weight": "mlp.gate.weight",
    "moe.expert_bias_E": "mlp.gate.e_score_correction_bias",
    "moe.shared.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared.w3.weight": "mlp.shared_experts.up_proj.weight",
    "moe.shared.w2.weight": "mlp.shared_experts.down_proj.weight",
}
_EXPERTS = {"moe.w1_EFD": "gate_proj", "moe.w3_EFD": "up_proj", "moe.w2_EDF": "down_proj"}
_BLOCK_BACK = {v: k for k, v in _BLOCK.items()}
_EXPERTS_BACK = {v: k for k, v in _EXPERTS.items()}
_PLAIN_BACK = {v: k for k, v in _PLAIN.items()}
_FQN_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_HF_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class Piece:
    """One HF tensor: `fqn`'s tensor, or its slice `expert` along dim 0 when not None."""

    name: str
    fqn: str
    expert: int | None
    shape: tuple[int, ...]


def is_routed(fqn: str) -> bool:
    """Whether `fqn` holds all routed experts of a layer as one 3-D tensor."""
    m = _FQN_BLOCK.match(fqn)
    return bool(m) and m.group(2) in _EXPERTS


def hf_pieces(fqn: str, shape: tuple[int, ...]) -> list[Piece]:
    """The HF tensors one of our tensors becomes, in order."""
    if fqn in _PLAIN:
        return [Piece(_PLAIN[fqn], fqn, None, tuple(shape))]
    m = _FQN_BLOCK.match(fqn)
    if m:
        layer, rest = m.groups()
        if rest in _BLOCK:
            return [Piece(f"model.layers.{layer}.{_BLOCK[rest]}", fqn, None, tuple(shape))]
        if rest in _EXPERTS:
            return [Piece(f"model.layers.{layer}.mlp.experts.{e}.{_EXPERTS[rest]}.weight", fqn, e, tuple(shape[1:]))
                    for e in range(shape[0])]
    raise VoyageError(f"export: no Hugging Face name for the checkpoint tensor {fqn!r} (shape {tuple(shape)})")


def fqn_of(name: str) -> tuple[str, int | None]:
    """Our FQN for an HF tensor name, and its expert index when it is one routed expert's slice."""
    if name in _PLAIN_BACK:
        return _PLAIN_BACK[name], None
    m = _HF_LAYER.match(name)
    if m:
        layer, rest = m.groups()
        if rest in _BLOCK_BACK:
            return f"blocks.{layer}.{_BLOCK_BACK[rest]}", None
        e = _HF_EXPERT.match(rest)
        if e:
            return f"blocks.{layer}.{_EXPERTS_BACK[e.group(2)]}", int(e.group(1))
    raise VoyageError(f"import: the tensor {name!r} has no place in our model")


# ---------------------------------------------------------------------------------------------
# config.json


def hf_config(cfg: Any, *, context: int, dtype: str, bos_id: int | None, eos_id: int | None,
              pad_id: int | None) -> dict[str, Any]:
    """config.json for a MoEConfig (steps.moe.config). `context` is the sequence length the model
    was trained on (max_position_embeddings: lm-eval and generate cut inputs to it). The whole
    MoEConfig rides along under "marin" so an import gets back the training-only fields too."""
    return {
        "architectures": [ARCHITECTURE],
        "auto_map": dict(AUTO_MAP),
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "sliding_window": cfg.sliding_window if cfg.sliding_window > 0 else None,
        "layer_types": ["full_attention" if cfg.is_global(i) else "sliding_attention" for i in range(cfg.n_layers)],
        "n_routed_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "moe_intermediate_size": cfg.expert_dim,
        "n_shared_experts": cfg.n_shared_experts,
        "shared_expert_intermediate_size": cfg.shared_expert_dim,
        "scoring_func": cfg.score_func,
        "norm_topk_prob": cfg.renormalize,
        "routed_scaling_factor": cfg.route_scale,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": context,
        "initializer_range": cfg.init_std,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "dtype": dtype,
        "marin": dataclasses.asdict(cfg),
    }


def moe_config(hf: dict[str, Any], source: str):  # -> steps.moe.config.MoEConfig
    """The MoEConfig of an HF config.json written by `hf_config` (or by hand with the same fields).
    The architecture fields are read from the standard keys; training-only fields (losses, bias
    rate, init) from "marin" when present. A "marin" block that disagrees with the standard keys
    (the file was edited) is an error naming the field."""
    from steps.moe.config import MoEConfig

    if hf.get("model_type") != MODEL_TYPE:
        raise VoyageError(f"import: {source} is a {hf.get('model_type')!r} model, not {MODEL_TYPE!r}")
    known = {f.name for f in dataclasses.fields(MoEConfig)}
    extra = {k: v for k, v in (hf.get("marin") or {}).items() if k in known}
    try:
        n_layers = hf["num_hidden_layers"]
        types = hf.get("layer_types") or ["full_attention"] * n_layers
        window = hf.get("sliding_window") or 0
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if len(full) == n_layers:  # every layer global: a window with global_every 1, or none
            every = extra.get("global_every", 1 if window else MoEConfig.global_every)
        else:
            every = full[0] + 1 if full else n_layers + 1
        arch = dict(vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=n_layers,
                    n_heads=hf["num_attention_heads"], n_kv_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"],
                    sliding_window=window, global_every=every, n_experts=hf["n_routed_experts"],
                    top_k=hf["num_experts_per_tok"], expert_dim=hf["moe_intermediate_size"],
                    n_shared_experts=hf["n_shared_experts"], shared_expert_dim=hf["shared_expert_intermediate_size"],
                    score_func=hf.get("scoring_func", "sigmoid"), renormalize=hf.get("norm_topk_prob", True),
                    route_scale=float(hf.get("routed_scaling_factor", 1.0)), rope_theta=float(hf["rope_theta"]),
                    norm_eps=float(hf["rms_norm_eps"]))
    except KeyError as e:
        raise VoyageError(f"import: {source} has no {e.args[0]!r}") from e
    for k, v in arch.items():
        if k in extra and extra[k] != v:
            raise VoyageError(f"import: {source}: marin.{k} is {extra[k]!r} but the config's own fields say {v!r}")
    try:
        cfg = MoEConfig(**{**extra, **arch})
    except (TypeError, ValueError) as e:
        raise VoyageError(f"import: {source}: {e}") from e
    if ["full_attention" if cfg.is_global(i) else "sliding_attention" for i in range(n_layers)] != list(types):
        raise VoyageError(f"import: {source}: layer_types {types} is not one global layer every k layers; "
                          "our model cannot express it")
    return cfg
