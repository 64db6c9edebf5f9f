"""Batch-invariant GEMM: `y = x @ w.T` (a Linear layer without bias), one fixed tile config.

Why fixed: a library GEMM picks its tiling, and sometimes a split of K across thread blocks, from
M, so a token's row is reduced in a different order when the batch around it changes size. Here
every output element is the fp32 sum of `BLOCK_K`-wide `tl.dot` partials taken in increasing K,
one program per `BLOCK_M x BLOCK_N` output tile, never split along K. A row's bits therefore
depend only on that row of `x` and on `w`, not on M or on where the row sits.

The torch twin gets the same property on CPU by always calling the BLAS with the same shape: it
runs the GEMM on fixed `REF_CHUNK_ROWS`-row chunks, zero-padding the last one.

Bias is not fused: add it afterwards (an elementwise add is batch-invariant by itself). The
gated MLP's activation is (``gated_matmul_triton``): a program holds the gate's and the up
projection's accumulators for the same columns, each reduced by the rule above, and writes
``act(gate) * up`` once.

On Hopper and datacenter Blackwell a launch may take the persistent tensor-descriptor kernel
(``spinf_stream.kernels.matmul_tma``); which kernel and tile a GEMM gets is a function of the
architecture, the dtype, N and K (``tile_config``), read from ``gemm_tiles.json`` where a GPU
sweep measured one (``bench/gpu_sweep.py``), else the rule below.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from ._triton import FP_FUSION, cdiv, dot_precision, jit, tl
from .aot import planned_capability
from .epilogue import ACTIVATIONS, scale_and_activate, store_tile
from .matmul_tma import launch_tma, tma_ready

__all__ = [
    "ACTIVATIONS", "BLOCK_K", "BLOCK_M", "BLOCK_N", "REF_CHUNK_ROWS", "TUNED", "TileConfig", "gated_matmul_ref",
    "gated_matmul_triton", "install_tiles", "matmul", "matmul_ref", "matmul_triton", "tile_config", "tuned_tiles",
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
    """One GEMM launch's kernel, tiles and schedule: a function of the device, the dtype, N and K.

    ``kernel``: ``"tiled"`` (one program per output tile, pointer loads: every architecture and
    the interpreter) or ``"tma"`` (persistent programs, tensor-descriptor loads: compute
    capability 9.x and 10.x). ``group_m``: row tiles a persistent program's schedule walks per
    column strip (only which program computes a tile, never how).
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    kernel: str = "tiled"
    group_m: int = 8


#: Kernels and tiles measured best by a GPU sweep: ``(sm, dtype name, N, K) -> TileConfig``, from
#: ``gemm_tiles.json`` (written by ``bench/gpu_sweep.py``; empty until a GPU run fills it).
TUNED: dict[tuple[int, str, int, int], TileConfig] = {}
TILES_FILE = Path(__file__).with_name("gemm_tiles.json")


def _dtype_name(dtype: torch.dtype) -> str:
    return "fp8" if dtype == torch.float8_e4m3fn else str(dtype).removeprefix("torch.")


def install_tiles(entries: list[dict]) -> None:
    """Add measured tiles (``gemm_tiles.json``'s ``tiles`` rows: ``sm``, ``dtype``, ``n``, ``k``
    and a :class:`TileConfig`'s fields) to :data:`TUNED`.

    Raises:
        ValueError: a row with a field missing, unknown, or a kernel that is not ``tiled``/``tma``.
    """
    fields = set(TileConfig.__dataclass_fields__)
    for e in entries:
        cfg = {k: v for k, v in e.items() if k in fields}
        missing = {"sm", "dtype", "n", "k", "block_m", "block_n", "block_k", "num_warps", "num_stages"} - set(e)
        if missing or cfg.get("kernel", "tiled") not in ("tiled", "tma"):
            raise ValueError(f"{TILES_FILE.name}: bad row {e} (missing {sorted(missing)} or unknown kernel)")
        TUNED[(int(e["sm"]), str(e["dtype"]), int(e["n"]), int(e["k"]))] = TileConfig(**cfg)


def tuned_tiles(device: torch.device, dtype: torch.dtype) -> str:
    """What :data:`TUNED` holds for ``device``'s architecture and ``dtype`` (and fp8's GEMMs when
    ``dtype`` is bf16: an fp8 pass's activations are bf16), named for the records' ``tiles``:
    ``"measured tiles <n> <sha256 prefix>"``, or ``""`` when none (the rule decides)."""
    import hashlib

    cap = planned_capability(device)
    if cap is None:
        return ""
    sm = cap[0] * 10 + cap[1]
    names = {_dtype_name(dtype), "fp8"} if dtype == torch.bfloat16 else {_dtype_name(dtype)}
    rows = sorted(json.dumps({"sm": sm, "dtype": d, "n": n, "k": k, **asdict(cfg)}, sort_keys=True)
                  for (s, d, n, k), cfg in TUNED.items() if s == sm and d in names)
    if not rows:
        return ""
    return f"measured tiles {len(rows)} {hashlib.sha256(chr(10).join(rows).encode()).hexdigest()[:12]}"


def tile_row(sm: int, dtype: torch.dtype, n: int, k: int, cfg: TileConfig) -> dict:
    """One ``gemm_tiles.json`` row (what :func:`install_tiles` reads)."""
    return {"sm": sm, "dtype": _dtype_name(dtype), "n": n, "k": k, **asdict(cfg)}


install_tiles(json.loads(TILES_FILE.read_text())["tiles"])


def tile_config(device: torch.device, dtype: torch.dtype, n: int, block_k: int = BLOCK_K, k: int | None = None) -> TileConfig:
    """The kernel and tiles for ``[M, k] @ [k, n]`` of ``dtype`` on ``device`` (never a function of M).

    A GPU sweep's measured winner for (architecture, dtype, ``n``, ``k``) when :data:`TUNED`
    holds one; otherwise the rule:

    Half-precision on a GPU: 128 x 256 tiles and 8 warps on Hopper and datacenter Blackwell
    (compute capability 9.x and 10.x, the shape that keeps their warpgroup and tcgen05 MMAs fed),
    128 x 128 elsewhere (Ampere, Ada and consumer Blackwell 12.x, whose 99 KiB of shared memory
    per block and 255 registers per thread the wide tile overflows: bench/kernel_table.py); fp32 (the parity checks) and
    the interpreter: the small default tile. The GPU is ``device``'s, or the architecture
    :func:`~spinf_stream.kernels.aot.compiling_for` names.
    """
    capability = planned_capability(device)
    if capability is not None and k is not None:
        tuned = TUNED.get((capability[0] * 10 + capability[1], _dtype_name(dtype), n, k))
        if tuned is not None:
            return tuned
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
# would be a second code path for the same row. UP_OFFSET (the gated MLP's intermediate size)
# is a model constant that must not pick variants either.
@jit(do_not_specialize=["M", "UP_OFFSET"])
def _matmul_kernel(
    X, W, Y, XS, WS,
    M, N, K, UP_OFFSET,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, ROW_SCALES: tl.constexpr, COL_SCALES: tl.constexpr, WIDEN_W: tl.constexpr,
    ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
):
    # ROW_SCALES / COL_SCALES (the quantized GEMMs): multiply the fp32 result by a per-row XS[m]
    # and by a per-column WS[n]. WIDEN_W: W is int8, widened to X's dtype in registers before the
    # dot (int8 values are exact in bf16, fp16 and fp32). ACTIVATION (the gated MLP): W's rows
    # n and UP_OFFSET + n are the gate's and the up projection's; Y = act(gate) * up. RESIDUAL:
    # Y += the result (Y holds the residual stream).
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
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
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
        if ACTIVATION != 0:
            wu = tl.load(W + (UP_OFFSET + offs_n)[:, None] * stride_wn + kk[None, :] * stride_wk,
                         mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if WIDEN_W:
                wu = wu.to(X.dtype.element_ty)
            up = tl.dot(x, tl.trans(wu), up, input_precision=DOT_PRECISION)
    y = scale_and_activate(acc, up, XS, WS, offs_m, offs_n, m_ok, n_ok, UP_OFFSET, ROW_SCALES, COL_SCALES, ACTIVATION)
    store_tile(Y, y, offs_m, offs_n, m_ok, n_ok, stride_ym, stride_yn, RESIDUAL)


def launch(
    x: Tensor, w: Tensor, y: Tensor, cfg: TileConfig, row_scales: Tensor | None = None, col_scales: Tensor | None = None,
    activation: str | None = None, residual: bool = False,
) -> None:
    """Run the GEMM ``cfg`` names: ``y = x @ w.T`` (times ``row_scales[:, None]`` and
    ``col_scales[None, :]`` when given, fp32 ``[M]`` and ``[N]``), ``x [M, K]``, ``w [N, K]``
    (``x``'s dtype, or int8), ``y [M, N]``. With ``activation`` (a key of :data:`ACTIVATIONS`),
    ``w [2I, K]`` stacks gate and up, ``col_scales`` is ``[2I]`` and ``y [M, I] = act(gate) * up``.
    With ``residual``, ``y += ...`` instead (``y`` must not overlap ``x``).

    A ``"tma"`` config runs the persistent tensor-descriptor kernel where the operands meet the
    tensor memory accelerator's alignment (16-byte base and row strides; a property of the model's
    shapes, not of M) and nothing is added into ``y``, else the tiled kernel with the same tiles.
    """
    M, K = x.shape
    N = y.shape[1]
    if residual:
        cfg = residual_config(cfg)
    act = 0 if activation is None else ACTIVATIONS[activation]
    up_offset = w.shape[0] // 2 if act else 0
    # the persistent kernel spills with the residual's tile beside its accumulator (sm_90, 128x128:
    # 192 bytes in bf16 with 4 warps, 48 in fp8 with 8): adding launches take the tiled kernel
    if cfg.kernel == "tma" and not residual and w.dtype == x.dtype and tma_ready(x, w, y):
        launch_tma(x, w, y, cfg, row_scales, col_scales, act, up_offset)
        return
    xs = y if row_scales is None else row_scales  # unread without ROW_SCALES
    ws = y if col_scales is None else col_scales  # unread without COL_SCALES
    grid = (cdiv(M, cfg.block_m), cdiv(N, cfg.block_n))
    _matmul_kernel[grid](
        x, w, y, xs, ws, M, N, K, up_offset,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION=dot_precision(x.dtype), ROW_SCALES=row_scales is not None, COL_SCALES=col_scales is not None,
        WIDEN_W=w.dtype != x.dtype, ACTIVATION=act, RESIDUAL=residual,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=FP_FUSION,
    )


def residual_config(cfg: TileConfig) -> TileConfig:
    """The tiles of a launch that adds into the residual: at most 128 columns and at most 64
    accumulator values a thread, since the residual's tile is held beside the accumulator (the
    128x256 tile spills with it: 344 bytes in fp8 on sm_90, 8 in bf16 on sm_100; 128x128 with 4
    warps 128 bytes on sm_90; docs/kernels.md). Columns and warps only group independent
    outputs: the sums keep their order."""
    block_n = min(cfg.block_n, 128)
    warps = max(cfg.num_warps, cfg.block_m * block_n // (64 * 32))
    return TileConfig(cfg.block_m, block_n, cfg.block_k, warps, cfg.num_stages, cfg.kernel, cfg.group_m)


def gated_config(cfg: TileConfig) -> TileConfig:
    """The tiles of a gated launch: half the columns, since a program holds two accumulators (the
    gate's and the up projection's) — the same registers and shared memory as ``cfg``."""
    return TileConfig(cfg.block_m, max(16, cfg.block_n // 2), cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.kernel,
                      cfg.group_m)


def _check(x: Tensor, w: Tensor) -> None:
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"matmul: expected x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"matmul: K mismatch, x {tuple(x.shape)} vs w {tuple(w.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"matmul: dtype mismatch, x {x.dtype} vs w {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"matmul: device mismatch, x {x.device} vs w {w.device}")


def matmul_triton(x: Tensor, w: Tensor, add_to: Tensor | None = None) -> Tensor:
    """`x @ w.T` with the fixed-tile Triton kernel (CUDA, or CPU under `TRITON_INTERPRET=1`).

    Args:
        x: [M, K] activations, fp32/bf16/fp16, any strides.
        w: [N, K] weight (the `nn.Linear` layout), same dtype and device as `x`.

        add_to: [M, N] in x's dtype (the residual stream): the product is added to it in the
            GEMM's epilogue, in fp32, rounded once, and it is returned.

    Returns:
        [M, N] in `x.dtype`, accumulated in fp32. Row i is bitwise a function of `x[i]` and `w`
        only (for a given device, dtype, N and K), and of `add_to[i]`.

    Raises:
        ValueError: if the shapes, dtypes or devices do not match.
        RuntimeError: if Triton is not installed.
    """
    _check(x, w)
    M, K = x.shape
    N = w.shape[0]
    y = residual_out(add_to, M, N, x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y if add_to is not None else y.zero_()
    launch(x, w, y, tile_config(x.device, x.dtype, N, k=K), residual=add_to is not None)
    return y


def residual_out(add_to: Tensor | None, m: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A GEMM's output: a new ``[m, n]`` tensor, or ``add_to`` checked to be one it can add into.

    Raises:
        ValueError: ``add_to`` of another shape, dtype or device, or with non-unit column stride.
    """
    if add_to is None:
        return torch.empty((m, n), dtype=dtype, device=device)
    if add_to.shape != (m, n) or add_to.dtype != dtype or add_to.device != device or add_to.stride(1) != 1:
        raise ValueError(f"matmul: add_to must be [{m}, {n}] {dtype} on {device} with contiguous rows, got "
                         f"{tuple(add_to.shape)} {add_to.dtype} on {add_to.device}")
    return add_to


def _check_gated(x: Tensor, w: Tensor, activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"gated matmul: unknown activation {activation!r}; use one of {', '.join(ACTIVATIONS)}")
    if w.dim() != 2 or w.shape[0] % 2:
        raise ValueError(f"gated matmul: expected w [2I, K] (gate rows, then up rows), got {tuple(w.shape)}")


def gated_matmul_triton(x: Tensor, w: Tensor, activation: str) -> Tensor:
    """``act(x @ gate.T) * (x @ up.T)`` in one GEMM (Shazeer 2020, GLU variants): the gated MLP's
    first half with its activation in the epilogue, so ``gate`` and ``up`` never reach memory.

    Args:
        x: [M, K] activations (fp32/bf16/fp16). w: [2I, K], the gate's rows then the up
            projection's (``LayerWeights.gate_up``), x's dtype. activation: a key of
            :data:`ACTIVATIONS`.

    Returns:
        [M, I] in x's dtype: each sum accumulated in fp32 by the GEMM's rule, the activation and
        the product in fp32, rounded once. Row i is bitwise a function of ``x[i]`` and ``w``.

    Raises:
        ValueError: shapes, dtypes, devices or an activation that do not fit.
    """
    _check(x, w)
    _check_gated(x, w, activation)
    M, K = x.shape
    y = torch.empty((M, w.shape[0] // 2), dtype=x.dtype, device=x.device)
    if M == 0 or y.shape[1] == 0:
        return y
    launch(x.contiguous(), w, y, gated_config(tile_config(x.device, x.dtype, w.shape[0], k=K)), activation=activation)
    return y


def gated_matmul_ref(x: Tensor, w: Tensor, activation: str) -> Tensor:
    """The definition of :func:`gated_matmul_triton` in float64 (for tests): same arguments,
    errors and result to rounding."""
    _check(x, w)
    _check_gated(x, w, activation)
    g, u = (x.double() @ w.double().t()).chunk(2, dim=1)
    if ACTIVATIONS[activation] == 1:
        a = g * torch.sigmoid(g)
    elif ACTIVATIONS[activation] == 2:
        a = 0.5 * g * (1.0 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))
    else:
        a = 0.5 * g * (1.0 + torch.erf(g * 0.7071067811865476))
    return (a * u).to(x.dtype)


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
