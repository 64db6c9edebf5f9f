"""Batch-invariant RMSNorm: `x * rsqrt(mean(x^2) + eps) * (offset + weight)`, in fp32, per row.

`offset` carries the families' conventions: 1.0 for Gemma (`(1 + w)`, weights stored as deltas
from one), 0.0 for Llama, Qwen and Mistral.

Invariance: the Triton kernel reduces each row on its own and sums the squares in a fixed order
(`BLOCK_H`-wide chunks in increasing column order, then one tree reduction of the fp32 partials),
so a row's bits depend on that row alone. `BLOCK_H` and the rows per program depend only on H,
never on T.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._triton import FP_FUSION, cdiv, jit, tl

__all__ = ["MAX_BLOCK_H", "rms_norm", "rms_norm_ref", "rms_norm_triton"]

# Widest chunk of a row read at once; rows wider than this are walked in chunks.
MAX_BLOCK_H = 4096


# T must not become a specialisation key: a variant for "T == 1" (a decode step's one row) or "T
# divisible by 16" would be a second code path for the same row (bench/kernel_table.py finds them).
@jit(do_not_specialize=["T"])
def _rms_norm_kernel(
    X, W, Y,
    T, H, stride_xt, stride_yt,
    eps, offset,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # BLOCK_T rows per program, each reduced on its own along axis 1 (a row never meets another
    # row's values); BLOCK_T is a function of H only, so a row's program shape never depends on T.
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    rows = rows.to(tl.int64)  # row x stride can pass 2**31 elements
    cols = tl.arange(0, BLOCK_H)
    # Pass 1: per-lane fp32 partial sums of squares, chunk after chunk, then one fixed tree sum.
    partial = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + cols
        m = row_ok[:, None] & (h < H)[None, :]
        x = tl.load(X + rows[:, None] * stride_xt + h[None, :], mask=m, other=0.0).to(tl.float32)
        partial += x * x
    inv_rms = 1.0 / tl.sqrt(tl.sum(partial, axis=1) / H + eps)
    # Pass 2: normalise and scale; the row is re-read rather than kept, so any H fits.
    for h0 in range(0, H, BLOCK_H):
        h = h0 + cols
        m = row_ok[:, None] & (h < H)[None, :]
        x = tl.load(X + rows[:, None] * stride_xt + h[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(W + h, mask=h < H, other=0.0).to(tl.float32)
        y = x * inv_rms[:, None] * (offset + w[None, :])
        tl.store(Y + rows[:, None] * stride_yt + h[None, :], y.to(Y.dtype.element_ty), mask=m)


def _check(x: Tensor, weight: Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 1 or weight.shape[0] != x.shape[1]:
        raise ValueError(
            f"rms_norm: expected x [T, H] and weight [H], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.device != weight.device:
        raise ValueError(f"rms_norm: device mismatch, x {x.device} vs weight {weight.device}")


def _block_h(H: int) -> int:
    return min(MAX_BLOCK_H, max(16, 1 << (H - 1).bit_length()))


def _block_t(H: int) -> int:
    """Rows per program: as many as fill one MAX_BLOCK_H-element tile (narrow rows such as
    per-head q/k norms share a program); a function of H only."""
    return max(1, MAX_BLOCK_H // _block_h(H))


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """RMSNorm with the row-wise Triton kernel (CUDA, or CPU under `TRITON_INTERPRET=1`).

    Args:
        x: [T, H] hidden states, fp32/bf16/fp16; rows may be strided, columns must be contiguous
            (a non-contiguous `x` is copied).
        weight: [H] scale, any float dtype, same device.
        eps: added to the mean square (the checkpoint's `rms_norm_eps`).
        offset: added to `weight` (1.0 for Gemma's `(1 + w)`, 0.0 for Llama/Qwen/Mistral).

    Returns:
        [T, H] in `x.dtype`: `x * rsqrt(mean(x^2) + eps) * (offset + weight)`, computed in fp32.
        Row t is bitwise a function of `x[t]`, `weight`, `eps` and `offset` only.

    Raises:
        ValueError: on a shape or device mismatch.
        RuntimeError: if Triton is not installed.
    """
    _check(x, weight)
    if x.stride(1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    T, H = x.shape
    y = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T == 0 or H == 0:
        return y
    block_t = _block_t(H)
    _rms_norm_kernel[(cdiv(T, block_t),)](
        x, weight, y, T, H, x.stride(0), y.stride(0), float(eps), float(offset),
        BLOCK_T=block_t, BLOCK_H=_block_h(H), num_warps=4, enable_fp_fusion=FP_FUSION,
    )
    return y


def rms_norm_ref(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """Torch twin of `rms_norm_triton`: same arguments, result (to rounding) and errors.

    Each row's mean square is a reduction over that row's own contiguous H values, which torch
    vectorises the same way whatever T is (and, for H below torch's 32768-element grain, never
    splits across threads), so the twin is batch-invariant on CPU too.
    """
    _check(x, weight)
    x32 = x.to(torch.float32)
    inv_rms = torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + eps)
    return (x32 * inv_rms * (offset + weight.to(torch.float32))).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """Batch-invariant RMSNorm: the Triton kernel on CUDA tensors, the torch twin elsewhere.

    Shapes, dtypes, units and errors as `rms_norm_triton`.
    """
    if x.is_cuda:
        return rms_norm_triton(x, weight, eps, offset)
    return rms_norm_ref(x, weight, eps, offset)
