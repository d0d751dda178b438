"""The FQN <-> HF name mapping and MoEConfig <-> config.json, both ways, for every preset."""

import dataclasses

import pytest
import torch

from executor import VoyageError
from steps.export.names import fqn_of, hf_config, hf_pieces, moe_config
from steps.moe.config import PRESETS


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_tensor_has_hf_names_that_map_back(preset):
    from steps.moe.model import MoETransformer

    cfg = PRESETS[preset]
    with torch.device("meta"):
        state = MoETransformer(cfg).state_dict()
    names = set()
    for fqn, t in state.items():
        pieces = hf_pieces(fqn, tuple(t.shape))
        for p in pieces:
            assert fqn_of(p.name) == (fqn, p.expert)
            names.add(p.name)
        if fqn.endswith(("_EFD", "_EDF")):
            assert [p.expert for p in pieces] == list(range(cfg.n_experts))
            assert all(p.shape == tuple(t.shape[1:]) for p in pieces)
    assert len(names) == sum(len(hf_pieces(f, tuple(t.shape))) for f, t in state.items())  # no two alike
    assert sum(1 for n in names if ".mlp.experts." in n) == 3 * cfg.n_layers * cfg.n_experts


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("change", [{}, {"sliding_window": 0}, {"global_every": 1}, {"global_every": 3},
                                    {"score_func": "softmax", "renormalize": False, "route_scale": 2.5}])
def test_config_json_round_trip(preset, change):
    cfg = dataclasses.replace(PRESETS[preset], **change)
    hf = hf_config(cfg, context=4095, dtype="bfloat16", bos_id=None, eos_id=2, pad_id=None)
    assert moe_config(hf, "x") == cfg
    plain = {k: v for k, v in hf.items() if k != "marin"}  # written by hand: no training-only block
    back = moe_config(plain, "x")
    free = ["z_loss_coef", "aux_loss_coef", "bias_update_rate", "router_impl", "max_seq_len", "init_std",
            "expert_align", "rank_capacity_factor"] + (["global_every"] if not cfg.sliding_window else [])  # no window: no pattern
    assert back == dataclasses.replace(cfg, **{f: getattr(back, f) for f in free})


def test_unknown_names_and_edited_configs_are_errors():
    with pytest.raises(VoyageError, match="no Hugging Face name"):
        hf_pieces("blocks.0.moe.expert_load_E", (8,))
    with pytest.raises(VoyageError, match="has no place in our model"):
        fqn_of("model.layers.0.mlp.experts.0.w9.weight")
    hf = hf_config(PRESETS["tiny"], context=64, dtype="float32", bos_id=None, eos_id=1, pad_id=None)
    with pytest.raises(VoyageError, match="marin.rope_theta is 500000.0 but the config's own fields say 10000.0"):
        moe_config({**hf, "rope_theta": 10_000.0}, "x")
    with pytest.raises(VoyageError, match="'llama' model"):
        moe_config({**hf, "model_type": "llama"}, "x")
    with pytest.raises(VoyageError, match="not one global layer every k"):
        moe_config({**hf, "marin": None, "layer_types": ["full_attention", "sliding_attention"] * 2}, "x")
    with pytest.raises(VoyageError, match="marin.global_every is 2 but the config's own fields say 1"):
        moe_config({**hf, "layer_types": ["full_attention", "sliding_attention"] * 2}, "x")
    with pytest.raises(VoyageError, match="has no 'head_dim'"):
        moe_config({k: v for k, v in hf.items() if k != "head_dim"}, "x")


def test_export_step_modules_import_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = ("import sys, steps.export, steps.export.names, steps.export.to_hf, steps.export.from_hf; "
            "bad = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
