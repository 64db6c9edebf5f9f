"""Batch-invariant row log-sum-exp: `lse[r] = log(sum_v exp(x[r, v]))`, in fp32, per row.

The LM head reads `logprob(token) = logits[r, token] - lse[r]` (log-softmax at the read tokens
only), so this is the one reduction over the vocabulary.

Invariance: one program per row walks the row in `BLOCK_V`-wide chunks in increasing column
order, keeping per-lane running maxima and rescaled sums (the online softmax of Milakov &
Gimelshein 2018, "Online normalizer calculation for softmax", arXiv:1805.02867), then reduces
the lanes with one fixed tree. `BLOCK_V` is a constant: a row's bits depend on that row alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._triton import FP_FUSION, jit, tl

__all__ = ["BLOCK_V", "logsumexp", "logsumexp_ref", "logsumexp_triton"]

#: Columns per step; fixed for every vocabulary size (changing it changes the bits).
BLOCK_V = 1024


@jit()
def _logsumexp_kernel(X, OUT, V, stride_x, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row x stride can pass 2**31 elements
    cols = tl.arange(0, BLOCK_V)
    m = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        x = tl.load(X + row * stride_x + v0 + cols, mask=v0 + cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf keeps m = -inf: rescale against 0 so it stays 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
        m = m_new
    top = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - top), axis=0)
    tl.store(OUT + row, top + tl.log(total))


def _check(x: Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"logsumexp: expected logits [R, V], got {tuple(x.shape)}")


def logsumexp_triton(x: Tensor) -> Tensor:
    """Row log-sum-exp with the one-program-per-row Triton kernel (CUDA, or CPU under
    `TRITON_INTERPRET=1`).

    Args:
        x: [R, V] logits, fp32/bf16/fp16; columns contiguous (else copied).

    Returns:
        [R] fp32 (natural log). Row r is bitwise a function of `x[r]` only.

    Raises:
        ValueError: `x` is not 2-D. RuntimeError: Triton is not installed.
    """
    _check(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    R, V = x.shape
    out = torch.empty(R, dtype=torch.float32, device=x.device)
    if R == 0:
        return out
    _logsumexp_kernel[(R,)](x, out, V, x.stride(0), BLOCK_V=BLOCK_V, num_warps=8, enable_fp_fusion=FP_FUSION)
    return out


def logsumexp_ref(x: Tensor) -> Tensor:
    """Torch twin of `logsumexp_triton`: same arguments, result (to rounding) and errors.

    Sums in two fixed levels — `BLOCK_V`-wide chunks of the row, then the chunks — instead of
    `torch.logsumexp`: when a single row is reduced, ATen splits the row across threads
    (a two-pass reduction), so a row's bits would depend on how many rows came with it.
    Here every sum has many outputs or a short row, and is never split.
    """
    _check(x)
    x = x.to(torch.float32)
    R, V = x.shape
    if V == 0:
        return torch.full((R,), float("-inf"))
    top = x.amax(dim=-1, keepdim=True)  # exact whatever the order
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(x - top)
    pad = -V % BLOCK_V
    if pad:
        e = torch.cat([e, e.new_zeros(R, pad)], dim=1)
    total = e.view(R, -1, BLOCK_V).sum(dim=-1).sum(dim=-1)
    return torch.log(total) + top[:, 0]


def logsumexp(x: Tensor) -> Tensor:
    """Batch-invariant row log-sum-exp: the Triton kernel on CUDA tensors, the torch twin elsewhere."""
    if x.is_cuda:
        return logsumexp_triton(x)
    return logsumexp_ref(x)
