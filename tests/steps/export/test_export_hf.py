"""export_hf: the exported folder is what transformers loads, and it
computes what our model computes: logits on a few hundred tokens of both corpora (fp32, max abs
difference <= 1e-4), the tokenizer's ids, greedy generation with the KV cache. Also a bf16 export
and the errors of bad input."""

import json
import os

import pytest
import torch

from executor import VoyageError
from steps.train import checkpoint

TEXTS = [
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void;",
    "The os.path module implements some useful functions on pathnames. To read or write files see open().",
    "  Leading spaces, tabs\tand ünïcödé — with <|eos|> written in the text, and digits 0123456789.",
    "",
]


def _ours(laptop):
    from steps.eval.evaluate import load_model

    found = checkpoint.resolve(laptop["midtrain"], "checkpoint")
    return load_model(found.url, checkpoint.read_meta(found.url), torch.device("cpu"))


def _windows(laptop, n_per_source=4, length=64):
    """Token windows from both corpora (longer than the trained context: the sliding window and
    the global layers both matter)."""
    import numpy as np

    from steps.data.formats import TokenDataset

    rows = []
    for name in ("kjv", "pydocs"):
        data = TokenDataset(laptop["tokens"][name])
        step = data.num_tokens // n_per_source - length
        rows += [data.tokens(i * step, length) for i in range(n_per_source)]
    return torch.from_numpy(np.stack(rows).astype("int64"))


def test_folder_holds_what_transformers_reads(exported):
    path = exported["path"]
    files = set(os.listdir(path))
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "configuration_marin_moe.py",
            "modeling_marin_moe.py", "README.md"} <= files
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert len(shards) == exported["results"]["shards"] > 1
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    assert set(index["weight_map"].values()) == set(shards)
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_marin_moe.MarinMoeForCausalLM"
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"] * 2 and cfg["sliding_window"] == 8
    assert cfg["max_position_embeddings"] == 32 and cfg["tie_word_embeddings"] is False
    tok_cfg = json.load(open(os.path.join(path, "tokenizer_config.json")))
    assert tok_cfg["eos_token"] == "<|eos|>" and tok_cfg["bos_token"] is None and "chat_template" not in tok_cfg


def test_shards_are_safetensors_with_every_tensor_once(exported):
    from safetensors import safe_open

    path = exported["path"]
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    seen = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(path, shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            data = 0
            for name in f.keys():
                seen[name] = shard
                t = f.get_tensor(name)
                data += t.numel() * t.element_size()
            assert data <= 200_000 or len(list(f.keys())) == 1
    assert seen == index["weight_map"]
    assert sum(1 for n in seen if ".mlp.experts." in n) == 4 * 8 * 3  # layers x experts x projections
    assert index["metadata"]["total_parameters"] == exported["results"]["parameters"]


def test_transformers_logits_match_ours(hf_model, laptop):
    model, _ = hf_model
    ours = _ours(laptop)
    x_BS = _windows(laptop)
    assert x_BS.numel() >= 512
    with torch.no_grad():
        want_BSV, _ = ours(x_BS)
        got_BSV = model(x_BS).logits
    assert got_BSV.dtype == torch.float32
    assert (got_BSV - want_BSV).abs().max().item() <= 1e-4
    # the selection bias is exported and used to select only: zeroing it changes the logits, a
    # shift common to every expert (which selects the same experts) changes nothing
    gates = [layer.mlp.gate for layer in model.model.layers]
    assert all(torch.equal(g.e_score_correction_bias, b.moe.expert_bias_E) for g, b in zip(gates, ours.blocks))
    saved = [g.e_score_correction_bias.clone() for g in gates]
    with torch.no_grad():
        for g in gates:
            g.e_score_correction_bias.add_(0.25)
        shifted = model(x_BS).logits
        for g in gates:
            g.e_score_correction_bias.zero_()
        zeroed = model(x_BS).logits
        for g, b in zip(gates, saved):
            g.e_score_correction_bias.copy_(b)
    assert (shifted - got_BSV).abs().max().item() <= 1e-5
    assert (zeroed - got_BSV).abs().max().item() > 1e-3


def test_padded_batch_and_cache_agree_with_one_pass(hf_model, laptop):
    """A left-padded row gives the logits of the same row unpadded; prefill + one-token steps
    through the (sliding-window) KV cache give the logits of one full pass."""
    from transformers import DynamicCache

    model, _ = hf_model
    x_BS = _windows(laptop, 1, 40)
    with torch.no_grad():
        full = model(x_BS).logits
        padded = torch.cat([torch.zeros(2, 5, dtype=torch.long), x_BS], 1)
        mask = torch.cat([torch.zeros(2, 5, dtype=torch.long), torch.ones_like(x_BS)], 1)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        left = model(padded, attention_mask=mask, position_ids=pos).logits[:, 5:]
        cache = DynamicCache(config=model.config)
        steps = [model(x_BS[:, :20], past_key_values=cache, use_cache=True).logits]
        for i in range(20, 40):
            steps.append(model(x_BS[:, i:i + 1], past_key_values=cache, use_cache=True).logits)
    assert (left - full).abs().max().item() <= 1e-4
    assert (torch.cat(steps, 1) - full).abs().max().item() <= 1e-4


def test_tokenizer_ids_match_ours(hf_model, laptop):
    from steps.data.tokenizer import load_tokenizer

    _, tok = hf_model
    ours = load_tokenizer(laptop["tokens"]["tokenizer"])
    from steps.data.formats import iter_text_batches
    from kits.trainkit import CORPUS  # (on sys.path through conftest)

    texts = list(TEXTS)
    for name in ("kjv", "pydocs"):  # documents of both sources, whole (up to 20k characters each)
        texts += [t[:20_000] for t in next(iter_text_batches(str(CORPUS / f"{name}.jsonl.zst"), 4))]
    for text in texts:
        assert tok(text).input_ids == ours.encode(text, add_special_tokens=False).ids, text[:60]
        ids = tok(text).input_ids
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == ours.decode(ids, skip_special_tokens=skip)
        assert tok.decode(ids) == text or "<|eos|>" not in text
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|eos|>", "<|pad|>", None)
    assert tok.eos_token_id == ours.token_to_id("<|eos|>")


def test_generate_20_tokens_is_our_greedy_decoding(hf_model, laptop):
    model, tok = hf_model
    ours = _ours(laptop)
    prompt = tok("And God said, Let there be", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert out.shape == (1, prompt.input_ids.shape[1] + 20)
    ids = prompt.input_ids
    with torch.no_grad():
        for _ in range(20):
            logits, _ = ours(ids)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert out.tolist() == ids.tolist()


def test_bf16_export_keeps_the_router_in_fp32(laptop, tmp_path, hf_modules):
    from transformers import AutoModelForCausalLM

    from steps.export.to_hf import ExportHFConfig, export_hf
    from kits.trainkit import run_step

    run_step(export_hf, ExportHFConfig(checkpoint=laptop["midtrain"], dtype="bfloat16"), tmp_path / "bf16")
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16" / "hf"), trust_remote_code=True)
    gate = model.model.layers[0].mlp.gate
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    ours = _ours(laptop)
    assert torch.equal(gate.e_score_correction_bias, ours.blocks[0].moe.expert_bias_E)
    x_BS = _windows(laptop, 1, 32)
    with torch.no_grad():
        got = model(x_BS).logits.float()
        want, _ = ours(x_BS)
    assert (got - want).abs().max().item() < 0.5  # bf16 rounding, not another function


def test_bad_input_is_one_clear_error(laptop, tmp_path):
    from steps.export.to_hf import ExportHFConfig, export_hf
    from kits.trainkit import run_step

    with pytest.raises(VoyageError, match="export_hf.dtype"):
        ExportHFConfig(checkpoint="x", dtype="int8")
    with pytest.raises(VoyageError, match="pad_token: '<|nope|>' is not in the tokenizer"):
        run_step(export_hf, ExportHFConfig(checkpoint=laptop["midtrain"], pad_token="<|nope|>"), tmp_path / "a")
    with pytest.raises(VoyageError, match="no checkpoint under"):
        run_step(export_hf, ExportHFConfig(checkpoint=str(tmp_path / "nothing")), tmp_path / "b")


@pytest.mark.parametrize("url", ["/p/midtrain/laptop-91abcb7375/checkpoints/step-20",
                                 "/p/midtrain/laptop-91abcb7375/.attempts/0001-52b36b6d/checkpoints/step-20",
                                 "gs://b/p/midtrain/laptop-91abcb7375/.attempts/0002-261c7cf0/checkpoints/step-20/"])
def test_the_checkpoint_is_named_by_its_step_never_by_its_attempt(url):
    # The name goes into the export's README: a random attempt id there made two identical runs
    # write different bytes (found by bench/chaos.py comparing a run with a clean one).
    from steps.export.to_hf import _step_name

    assert _step_name(url) == "midtrain/laptop"
