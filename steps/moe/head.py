"""The output head fused with the cross-entropy, chunked over the vocabulary: the summed
negative log-likelihood of the targets without ever holding the [T, V] logits.

Shape legend: T tokens, D model width, V vocabulary, c vocabulary rows of one chunk.

Forward, chunk by chunk of the head's rows: logits_Tc = h_TD @ w_cD^T (in the weights' dtype,
as the plain head computes them), their fp32 log-sum-exp and the targets' logits where the
target falls in the chunk; the chunks' log-sum-exps are combined at the end. Only h, w, the
targets and the fp32 lse_T are kept for the backward.

Backward, chunk by chunk again: the logits recomputed, p_Tc = exp(logits - lse) minus one at
each target, times the incoming gradient, cast to the weights' dtype (as the plain head's
backward receives it); dw_cD = dlogits^T @ h is one matmul over every token, written to its
rows of dw (no accumulation across chunks), and dh_TD sums the chunks' dlogits @ w_cD in fp32.

Memory: about 12 bytes x T x c at a time (the chunk's logits, their fp32 copy, p and its
gradient) instead of 12 x T x V; at 535B, micro-batch 1 (T = 4,095) and c = 8,192 that is
0.4 GB instead of 6.3 GB (steps/scale/memory.py `head_bytes`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class _HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_TD: Tensor, w_VD: Tensor, targets_T: Tensor, chunk: int) -> Tensor:
        V = w_VD.shape[0]
        lses, picked_T = [], torch.zeros(h_TD.shape[0], dtype=torch.float32, device=h_TD.device)
        for v0 in range(0, V, chunk):
            logits_Tc = (h_TD @ w_VD[v0:v0 + chunk].t()).float()
            lses.append(torch.logsumexp(logits_Tc, -1))
            inside_T = (targets_T >= v0) & (targets_T < v0 + logits_Tc.shape[1])
            local_T = (targets_T - v0).clamp(0, logits_Tc.shape[1] - 1)
            picked_T = picked_T + torch.where(inside_T, logits_Tc.gather(1, local_T[:, None])[:, 0], 0.0)
        lse_T = lses[0] if len(lses) == 1 else torch.logsumexp(torch.stack(lses, -1), -1)
        ctx.save_for_backward(h_TD, w_VD, targets_T, lse_T)
        ctx.chunk = chunk
        return (lse_T - picked_T).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        h_TD, w_VD, targets_T, lse_T = ctx.saved_tensors
        chunk, V = ctx.chunk, w_VD.shape[0]
        dh_TD = torch.zeros(h_TD.shape, dtype=torch.float32, device=h_TD.device)
        dw_VD = torch.empty_like(w_VD)
        for v0 in range(0, V, chunk):
            w_cD = w_VD[v0:v0 + chunk]
            p_Tc = torch.exp((h_TD @ w_cD.t()).float() - lse_T[:, None])
            inside_T = (targets_T >= v0) & (targets_T < v0 + w_cD.shape[0])
            local_T = (targets_T - v0).clamp(0, w_cD.shape[0] - 1)
            p_Tc.scatter_add_(1, local_T[:, None], -inside_T.to(p_Tc.dtype)[:, None])  # minus one at the target
            d_Tc = (p_Tc * grad).to(h_TD.dtype)
            dw_VD[v0:v0 + chunk] = d_Tc.t() @ h_TD
            dh_TD += (d_Tc @ w_cD).float()
        return dh_TD.to(h_TD.dtype), dw_VD, None, None


def head_loss(h_TD: Tensor, w_VD: Tensor, targets_T: Tensor, chunk: int) -> Tensor:
    """Summed cross-entropy (nats, fp32) of `targets_T` under the logits h_TD @ w_VD^T."""
    return _HeadLoss.apply(h_TD, w_VD, targets_T, chunk)


class Head(nn.Linear):
    """The output head (no bias): logits when called on activations alone, the mean
    cross-entropy of `targets` (fused and chunked, `head_loss`) when given them. One module
    call either way, so FSDP2 gathers its weight once."""

    def __init__(self, dim: int, vocab: int, chunk: int) -> None:
        super().__init__(dim, vocab, bias=False)
        self.chunk = chunk

    def forward(self, x: Tensor, targets: Tensor | None = None) -> Tensor:
        if targets is None:
            return super().forward(x)
        h_TD, t_T = x.reshape(-1, x.shape[-1]), targets.reshape(-1)
        return head_loss(h_TD, self.weight, t_T, self.chunk) / t_T.numel()
