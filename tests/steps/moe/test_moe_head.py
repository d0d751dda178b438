"""The head fused with the cross-entropy, chunked over the vocabulary: the
same value and gradients as the plain head and torch's cross-entropy, within 1e-6, for chunks
that divide the vocabulary, that do not, of one row and of all of it; through the model too."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from steps.moe.config import PRESETS
from steps.moe.head import head_loss
from steps.moe.model import MoETransformer


def _plain(h, w, targets):
    return F.cross_entropy((h @ w.t()).float(), targets, reduction="sum")


@pytest.mark.parametrize("chunk", [1, 7, 64, 100, 1000])
def test_fused_chunked_loss_equals_the_plain_head_and_cross_entropy(chunk):
    g = torch.Generator().manual_seed(chunk)
    T, D, V = 37, 16, 100
    h = torch.randn(T, D, generator=g, dtype=torch.float64).float().requires_grad_(True)
    w = (0.3 * torch.randn(V, D, generator=g)).requires_grad_(True)
    targets = torch.randint(0, V, (T,), generator=g)
    targets[:3] = torch.tensor([0, V - 1, chunk % V])  # the edges of the chunks
    want = _plain(h, w, targets)
    dh, dw = torch.autograd.grad(want * 0.37, (h, w))
    got = head_loss(h, w, targets, chunk)
    gh, gw = torch.autograd.grad(got * 0.37, (h, w))
    assert abs(got.item() - want.item()) <= 1e-6 * abs(want.item())
    assert torch.allclose(gh, dh, rtol=0, atol=1e-6) and torch.allclose(gw, dw, rtol=0, atol=1e-6)


def test_the_model_loss_is_the_unchunked_one():
    cfg = dataclasses.replace(PRESETS["tiny"], loss_chunk=100)  # 512 rows: five chunks and a short one
    model = MoETransformer(cfg)
    model.init_weights(3)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    ce, router = model(tokens[:, :-1], tokens[:, 1:])
    fused = torch.autograd.grad(ce + router, list(model.parameters()))
    logits, router2 = model(tokens[:, :-1])
    plain_ce = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    plain = torch.autograd.grad(plain_ce + router2, list(model.parameters()))
    assert abs(ce.item() - plain_ce.item()) <= 1e-6 * plain_ce.item()
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(fused, plain))


def test_bf16_weights_take_the_plain_heads_dtypes():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(9, 8, generator=g).bfloat16().requires_grad_(True)
    w = torch.randn(30, 8, generator=g).bfloat16().requires_grad_(True)
    t = torch.randint(0, 30, (9,), generator=g)
    got = head_loss(h, w, t, 7)
    gh, gw = torch.autograd.grad(got, (h, w))
    want = _plain(h, w, t)
    dh, dw = torch.autograd.grad(want, (h, w))
    assert got.dtype == torch.float32 and gh.dtype == gw.dtype == torch.bfloat16
    assert abs(got.item() - want.item()) <= 1e-5 * want.item()
    assert torch.allclose(gw.float(), dw.float(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(gh.float(), dh.float(), rtol=2e-2, atol=2e-2)
