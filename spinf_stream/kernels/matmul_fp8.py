"""Batch-invariant float8 GEMM: `y = (x @ w.T)` with float8 e4m3 operands on fp8 tensor cores
(compute capability >= 8.9), fp32 accumulation, and per-row / per-output-channel scales.

Quantization (the common "per-token activation, per-channel weight" scheme of fp8 inference,
e.g. vLLM's `Fp8LinearMethod` with dynamic per-token scales): weights once at load,
`w ≈ w8[n] * sw[n]` with `sw[n] = max|w[n]| / 448`; activations per pass, each row on its own,
`x ≈ x8[r] * sx[r]` with `sx[r] = max|x[r]| / 448` (448: e4m3's largest normal, OCP 8-bit
floating point spec). Then `y[r, n] = sx[r] * sw[n] * sum_k x8[r, k] * w8[n, k]`.

On a GPU (and under the interpreter) the activations are quantized by their producer where it
holds the whole row — the RMSNorm kernel (``rms_norm_fp8_triton``) — else by one Triton pass
(``quantize_rows_triton``); both are bitwise :func:`quantize_rows`. The kernels take such
pre-quantized rows as ``(x8, sx)``.

Invariance: a row's scale is a max (exact in any order) of that row alone; the kernel is the
fixed-tile GEMM of `spinf_stream.kernels.matmul` (one program per output tile, K walked in `FP8_BLOCK_K` steps in
increasing order, never split): a row's bits depend on that row and the weights only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .matmul import ACTIVATIONS, REF_CHUNK_ROWS, gated_config, launch, residual_out, tile_config
from .rmsnorm import quantize_rows_triton

__all__ = ["FP8_MAX", "Rows8", "gated_matmul_fp8_triton", "matmul_fp8", "matmul_fp8_ref", "matmul_fp8_triton",
           "quantize_rows"]

#: Activations already quantized per row: ``(x8 [M, K] float8_e4m3fn, sx [M] fp32)``.
Rows8 = tuple[Tensor, Tensor]

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


def _rows8(x: Tensor | Rows8, w8: Tensor, sw: Tensor, out_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, torch.dtype]:
    """``(x8, sx, output dtype)``: ``x`` quantized in one Triton pass, or as given."""
    if isinstance(x, tuple):
        x8, sx = x
        _check(x8, w8, sw)
        if x8.dtype != torch.float8_e4m3fn or sx.shape != (x8.shape[0],):
            raise ValueError(f"matmul_fp8: pre-quantized rows must be float8_e4m3fn [M, K] and [M], got {x8.dtype} "
                             f"{tuple(x8.shape)} and {tuple(sx.shape)}")
        if out_dtype is None:
            raise ValueError("matmul_fp8: give out_dtype with pre-quantized rows")
        return x8, sx, out_dtype
    _check(x, w8, sw)
    x8, sx = quantize_rows_triton(x)
    return x8, sx, out_dtype or x.dtype


def matmul_fp8_triton(x: Tensor | Rows8, w8: Tensor, sw: Tensor, out_dtype: torch.dtype | None = None,
                      add_to: Tensor | None = None) -> Tensor:
    """`x @ w.T` through float8 with the fixed-tile Triton kernel (CUDA with fp8 tensor cores,
    or CPU under `TRITON_INTERPRET=1`, where float8 is widened to float16 exactly).

    Args:
        x: [M, K] activations (bf16/fp16/fp32), quantized per row here in one pass; or ``(x8, sx)``
            already quantized (``rms_norm_fp8_triton``).
        w8: [N, K] float8_e4m3fn weights; sw: [N] fp32 per-output-channel scales.
        out_dtype: the result's dtype (default ``x.dtype``; required for pre-quantized rows).
        add_to: ``[M, N]`` of the result's dtype: the product is added to it in the epilogue
            (as ``matmul_triton``'s), and it is returned.

    Returns:
        [M, N], accumulated in fp32. Row i is bitwise a function of `x[i]`, `w8`, `sw`.

    Raises:
        ValueError: shapes, dtypes or devices that do not match. RuntimeError: no Triton.
    """
    x8, sx, dtype = _rows8(x, w8, sw, out_dtype)
    M, K = x8.shape
    N = w8.shape[0]
    y = residual_out(add_to, M, N, dtype, x8.device)
    if M == 0 or N == 0:
        return y
    launch(x8, w8, y, tile_config(x8.device, torch.float8_e4m3fn, N, FP8_BLOCK_K, k=K), sx, sw.float().contiguous(),
           residual=add_to is not None)
    return y


def gated_matmul_fp8_triton(x: Tensor | Rows8, w8: Tensor, sw: Tensor, activation: str,
                            out_dtype: torch.dtype | None = None) -> Tensor:
    """``act(x @ gate.T) * (x @ up.T)`` through float8 in one launch (``matmul.gated_matmul_triton``
    with :func:`matmul_fp8_triton`'s operands): ``w8 [2I, K]`` gate rows then up rows, ``sw [2I]``;
    returns ``[M, I]``. Errors as :func:`matmul_fp8_triton`, and an unknown activation."""
    x8, sx, dtype = _rows8(x, w8, sw, out_dtype)
    if activation not in ACTIVATIONS or w8.shape[0] % 2:
        raise ValueError(f"gated matmul_fp8: expected w8 [2I, K] and a known activation, got {tuple(w8.shape)}, {activation!r}")
    M, K = x8.shape
    y = torch.empty((M, w8.shape[0] // 2), dtype=dtype, device=x8.device)
    if M == 0 or y.shape[1] == 0:
        return y
    cfg = gated_config(tile_config(x8.device, torch.float8_e4m3fn, w8.shape[0], FP8_BLOCK_K, k=K))
    launch(x8, w8, y, cfg, sx, sw.float().contiguous(), activation=activation)
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
