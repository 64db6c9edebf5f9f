"""Batch-invariant weight-only int8 GEMM (W8A16): `y = x @ (q * s[:, None]).T` with int8 weights,
one fp32 scale per output channel, activations in their own dtype (bf16 on a GPU).

Quantization (symmetric, per output channel, as in LLM.int8()'s vector-wise weights and torchao's
int8 weight-only): `s[n] = max|w[n]| / 127`, `q[n, k] = round(w[n, k] / s[n])` in [-127, 127],
done once at load (`spinf_stream.models.quantize_int8`). The kernel widens each int8 weight tile
to the activations' dtype in registers (exact: |q| <= 127 fits bf16's 8-bit significand) and runs
the half-precision MMA of `spinf_stream.kernels.matmul` with fp32 accumulation, then multiplies
column n by `s[n]`: `y[r, n] = s[n] * sum_k x[r, k] * q[n, k]`.

Why W8A16 and not W8A8: activations are not quantized, so the only error is the weights' (the
agreement with bf16 is the weights' rounding alone), and the GEMM is the bf16 one, tile for tile:
the same fixed reduction order, batch-invariant for the same reason. Int8 weights halve the
weight memory and its traffic (a 12B model in 12 GB: it fits a 24 GB A10); the MMA stays bf16.

Invariance: as `matmul`: one program per output tile, K walked in `BLOCK_K` steps in increasing
order, never split; the scale is per column. A row's bits depend on that row and the weights only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .matmul import ACTIVATIONS, REF_CHUNK_ROWS, gated_config, launch, residual_out, tile_config

__all__ = ["INT8_MAX", "gated_matmul_int8_triton", "matmul_int8", "matmul_int8_ref", "matmul_int8_triton"]

#: Largest int8 magnitude used (symmetric: -128 is never produced).
INT8_MAX = 127


def _check(x: Tensor, q: Tensor, s: Tensor) -> None:
    if x.dim() != 2 or q.dim() != 2 or x.shape[1] != q.shape[1]:
        raise ValueError(f"matmul_int8: expected x [M, K] and q [N, K], got {tuple(x.shape)} and {tuple(q.shape)}")
    if q.dtype != torch.int8:
        raise ValueError(f"matmul_int8: q must be int8, got {q.dtype}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"matmul_int8: x must be a float tensor, got {x.dtype}")
    if s.shape != (q.shape[0],):
        raise ValueError(f"matmul_int8: expected s [{q.shape[0]}], got {tuple(s.shape)}")
    if not (x.device == q.device == s.device):
        raise ValueError("matmul_int8: x, q and s must be on one device")


def matmul_int8_triton(x: Tensor, q: Tensor, s: Tensor, add_to: Tensor | None = None) -> Tensor:
    """`x @ (q * s[:, None]).T` with the fixed-tile Triton kernel (CUDA, compute capability >= 8.0;
    or CPU under `TRITON_INTERPRET=1`, in float32).

    Args:
        x: [M, K] activations (bf16/fp16/fp32). q: [N, K] int8 weights. s: [N] fp32 scales.
        add_to: [M, N] in x's dtype: the product is added to it in the epilogue, and it is returned.

    Returns:
        [M, N] in `x.dtype`, accumulated in fp32, scaled in fp32, rounded once. Row i is bitwise a
        function of `x[i]`, `q` and `s`.

    Raises:
        ValueError: shapes, dtypes or devices that do not match. RuntimeError: no Triton.
    """
    _check(x, q, s)
    M, K = x.shape
    N = q.shape[0]
    y = residual_out(add_to, M, N, x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    launch(x.contiguous(), q, y, tile_config(x.device, x.dtype, N, k=K), col_scales=s.float().contiguous(),
           residual=add_to is not None)
    return y


def gated_matmul_int8_triton(x: Tensor, q: Tensor, s: Tensor, activation: str) -> Tensor:
    """``act(x @ gate.T) * (x @ up.T)`` with int8 weights ``q [2I, K]`` (gate rows, then up) and
    their scales ``s [2I]``, in one launch (as ``matmul.gated_matmul_triton``): ``[M, I]`` in
    ``x.dtype``. Errors as :func:`matmul_int8_triton`, and an unknown activation or odd row count."""
    _check(x, q, s)
    if activation not in ACTIVATIONS or q.shape[0] % 2:
        raise ValueError(f"gated matmul_int8: expected q [2I, K] and a known activation, got {tuple(q.shape)}, {activation!r}")
    M, K = x.shape
    y = torch.empty((M, q.shape[0] // 2), dtype=x.dtype, device=x.device)
    if M == 0 or y.shape[1] == 0:
        return y
    cfg = gated_config(tile_config(x.device, x.dtype, q.shape[0], k=K))
    launch(x.contiguous(), q, y, cfg, col_scales=s.float().contiguous(), activation=activation)
    return y


def matmul_int8_ref(x: Tensor, q: Tensor, s: Tensor) -> Tensor:
    """Torch twin of `matmul_int8_triton`: the fp32 product of `x` and the int8 values on fixed
    `REF_CHUNK_ROWS`-row chunks (as `matmul_ref`; every product of a bf16 and an int8 value is
    exact in fp32), times `s`, rounded once to `x.dtype`. Same arguments, result (to the
    summation order) and errors."""
    _check(x, q, s)
    M, K = x.shape
    N = q.shape[0]
    qt = q.float().t()
    y = torch.empty((M, N), dtype=torch.float32, device=x.device)
    chunk = torch.zeros((REF_CHUNK_ROWS, K), dtype=torch.float32, device=x.device)
    for i in range(0, M, REF_CHUNK_ROWS):
        rows = min(REF_CHUNK_ROWS, M - i)
        chunk.zero_()
        chunk[:rows] = x[i:i + rows].float()
        y[i:i + rows] = (chunk @ qt)[:rows]
    return (y * s.float()[None, :]).to(x.dtype)


def matmul_int8(x: Tensor, q: Tensor, s: Tensor) -> Tensor:
    """Weight-only int8 GEMM, batch-invariant: the Triton kernel on CUDA tensors, the torch twin elsewhere."""
    if x.is_cuda:
        return matmul_int8_triton(x, q, s)
    return matmul_int8_ref(x, q, s)
