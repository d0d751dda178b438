"""The MoE model: parameter counts of the presets, routed-expert arithmetic, attention windows,
training on the CPU, and the fused router inside the model."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from steps.moe.model import (PRESETS, Attention, MoE, MoETransformer, _RouterLogits, count_params,
                             expert_layout, rope_tables)


def _closed_form(cfg):
    """Parameters counted by hand, to hold count_params (meta device) to account."""
    d, a = cfg.dim, cfg.head_dim
    attn = d * a * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    expert = 3 * d * cfg.expert_dim
    shared = 3 * d * cfg.shared_expert_dim * cfg.n_shared_experts
    per_layer = attn + d * cfg.n_experts + shared + 2 * d
    embeddings = 2 * cfg.vocab_size * d
    total = cfg.n_layers * (per_layer + cfg.n_experts * expert) + embeddings + d
    active = cfg.n_layers * (per_layer + cfg.top_k * expert) + embeddings + d
    return total, active


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_counts_match_closed_form(name):
    from steps.moe.config import param_counts

    total, active = count_params(PRESETS[name])
    assert (total, active) == _closed_form(PRESETS[name]) == param_counts(PRESETS[name])
    assert 0 < active < total


def test_535b_preset_reproduces_public_figures():
    total, active = count_params(PRESETS["535b-a23b"])
    assert abs(total / 535.3e9 - 1) < 0.01, total
    assert abs(active / 22.76e9 - 1) < 0.01, active


def _tiny(**changes):
    cfg = dataclasses.replace(PRESETS["tiny"], **changes)
    torch.manual_seed(0)
    model = MoETransformer(cfg)
    model.init_weights(0)
    return cfg, model


@pytest.mark.parametrize("align", [1, 8])
def test_routed_experts_match_a_loop_over_tokens(align):
    cfg, model = _tiny(expert_align=align)
    moe: MoE = model.blocks[0].moe
    x_TD = torch.randn(1, 19, cfg.dim)
    out, _ = moe(x_TD)
    x = x_TD[0]
    logits = x @ moe.router.weight.T
    scores = torch.sigmoid(logits)
    idx = torch.topk(scores + moe.expert_bias_E, cfg.top_k, -1).indices
    want = moe.shared(x)
    for t in range(x.shape[0]):
        w = scores[t, idx[t]] / scores[t, idx[t]].sum()
        for j, e in enumerate(idx[t].tolist()):
            h = F.silu(moe.w1_EFD[e] @ x[t]) * (moe.w3_EFD[e] @ x[t])
            want[t] += w[j] * (moe.w2_EDF[e] @ h)
    torch.testing.assert_close(out[0], want, rtol=1e-5, atol=1e-5)


def test_router_logits_keep_the_bf16_activations():
    x = torch.randn(6, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logits = _RouterLogits.apply(x, w)
    assert logits.dtype == torch.float32
    assert {(t.dtype, tuple(t.shape)) for t in saved} == {(torch.bfloat16, (6, 16)), (torch.float32, (8, 16))}
    g = torch.randn(6, 8)
    dx, dw = torch.autograd.grad(logits, (x, w), g)
    x2 = x.detach().requires_grad_()
    w2 = w.detach().requires_grad_()
    dx2, dw2 = torch.autograd.grad(F.linear(x2.float(), w2), (x2, w2), g)
    torch.testing.assert_close(logits, F.linear(x.float(), w))
    torch.testing.assert_close(dx, dx2)
    torch.testing.assert_close(dw, dw2)


def test_expert_layout_pads_each_group():
    idx_TK = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 3]], dtype=torch.int32)
    counts_E = torch.bincount(idx_TK.flatten(), minlength=5).int()  # [2, 1, 4, 1, 0]
    row_N, offs_E, n_rows = expert_layout(idx_TK, counts_E, align=4)
    assert offs_E.tolist() == [4, 8, 12, 16, 16]
    # expert 0 gets rows 0-1, expert 1 row 4, expert 2 rows 8-11 in token order, expert 3 row 12
    assert row_N.tolist() == [8, 0, 9, 4, 1, 10, 11, 12]
    assert n_rows == 8 + 3 * 5 and n_rows >= offs_E[-1]


def test_sliding_window_forgets_old_tokens():
    cfg, _ = _tiny()
    sliding, full = Attention(cfg, 0), Attention(cfg, 1)
    assert sliding.window == cfg.sliding_window and full.window == 0
    S = 24
    cos, sin = rope_tables(S, cfg.head_dim, cfg.rope_theta, "cpu")
    x = torch.randn(1, S, cfg.dim)
    x2 = x.clone()
    x2[0, 0] += 1.0
    w = cfg.sliding_window
    with torch.no_grad():
        a, b = sliding(x, cos, sin), sliding(x2, cos, sin)
        torch.testing.assert_close(a[0, w:], b[0, w:])  # token 0 is out of reach from position w on
        assert not torch.allclose(a[0, w - 1], b[0, w - 1])
        assert not torch.allclose(full(x, cos, sin)[0, -1], full(x2, cos, sin)[0, -1])


def _train(model, cfg, steps, seed=1):
    from steps.moe.balance import update_expert_bias

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (4, 33), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss, parts = model.loss(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_expert_bias(model.moe_layers(), cfg.bias_update_rate)
        losses.append(loss.item())
        assert parts["router"] > 0
    return losses, [p.grad.clone() for p in model.parameters()]


def test_tiny_model_learns():
    cfg, model = _tiny()
    losses, grads = _train(model, cfg, steps=8)
    assert losses[-1] < losses[0] - 1.0, losses
    assert all(torch.isfinite(g).all() for g in grads)
    assert any(b.moe.expert_bias_E.abs().sum() > 0 for b in model.blocks)


def test_training_is_bitwise_reproducible():
    runs = [_train(_tiny()[1], PRESETS["tiny"], steps=2) for _ in range(2)]
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_bf16_forward_backward():
    cfg, model = _tiny(aux_loss_coef=1e-2, score_func="softmax")
    model.to(torch.bfloat16)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17))
    loss, parts = model.loss(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and parts["router"] > 0
    assert model.blocks[0].moe.w1_EFD.grad.dtype == torch.bfloat16


def test_fused_router_in_the_model_matches_reference():
    cfg, model = _tiny()
    tokens = torch.randint(0, cfg.vocab_size, (2, 17))
    losses, grads = [], []
    for impl in ("reference", "fused"):
        for block in model.blocks:
            block.moe.cfg = dataclasses.replace(cfg, router_impl=impl, aux_loss_coef=1e-2)
        model.zero_grad()
        loss, _ = model.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.blocks[0].moe.router.weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_meta_device_builds_the_big_preset_without_memory():
    with torch.device("meta"):
        model = MoETransformer(PRESETS["535b-a23b"])
    assert model.blocks[0].moe.w1_EFD.shape == (384, 1536, 6144)
    assert sum(b.attn.window == 0 for b in model.blocks) == 12  # every 4th of 48 layers is global
