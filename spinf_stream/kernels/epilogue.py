"""What a GEMM does to its fp32 accumulator before the one store: scales, then the gated MLP's
activation; and the store, which may add the tile to what ``Y`` holds (the residual stream, a
round trip saved). Shared by the tiled and the persistent kernel, so both write the same
function of their accumulators.

Every step is elementwise on one output element (its row's scale, its column's scale, its own
gate and up sums), so a row's bits stay a function of that row alone.
"""

from __future__ import annotations

from ._triton import jit, tl

__all__ = ["ACTIVATIONS", "scale_and_activate", "store_tile"]

#: The gated MLP's activations by the checkpoints' names (``hidden_act``/``hidden_activation``):
#: SiLU (Elfwing et al. 2018), GELU with the tanh approximation and exact GELU (Hendrycks & Gimpel 2016).
ACTIVATIONS = {"silu": 1, "swish": 1, "gelu_pytorch_tanh": 2, "gelu_tanh": 2, "gelu": 3}


@jit()
def scale_and_activate(acc, up, XS, WS, offs_m, offs_n, m_ok, n_ok, UP_OFFSET,
                       ROW_SCALES: tl.constexpr, COL_SCALES: tl.constexpr, ACTIVATION: tl.constexpr):
    """``acc`` (and ``up``) ``[BLOCK_M, BLOCK_N]`` fp32 → the tile to store: times ``XS[m]`` and
    ``WS[n]`` (``WS[UP_OFFSET + n]`` for ``up``), then ``act(acc) * up`` when ``ACTIVATION``."""
    if ROW_SCALES:
        xs = tl.load(XS + offs_m, mask=m_ok, other=0.0)[:, None]
        acc = acc * xs
        if ACTIVATION != 0:  # a plain GEMM's up tile is an unused zero: no work on it
            up = up * xs
    if COL_SCALES:
        acc = acc * tl.load(WS + offs_n, mask=n_ok, other=0.0)[None, :]
        if ACTIVATION != 0:
            up = up * tl.load(WS + UP_OFFSET + offs_n, mask=n_ok, other=0.0)[None, :]
    if ACTIVATION == 1:  # SiLU: g * sigmoid(g)
        acc = acc / (1.0 + tl.exp(-acc)) * up
    elif ACTIVATION == 2:  # GELU, tanh form: 0.5 g (1 + tanh(u)) = g * sigmoid(2u)
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc / (1.0 + tl.exp(-2.0 * u)) * up
    elif ACTIVATION == 3:  # GELU: 0.5 g (1 + erf(g / sqrt 2))
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476)) * up
    return acc


@jit()
def store_tile(Y, y, offs_m, offs_n, m_ok, n_ok, stride_ym, stride_yn, RESIDUAL: tl.constexpr):
    """Store the fp32 tile ``y`` into ``Y`` (rounded once); with ``RESIDUAL``, ``Y + y``: the
    residual's element read, the sum in fp32, rounded once — each element by the one program
    that owns its tile, so in place is safe."""
    ptrs = Y + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :] * stride_yn
    mask = m_ok[:, None] & n_ok[None, :]
    if RESIDUAL:
        y = y + tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, y.to(Y.dtype.element_ty), mask=mask)
