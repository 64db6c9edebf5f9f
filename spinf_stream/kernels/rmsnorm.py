"""Batch-invariant RMSNorm: `x * rsqrt(mean(x^2) + eps) * (offset + weight)`, in fp32, per row.

`offset` carries the families' conventions: 1.0 for Gemma (`(1 + w)`, weights stored as deltas
from one), 0.0 for Llama, Qwen and Mistral.

Invariance: the Triton kernel reduces each row on its own and sums the squares in a fixed order
(`BLOCK_H`-wide chunks in increasing column order, then one tree reduction of the fp32 partials),
so a row's bits depend on that row alone. `BLOCK_H` and the rows per program depend only on H,
never on T.

For a float8 GEMM the same kernel writes its output already quantized (``rms_norm_fp8_triton``):
the row's scale is the largest magnitude of the row as the plain kernel would round it, over 448
(a max, exact in any order), and each value is divided by it and rounded to e4m3 — bit for bit
``quantize_rows(rms_norm_triton(x))``, with one write of one byte per value instead of a bf16
row and a separate quantizing pass. Without the norm (``quantize_rows_triton``) it quantizes any
activation in one pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._triton import FP_FUSION, cdiv, jit, tl

__all__ = ["MAX_BLOCK_H", "quantize_rows_triton", "rms_norm", "rms_norm_add_triton", "rms_norm_fp8_triton", "rms_norm_ref", "rms_norm_triton"]

# Widest chunk of a row read at once; rows wider than this are walked in chunks.
MAX_BLOCK_H = 4096


# T must not become a specialisation key: a variant for "T == 1" (a decode step's one row) or "T
# divisible by 16" would be a second code path for the same row (bench/kernel_table.py finds them).
@jit(do_not_specialize=["T"])
def _rms_norm_kernel(
    X, W, Y, S,
    T, H, stride_xt, stride_yt,
    eps, offset,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr, QUANT: tl.constexpr, ADD: tl.constexpr,
):
    # BLOCK_T rows per program, each reduced on its own along axis 1 (a row never meets another
    # row's values); BLOCK_T is a function of H only, so a row's program shape never depends on T.
    # NORM: normalise (else the row as it is: the quantizing pass alone). QUANT: write Y as
    # float8 e4m3 and S[row] its scale (else Y in X's dtype). ADD: Y += the normed row (Y holds
    # the residual stream; the normed row rounded to X's dtype first, the sum in fp32 rounded
    # once: what the unfused norm and an add compute).
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    rows = rows.to(tl.int64)  # row x stride can pass 2**31 elements
    cols = tl.arange(0, BLOCK_H)
    inv_rms = tl.full((BLOCK_T,), 1.0, tl.float32)
    if NORM:
        # Pass 1: per-lane fp32 partial sums of squares, chunk after chunk, then one fixed tree sum.
        partial = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            h = h0 + cols
            m = row_ok[:, None] & (h < H)[None, :]
            x = tl.load(X + rows[:, None] * stride_xt + h[None, :], mask=m, other=0.0).to(tl.float32)
            partial += x * x
        inv_rms = 1.0 / tl.sqrt(tl.sum(partial, axis=1) / H + eps)
    if QUANT:
        # Pass 2: the row's largest magnitude as the plain output would hold it (rounded to X's dtype).
        amax = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            h = h0 + cols
            m = row_ok[:, None] & (h < H)[None, :]
            y = _normed(X, W, rows, h, m, stride_xt, inv_rms, offset, H, NORM)
            amax = tl.maximum(amax, tl.max(tl.abs(y.to(X.dtype.element_ty).to(tl.float32)), axis=1))
        scale = tl.math.div_rn(tl.maximum(amax, 1e-12), 448.0)  # quantize_rows' MIN_SCALE and e4m3's largest
        tl.store(S + rows, scale, mask=row_ok)
    # Pass 2 (3 when quantizing): normalise and scale; the row is re-read rather than kept, so any H fits.
    for h0 in range(0, H, BLOCK_H):
        h = h0 + cols
        m = row_ok[:, None] & (h < H)[None, :]
        y = _normed(X, W, rows, h, m, stride_xt, inv_rms, offset, H, NORM)
        if QUANT:
            q = tl.math.div_rn(y.to(X.dtype.element_ty).to(tl.float32), scale[:, None])
            y = tl.minimum(tl.maximum(q, -448.0), 448.0)
        if ADD:
            y = y.to(X.dtype.element_ty).to(tl.float32) + tl.load(Y + rows[:, None] * stride_yt + h[None, :], mask=m,
                                                                 other=0.0).to(tl.float32)
        tl.store(Y + rows[:, None] * stride_yt + h[None, :], y.to(Y.dtype.element_ty), mask=m)


@jit()
def _normed(X, W, rows, h, m, stride_xt, inv_rms, offset, H, NORM: tl.constexpr):
    """One chunk of rows in fp32: ``x * inv_rms * (offset + w)`` (``x`` itself without NORM)."""
    x = tl.load(X + rows[:, None] * stride_xt + h[None, :], mask=m, other=0.0).to(tl.float32)
    if NORM:
        w = tl.load(W + h, mask=h < H, other=0.0).to(tl.float32)
        x = x * inv_rms[:, None] * (offset + w[None, :])
    return x


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
    return _launch(x, weight, eps, offset, quantize=False)[0]


def _launch(x: Tensor, weight: Tensor | None, eps: float, offset: float, quantize: bool,
            add_to: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(y, scales)``: ``y [T, H]`` (float8 e4m3 when ``quantize``, else x's dtype; ``add_to``
    with the row added when given) and ``[T]`` fp32 scales (empty without ``quantize``); no norm
    without ``weight``."""
    if x.stride(1) != 1:
        x = x.contiguous()
    T, H = x.shape
    if add_to is not None and (add_to.shape != x.shape or add_to.dtype != x.dtype or add_to.stride(1) != 1):
        raise ValueError(f"rms_norm: the residual must be {tuple(x.shape)} {x.dtype} with contiguous rows, got "
                         f"{tuple(add_to.shape)} {add_to.dtype}")
    y = add_to if add_to is not None else torch.empty((T, H), dtype=torch.float8_e4m3fn if quantize else x.dtype,
                                                      device=x.device)
    scales = torch.empty((T if quantize else 0,), dtype=torch.float32, device=x.device)
    if T == 0 or H == 0:
        return y, scales.zero_()
    block_t = _block_t(H)
    w = x if weight is None else weight.contiguous()  # unread without a norm
    _rms_norm_kernel[(cdiv(T, block_t),)](
        x, w, y, scales if quantize else y, T, H, x.stride(0), y.stride(0), float(eps), float(offset),
        BLOCK_T=block_t, BLOCK_H=_block_h(H), NORM=weight is not None, QUANT=quantize, ADD=add_to is not None, num_warps=4,
        enable_fp_fusion=FP_FUSION,
    )
    return y, scales


def rms_norm_fp8_triton(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> tuple[Tensor, Tensor]:
    """RMSNorm written quantized for a float8 GEMM, in one kernel.

    Arguments and errors as :func:`rms_norm_triton`. Returns ``(x8 [T, H] float8_e4m3fn, sx [T]
    fp32)``, bitwise ``quantize_rows(rms_norm_triton(x, weight, eps, offset))``
    (``spinf_stream.kernels.matmul_fp8.quantize_rows``). Row t depends on ``x[t]`` alone.
    """
    _check(x, weight)
    return _launch(x, weight, eps, offset, quantize=True)


def rms_norm_add_triton(x: Tensor, weight: Tensor, eps: float, offset: float, residual: Tensor) -> Tensor:
    """``residual += rms_norm_triton(x, weight, eps, offset)`` in one kernel, in place (Gemma's
    sandwich norms: the attention's and the MLP's outputs normed into the residual stream).
    Bitwise the unfused norm and add. ``residual [T, H]`` in x's dtype; returns it.

    Raises:
        ValueError: as :func:`rms_norm_triton`, or a residual of another shape or dtype.
    """
    _check(x, weight)
    return _launch(x, weight, eps, offset, quantize=False, add_to=residual)[0]


def quantize_rows_triton(x: Tensor) -> tuple[Tensor, Tensor]:
    """``quantize_rows(x)`` in one kernel pass (``x [T, H]`` → ``(x8 [T, H] float8_e4m3fn, sx [T]
    fp32)``, bitwise equal), for activations no norm produces (the attention output, the gated
    MLP's product).

    Raises:
        ValueError: ``x`` not 2-D.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_rows: expected x [T, H], got {tuple(x.shape)}")
    return _launch(x, None, 0.0, 0.0, quantize=True)


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
