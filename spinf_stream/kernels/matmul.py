"""Batch-invariant GEMM: `y = x @ w.T` (a Linear layer without bias), one fixed tile config.

Why fixed: a library GEMM picks its tiling, and sometimes a split of K across thread blocks, from
M, so a token's row is reduced in a different order when the batch around it changes size. Here
every output element is the fp32 sum of `BLOCK_K`-wide `tl.dot` partials taken in increasing K,
one program per `BLOCK_M x BLOCK_N` output tile, never split along K. A row's bits therefore
depend only on that row of `x` and on `w`, not on M or on where the row sits.

The torch twin gets the same property on CPU by always calling the BLAS with the same shape: it
runs the GEMM on fixed `REF_CHUNK_ROWS`-row chunks, zero-padding the last one.

Bias is not fused: add it afterwards (an elementwise add is batch-invariant by itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._triton import FP_FUSION, cdiv, dot_precision, jit, tl
from .aot import planned_capability

__all__ = [
    "BLOCK_K", "BLOCK_M", "BLOCK_N", "REF_CHUNK_ROWS", "TileConfig", "matmul", "matmul_ref", "matmul_triton", "tile_config",
]

# The tile config. BLOCK_K sets the reduction order and is the same for every shape of a dtype;
# BLOCK_M and BLOCK_N only group independent output elements. None of them ever depends on M.
BLOCK_M = 64
BLOCK_N = 128
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 3
#: Under the interpreter each program costs tens of ms whatever its tile: wide outputs (the LM
#: head's vocabulary) take wider tiles there so CI runs in minutes. Same kernel, same K order.
INTERPRETER_BLOCK_N = 1024


@dataclass(frozen=True)
class TileConfig:
    """One GEMM launch's tiles and schedule: a function of the device, the dtype and N only."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def tile_config(device: torch.device, dtype: torch.dtype, n: int, block_k: int = BLOCK_K) -> TileConfig:
    """The tiles for ``[M, K] @ [K, n]`` of ``dtype`` on ``device`` (never a function of M).

    Half-precision on a GPU: 128 x 256 tiles and 8 warps on Hopper and datacenter Blackwell
    (compute capability 9.x and 10.x, the shape that keeps their warpgroup and tcgen05 MMAs fed),
    128 x 128 elsewhere (Ampere, Ada and consumer Blackwell 12.x, whose 99 KiB of shared memory
    per block and 255 registers per thread the wide tile overflows: bench/kernel_table.py); fp32 (the parity checks) and
    the interpreter: the small default tile. The GPU is ``device``'s, or the architecture
    :func:`~spinf_stream.kernels.aot.compiling_for` names.
    """
    capability = planned_capability(device)
    if capability is None:
        wide = n >= 4 * INTERPRETER_BLOCK_N
        return TileConfig(BLOCK_M, INTERPRETER_BLOCK_N if wide else BLOCK_N, block_k, NUM_WARPS, NUM_STAGES)
    if dtype == torch.float32:
        return TileConfig(BLOCK_M, BLOCK_N, block_k, NUM_WARPS, NUM_STAGES)
    major, _ = capability
    if major in (9, 10):
        return TileConfig(128, 256, block_k, 8, 3)
    return TileConfig(128, 128, block_k, 8, 3)

# Row chunk of the torch twin: the BLAS always sees [REF_CHUNK_ROWS, K] @ [K, N].
REF_CHUNK_ROWS = 64


# M must not become a specialisation key: a kernel variant for "M divisible by 16" or "M == 1"
# would be a second code path for the same row.
@jit(do_not_specialize=["M"])
def _matmul_kernel(
    X, W, Y, XS, WS,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, ROW_SCALES: tl.constexpr, COL_SCALES: tl.constexpr, WIDEN_W: tl.constexpr,
):
    # ROW_SCALES / COL_SCALES (the quantized GEMMs): multiply the fp32 result by a per-row XS[m]
    # and by a per-column WS[n]. WIDEN_W: W is int8, widened to X's dtype in registers before the
    # dot (int8 values are exact in bf16, fp16 and fp32).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    # 64-bit offsets: rows x stride can pass 2**31 elements (a vocabulary-wide weight, long passes).
    offs_m = offs_m.to(tl.int64)
    offs_n = offs_n.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K is walked in one fixed order, the same for every row: this loop is the whole reduction.
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        x = tl.load(X + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + offs_n[:, None] * stride_wn + kk[None, :] * stride_wk,
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if WIDEN_W:
            w = w.to(X.dtype.element_ty)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    if ROW_SCALES:
        acc = acc * tl.load(XS + offs_m, mask=m_ok, other=0.0)[:, None]
    if COL_SCALES:
        acc = acc * tl.load(WS + offs_n, mask=n_ok, other=0.0)[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn,
             acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def launch(
    x: Tensor, w: Tensor, y: Tensor, cfg: TileConfig, row_scales: Tensor | None = None, col_scales: Tensor | None = None,
) -> None:
    """Run the fixed-tile kernel: ``y = x @ w.T`` (times ``row_scales[:, None]`` and
    ``col_scales[None, :]`` when given, fp32 ``[M]`` and ``[N]``), ``x [M, K]``, ``w [N, K]``
    (``x``'s dtype, or int8), ``y [M, N]``; tiles from ``cfg``."""
    M, K = x.shape
    N = w.shape[0]
    xs = y if row_scales is None else row_scales  # unread without ROW_SCALES
    ws = y if col_scales is None else col_scales  # unread without COL_SCALES
    grid = (cdiv(M, cfg.block_m), cdiv(N, cfg.block_n))
    _matmul_kernel[grid](
        x, w, y, xs, ws, M, N, K,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION=dot_precision(x.dtype), ROW_SCALES=row_scales is not None, COL_SCALES=col_scales is not None,
        WIDEN_W=w.dtype != x.dtype,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=FP_FUSION,
    )


def _check(x: Tensor, w: Tensor) -> None:
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"matmul: expected x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"matmul: K mismatch, x {tuple(x.shape)} vs w {tuple(w.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"matmul: dtype mismatch, x {x.dtype} vs w {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"matmul: device mismatch, x {x.device} vs w {w.device}")


def matmul_triton(x: Tensor, w: Tensor) -> Tensor:
    """`x @ w.T` with the fixed-tile Triton kernel (CUDA, or CPU under `TRITON_INTERPRET=1`).

    Args:
        x: [M, K] activations, fp32/bf16/fp16, any strides.
        w: [N, K] weight (the `nn.Linear` layout), same dtype and device as `x`.

    Returns:
        [M, N] in `x.dtype`, accumulated in fp32. Row i is bitwise a function of `x[i]` and `w`
        only (for a given device, dtype, N and K).

    Raises:
        ValueError: if the shapes, dtypes or devices do not match.
        RuntimeError: if Triton is not installed.
    """
    _check(x, w)
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    launch(x, w, y, tile_config(x.device, x.dtype, N))
    return y


def matmul_ref(x: Tensor, w: Tensor) -> Tensor:
    """Torch twin of `matmul_triton`: `x @ w.T` on fixed `REF_CHUNK_ROWS`-row chunks.

    Same arguments, result and errors as `matmul_triton` (no Triton needed). Every BLAS call has
    the shape [REF_CHUNK_ROWS, K] @ [K, N] (the last chunk zero-padded), so the BLAS picks the
    same blocking, and therefore the same reduction order, for a row whatever M is.
    """
    _check(x, w)
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    wt = w.t()
    # One contiguous buffer from the allocator: every call sees the same layout and alignment.
    chunk = x.new_zeros((REF_CHUNK_ROWS, K))
    for i in range(0, M, REF_CHUNK_ROWS):
        rows = min(REF_CHUNK_ROWS, M - i)
        if rows < REF_CHUNK_ROWS:
            chunk.zero_()
        chunk[:rows] = x[i:i + rows]
        y[i:i + rows] = (chunk @ wt)[:rows]
    return y


def matmul(x: Tensor, w: Tensor) -> Tensor:
    """`x @ w.T`, batch-invariant: the Triton kernel on CUDA tensors, the torch twin elsewhere.

    Shapes, dtypes and errors as `matmul_triton`. The two back ends agree to rounding, not
    bitwise; each is bitwise batch-invariant on its own.
    """
    if x.is_cuda:
        return matmul_triton(x, w)
    return matmul_ref(x, w)
