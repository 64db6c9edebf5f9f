"""Batch-invariant float8 GEMM: `y = (x @ w.T)` with float8 e4m3 operands on fp8 tensor cores
(compute capability >= 8.9), fp32 accumulation, and per-row / per-output-channel scales.

Quantization (the common "per-token activation, per-channel weight" scheme of fp8 inference,
e.g. vLLM's `Fp8LinearMethod` with dynamic per-token scales): weights once at load,
`w ≈ w8[n] * sw[n]` with `sw[n] = max|w[n]| / 448`; activations per pass, each row on its own,
`x ≈ x8[r] * sx[r]` with `sx[r] = max|x[r]| / 448` (448: e4m3's largest normal, OCP 8-bit
floating point spec). Then `y[r, n] = sx[r] * sw[n] * sum_k x8[r, k] * w8[n, k]`.

Invariance: a row's scale is a max (exact in any order) of that row alone; the kernel is the
fixed-tile GEMM of `spinf_stream.kernels.matmul` (one program per output tile, K walked in `FP8_BLOCK_K` steps in
increasing order, never split): a row's bits depend on that row and the weights only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .matmul import REF_CHUNK_ROWS, launch, tile_config

__all__ = ["FP8_MAX", "matmul_fp8", "matmul_fp8_ref", "matmul_fp8_triton", "quantize_rows"]

#: Largest normal float8 e4m3 (e4m3fn) value.
FP8_MAX = 448.0
#: Smallest scale: an all-zero row quantizes to zeros instead of dividing by zero.
MIN_SCALE = 1e-12
#: K per step for float8 operands (twice the half-precision step: the same bytes per tile).
FP8_BLOCK_K = 128


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row float8 e4m3 quantization: ``x [M, K]`` → ``(x8 [M, K] float8_e4m3fn, sx [M] fp32)``
    with ``x ≈ x8 * sx[:, None]``, ``sx = max|x[r]| / 448``. Each row on its own (a max, then
    elementwise), so a row's result does not depend on the others."""
    xf = x.float()
    sx = xf.abs().amax(dim=1).clamp(min=MIN_SCALE) / FP8_MAX
    x8 = (xf / sx[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return x8, sx


def _check(x: Tensor, w8: Tensor, sw: Tensor) -> None:
    if x.dim() != 2 or w8.dim() != 2 or x.shape[1] != w8.shape[1]:
        raise ValueError(f"matmul_fp8: expected x [M, K] and w8 [N, K], got {tuple(x.shape)} and {tuple(w8.shape)}")
    if w8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"matmul_fp8: w8 must be float8_e4m3fn, got {w8.dtype}")
    if sw.shape != (w8.shape[0],):
        raise ValueError(f"matmul_fp8: expected sw [{w8.shape[0]}], got {tuple(sw.shape)}")
    if not (x.device == w8.device == sw.device):
        raise ValueError("matmul_fp8: x, w8 and sw must be on one device")


def matmul_fp8_triton(x: Tensor, w8: Tensor, sw: Tensor) -> Tensor:
    """`x @ w.T` through float8 with the fixed-tile Triton kernel (CUDA with fp8 tensor cores,
    or CPU under `TRITON_INTERPRET=1`, where float8 is widened to float16 exactly).

    Args:
        x: [M, K] activations (bf16/fp16/fp32), quantized per row here.
        w8: [N, K] float8_e4m3fn weights; sw: [N] fp32 per-output-channel scales.

    Returns:
        [M, N] in `x.dtype`, accumulated in fp32. Row i is bitwise a function of `x[i]`, `w8`, `sw`.

    Raises:
        ValueError: shapes, dtypes or devices that do not match. RuntimeError: no Triton.
    """
    _check(x, w8, sw)
    M, K = x.shape
    N = w8.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    x8, sx = quantize_rows(x)
    launch(x8, w8, y, tile_config(x.device, torch.float8_e4m3fn, N, FP8_BLOCK_K), sx, sw.float().contiguous())
    return y


def matmul_fp8_ref(x: Tensor, w8: Tensor, sw: Tensor) -> Tensor:
    """Torch twin of `matmul_fp8_triton`: the same quantization, then the dequantized operands'
    product in fp32 on fixed `REF_CHUNK_ROWS`-row chunks (as `matmul_ref`). Same arguments,
    result (to rounding) and errors."""
    _check(x, w8, sw)
    M, K = x.shape
    N = w8.shape[0]
    x8, sx = quantize_rows(x)
    wt = w8.float().t()
    y = torch.empty((M, N), dtype=torch.float32, device=x.device)
    chunk = torch.zeros((REF_CHUNK_ROWS, K), dtype=torch.float32, device=x.device)
    for i in range(0, M, REF_CHUNK_ROWS):
        rows = min(REF_CHUNK_ROWS, M - i)
        chunk.zero_()
        chunk[:rows] = x8[i:i + rows].float()
        y[i:i + rows] = (chunk @ wt)[:rows]
    return (y * sx[:, None] * sw.float()[None, :]).to(x.dtype)


def matmul_fp8(x: Tensor, w8: Tensor, sw: Tensor) -> Tensor:
    """Float8 GEMM, batch-invariant: the Triton kernel on CUDA tensors, the torch twin elsewhere."""
    if x.is_cuda:
        return matmul_fp8_triton(x, w8, sw)
    return matmul_fp8_ref(x, w8, sw)
