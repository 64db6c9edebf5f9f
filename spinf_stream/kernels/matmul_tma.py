"""The GEMM on Hopper and datacenter Blackwell: persistent programs that load their tiles through
the tensor memory accelerator (TMA tensor descriptors), with the deepest pipeline the shared
memory allows. Same contract and the same reduction rule as ``spinf_stream.kernels.matmul``.

Invariance: a program computes whole output tiles, each with K walked in ``BLOCK_K`` steps in
increasing order from a zero accumulator, never split; the persistent schedule (programs =
streaming multiprocessors, tiles taken ``group_m`` row tiles per column strip so a weight strip
stays in L2) decides only *which* program computes a tile, never the order of its sum. TMA
zero-fills what lies past M, N or K, as the tiled kernel's masked loads do.

Tensor descriptors are Triton's host-side ``TensorDescriptor`` (Triton 3.4 on, so the lent GPU's
3.6 and CI's 3.9 alike); the interpreter runs them too, which is how CI checks this kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._triton import FP_FUSION, HAS_TRITON, cdiv, dot_precision, jit, tl
from .aot import ARCHS, planned_capability
from .epilogue import scale_and_activate, store_tile

__all__ = ["launch_tma", "programs", "tma_ready"]


# M and the program count must not pick variants (see matmul.py); nor the model's UP_OFFSET.
@jit(do_not_specialize=["M", "UP_OFFSET", "PROGRAMS"])
def _matmul_tma_kernel(
    X, W, Y, XS, WS,
    M, N, K, UP_OFFSET, PROGRAMS, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr, ROW_SCALES: tl.constexpr, COL_SCALES: tl.constexpr, ACTIVATION: tl.constexpr,
):
    # X, W: tensor descriptors of x [M, K] and w [N or 2I, K] with block shapes [BLOCK_M, BLOCK_K]
    # and [BLOCK_N, BLOCK_K]; Y: y [M, N], stored from registers (a TMA store would take a
    # [BLOCK_M, BLOCK_N] staging buffer of shared memory the pipeline's stages need).
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    for tile in range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS):
        # which tile: GROUP_M row tiles down one column strip, then the next strip
        first_m = (tile // in_group) * GROUP_M
        rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (tile % in_group) % rows_here
        pid_n = (tile % in_group) // rows_here
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # the whole reduction: K in BLOCK_K steps, increasing, as in the tiled kernel
        for k0 in range(0, K, BLOCK_K):
            x = X.load([off_m, k0])
            acc = tl.dot(x, W.load([off_n, k0]).T, acc, input_precision=DOT_PRECISION)
            if ACTIVATION != 0:
                up = tl.dot(x, W.load([UP_OFFSET + off_n, k0]).T, up, input_precision=DOT_PRECISION)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        m_ok = offs_m < M
        n_ok = offs_n < N
        y = scale_and_activate(acc, up, XS, WS, offs_m, offs_n, m_ok, n_ok, UP_OFFSET, ROW_SCALES, COL_SCALES, ACTIVATION)
        store_tile(Y, y, offs_m, offs_n, m_ok, n_ok, stride_ym, 1, False)


def tma_ready(*tensors: Tensor) -> bool:
    """Whether TMA can address every tensor (the loaded ones; ``y`` is checked too, so the rule
    stays one): 2-D, rows contiguous, base and row stride multiples
    of 16 bytes (the tensor memory accelerator's rule). A model's weights and the engine's
    fresh activations meet it whenever K and N are multiples of 16 bytes' elements."""
    if not HAS_TRITON:
        return False
    for t in tensors:
        if t.dim() != 2 or t.stride(1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def programs(device: torch.device, tiles: int) -> int:
    """Persistent programs for ``tiles`` output tiles: one per streaming multiprocessor at most
    (the device's count; inside ``compiling_for``, the architecture's; under the interpreter, 4)."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        cap = planned_capability(device)
        sms = 4 if cap is None else ARCHS[cap[0] * 10 + cap[1]].sms
    return max(1, min(tiles, sms))


def launch_tma(x: Tensor, w: Tensor, y: Tensor, cfg, row_scales: Tensor | None, col_scales: Tensor | None,
               activation: int, up_offset: int) -> None:
    """Launch the persistent kernel (arguments as ``matmul.launch``; ``activation`` its code)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = x.shape
    N = y.shape[1]
    xd = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    wd = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    n_programs = programs(x.device, cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n))
    _matmul_tma_kernel[(n_programs,)](
        xd, wd, y, y if row_scales is None else row_scales, y if col_scales is None else col_scales,
        M, N, K, up_offset, n_programs, y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        DOT_PRECISION=dot_precision(x.dtype), ROW_SCALES=row_scales is not None,
        COL_SCALES=col_scales is not None, ACTIVATION=activation,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=FP_FUSION,
    )
