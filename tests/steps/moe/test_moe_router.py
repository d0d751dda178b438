"""The fused router (Triton kernels, under TRITON_INTERPRET=1 here) against the torch reference."""
import math
import os

import pytest
import torch

from steps.moe import router_kernel
from steps.moe.router import RENORM_EPS, SCORE_FUNCS, moe_router, route, route_fused, route_reference, untied_logits

# Every K from 1 to 8 under both score functions, spread over E = 8, 64 and 384 (384 pads to 512).
CASES = [
    ("softmax", 8, 1), ("softmax", 8, 2), ("softmax", 8, 8), ("softmax", 64, 3), ("softmax", 64, 5),
    ("softmax", 384, 4), ("softmax", 384, 6), ("softmax", 384, 7), ("softmax", 384, 8),
    ("sigmoid", 8, 3), ("sigmoid", 8, 4), ("sigmoid", 64, 1), ("sigmoid", 64, 6), ("sigmoid", 64, 8),
    ("sigmoid", 384, 2), ("sigmoid", 384, 5), ("sigmoid", 384, 7), ("sigmoid", 384, 8),
]
T = 37  # not a multiple of any tile height, so the last tile is ragged


def _inputs(score_func, E, K, seed, n_tokens=T):
    gen = torch.Generator().manual_seed(seed)
    bias_E = torch.randn(E, generator=gen) * (0.02 if score_func == "softmax" else 0.2)
    logits_TE = untied_logits(n_tokens, E, K, score_func, bias_E, gen)
    grads = (torch.randn(n_tokens, K, generator=gen), torch.randn(n_tokens, generator=gen),
             torch.randn(E, generator=gen))
    return logits_TE, bias_E, grads


def _run(route_fn, logits_TE, bias_E, K, score_func, renormalize, scale, grads):
    x = logits_TE.clone().requires_grad_()
    out = route_fn(x, bias_E, K, score_func, renormalize, scale)
    (dlogits,) = torch.autograd.grad([out.weights_TK, out.lse_T, out.score_sums_E], x, list(grads))
    return out, dlogits


@pytest.mark.parametrize("score_func,E,K", CASES)
def test_fused_matches_reference(score_func, E, K):
    renormalize, scale = K % 2 == 0, (1.0 if K % 3 else 2.5)
    logits_TE, bias_E, grads = _inputs(score_func, E, K, seed=E * 10 + K)
    want, dwant = _run(route_reference, logits_TE, bias_E, K, score_func, renormalize, scale, grads)
    got, dgot = _run(route_fused, logits_TE, bias_E, K, score_func, renormalize, scale, grads)
    assert got.indices_TK.dtype == torch.int32 and got.counts_E.dtype == torch.int32
    assert torch.equal(got.indices_TK, want.indices_TK)
    assert torch.equal(got.counts_E, want.counts_E)
    assert int(got.counts_E.sum()) == T * K
    torch.testing.assert_close(got.weights_TK, want.weights_TK, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.lse_T, want.lse_T, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.score_sums_E, want.score_sums_E, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dgot, dwant, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_only_weights_used(score_func):
    """Autograd hands zeros for the unused outputs; the gradient must still match."""
    logits_TE, bias_E, _ = _inputs(score_func, 64, 8, seed=3)
    dw_TK = torch.randn(T, 8)
    grads = []
    for fn in (route_reference, route_fused):
        x = logits_TE.clone().requires_grad_()
        (fn(x, bias_E, 8, score_func, True, 1.0).weights_TK * dw_TK).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score_func,E,K", [("softmax", 384, 8), ("sigmoid", 24, 5)])
def test_every_output_written(score_func, E, K):
    """Sentinel-filled outputs, small tiles and few programs, so each program walks several
    tiles and the last is ragged: every element must come back overwritten and right."""
    n_tokens = 45
    logits_TE, bias_E, (dw, dlse, dsums) = _inputs(score_func, E, K, seed=7, n_tokens=n_tokens)
    want, dwant = _run(route_reference, logits_TE, bias_E, K, score_func, True, 1.0, (dw, dlse, dsums))
    weights = torch.full((n_tokens, K), math.nan)
    indices = torch.full((n_tokens, K), -7, dtype=torch.int32)
    lse = torch.full((n_tokens,), math.nan)
    got = router_kernel.router_forward(logits_TE, bias_E, K, SCORE_FUNCS[score_func], True, 1.0, RENORM_EPS, block_t=4,
                                       programs=3, out=(weights, indices, lse))
    assert torch.equal(indices, want.indices_TK)
    assert torch.equal(got[2], want.counts_E)
    torch.testing.assert_close(weights, want.weights_TK, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, want.lse_T, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[4], want.score_sums_E, rtol=1e-5, atol=1e-5)
    dlogits = torch.full_like(logits_TE, math.nan)
    router_kernel.router_backward(logits_TE, lse, indices, dw, dlse, dsums, SCORE_FUNCS[score_func], True, 1.0, RENORM_EPS,
                                  block_t=4, out=dlogits)
    torch.testing.assert_close(dlogits, dwant, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score_func,E,K", [("sigmoid", 384, 8), ("softmax", 64, 6)])
def test_gpu_tiles_under_the_interpreter(score_func, E, K):
    """The tiles a GPU gets (one token a tile, one warp) rather than the interpreter's 16."""
    assert router_kernel.tile_config(4096, E, torch.device("cuda")) == (1, 1)
    n_tokens = 9
    logits_TE, bias_E, (dw, dlse, dsums) = _inputs(score_func, E, K, seed=11, n_tokens=n_tokens)
    want, dwant = _run(route_reference, logits_TE, bias_E, K, score_func, True, 1.5, (dw, dlse, dsums))
    w, idx, counts, lse, sums = router_kernel.router_forward(logits_TE, bias_E, K, SCORE_FUNCS[score_func], True, 1.5, RENORM_EPS,
                                                             block_t=1, num_warps=1, programs=4)
    assert torch.equal(idx, want.indices_TK) and torch.equal(counts, want.counts_E)
    torch.testing.assert_close(w, want.weights_TK, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sums, want.score_sums_E, rtol=1e-5, atol=1e-5)
    dlogits = router_kernel.router_backward(logits_TE, lse, idx, dw, dlse, dsums, SCORE_FUNCS[score_func], True, 1.5, RENORM_EPS,
                                            block_t=1, num_warps=1)
    torch.testing.assert_close(dlogits, dwant, rtol=1e-5, atol=1e-6)


def test_ties_go_to_the_lowest_index():
    logits_TE = torch.zeros(5, 12)
    w, idx, counts, _, _ = router_kernel.router_forward(logits_TE, torch.zeros(12), 4, SCORE_FUNCS["sigmoid"], True, 1.0,
                                                        RENORM_EPS)
    assert idx.tolist() == [[0, 1, 2, 3]] * 5
    assert counts.tolist() == [5] * 4 + [0] * 8
    torch.testing.assert_close(w, torch.full((5, 4), 0.25))


def test_bias_selects_but_does_not_weigh():
    """A large bias on expert 5 sends every token there; its weight is its unbiased score."""
    gen = torch.Generator().manual_seed(0)
    logits_TE = torch.randn(16, 8, generator=gen)
    bias_E = torch.zeros(8)
    bias_E[5] = 10.0
    out = route_fused(logits_TE, bias_E, 1, "softmax", False, 1.0)
    assert (out.indices_TK[:, 0] == 5).all()
    torch.testing.assert_close(out.weights_TK[:, 0], torch.softmax(logits_TE, -1)[:, 5])


def test_fused_saves_only_logits_indices_lse():
    n_tokens, E, K = 32, 64, 8
    logits_TE, bias_E, _ = _inputs("sigmoid", E, K, seed=1, n_tokens=n_tokens)
    x = logits_TE.clone().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = route_fused(x, bias_E, K, "sigmoid", True, 1.0)
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [((n_tokens, E), torch.float32), ((n_tokens, K), torch.int32), ((n_tokens,), torch.float32)])
    assert sum(t.numel() * t.element_size() for t in saved) == 4 * n_tokens * (E + K + 1)
    del out


def test_custom_op_registration():
    """Fake (meta) kernels, autograd registration and schema, as torch.library checks them."""
    logits_TE, bias_E, _ = _inputs("softmax", 16, 4, seed=2, n_tokens=8)
    torch.library.opcheck(moe_router, (logits_TE.requires_grad_(), bias_E, 4, "softmax", True, 1.0),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_auto_is_the_reference_on_cpu():
    logits_TE, bias_E, _ = _inputs("sigmoid", 64, 8, seed=4)
    got, want = route(logits_TE, bias_E, 8, "sigmoid", True, 1.0), route_reference(
        logits_TE, bias_E, 8, "sigmoid", True, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_fused_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        route_fused(torch.zeros(2, 8), torch.zeros(8), 2, "softmax", True, 1.0)


def test_interpreter_is_on():
    assert os.environ.get("TRITON_INTERPRET") == "1"


def test_the_kernel_module_imports_nothing_of_the_router():
    """No import circle; the score code and epsilon arrive as arguments."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(router_kernel))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.startswith("steps.moe.router") for m in imported)
    with pytest.raises(ValueError, match="score must be one of"):
        router_kernel.router_forward(torch.zeros(2, 8), torch.zeros(8), 2, 2, True, 1.0, RENORM_EPS)
