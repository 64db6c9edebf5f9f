"""The torch back end's building blocks, shared by every family.

Batch-invariant linear, RMSNorm, rotary embedding, gated MLP. (Attention over the packed layout is
:mod:`spinf_stream.models.attention`; the Triton twins of these ops are in ``spinf_stream/kernels/``.)

Batch invariance (a message's numbers do not depend on what else is in the pass) on the CPU
rests on one measured rule of the BLAS (oneDNN/MKL sgemm): a GEMM row's bits are independent of
the other rows and of its place when ``M >= 16`` and ``N >= 12``. Linear layers have ``N`` =
output features (always >= 16 here) and pad ``M`` up to :data:`MIN_GEMM_ROWS`; norms, rotary and
activations compute each row on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

#: Rows below which a GEMM may take a different code path (GEMV) and change a row's bits.
MIN_GEMM_ROWS = 16

Linear = Callable[..., torch.Tensor]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


class Scratch:
    """Named buffers reused across the row chunks and layers of one pass (CPU torch path).

    Why: a row chunk's MLP temporaries are several MB each; glibc maps such a block afresh
    whenever it has trimmed the top of its heap, and every page of it then faults on first touch
    (engine_bench: 300-600k minor faults, 5-8 % of the engine's time, varying run to run).
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous ``shape`` view of the buffer ``name`` (dtype and device of ``like``),
        grown when too small. Its contents are whatever the last user left."""
        n = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._buffers[name] = like.new_empty(max(n, 1))
        return buf[:n].view(shape)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` with rows computed independently of each other (torch back end).

    Args:
        x: ``[M, in]``. weight: ``[out, in]``. bias: ``[out]`` or ``None``.
        out: ``[M, out]`` contiguous buffer to write into, or ``None`` for a fresh one (ignored
            when ``M < MIN_GEMM_ROWS``: the padded product is sliced instead).
    Returns:
        ``[M, out]`` in ``x.dtype`` (``out`` itself when it was used).
    """
    m = x.shape[0]
    if m < MIN_GEMM_ROWS:
        x = torch.cat([x, x.new_zeros(MIN_GEMM_ROWS - m, x.shape[1])])
        return F.linear(x, weight, bias)[:m]
    if out is None:
        return F.linear(x, weight, bias)
    # the same GEMM F.linear runs (mm, or addmm with the bias), written into ``out``
    if bias is None:
        return torch.mm(x, weight.T, out=out)
    return torch.addmm(bias, x, weight.T, out=out)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """Root-mean-square norm over the last dim (Zhang & Sennrich 2019), computed in fp32.

    ``x * rsqrt(mean(x**2) + eps) * (offset + weight)``; ``offset`` = 1.0 for Gemma's stored
    ``w - 1``. Llama casts back to ``x.dtype`` before scaling, Gemma after; in fp32 both agree.
    Shapes: ``x [..., H]``, ``weight [H]``. In fp32, torch's fused ``F.rms_norm`` gives the same
    bits as the formula (checked in tests/test_attention.py), row by row, several times faster.
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        if offset:
            return F.rms_norm(x, (x.shape[-1],), None, eps) * (offset + weight)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (y * (offset + weight.float())).to(x.dtype)
    return weight * y.to(x.dtype)


def rotary_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [T, 1, head_dim]`` in ``dtype`` for the logical ``positions [T]`` (int64);
    ``inv_freq [head_dim // 2]`` fp32. Computed once per pass and rope, shared by the layers.

    ``sin``'s first half is negated (the sign of "rotate half"'s ``-x2``), so that
    :func:`rotary` needs no negation pass; flipping a sign is exact, so the bits are those of
    the usual formula."""
    freqs = positions[:, None].float() * inv_freq[None, :].to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin() * scaling
    sin[:, : freqs.shape[1]].neg_()
    return (emb.cos() * scaling).to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, "rotate half" convention (RoFormer, Su et al. 2021; as in
    transformers): ``x * cos + cat(-x2, x1) * sin``. ``x [T, heads, head_dim]``; ``cos, sin``
    from :func:`rotary_tables` (its ``sin`` carries the minus sign)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return swapped.mul_(sin).add_(x * cos)


def activation(gate: torch.Tensor, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """The MLP's gate activation, elementwise: SiLU (Elfwing et al. 2018) or GELU (Hendrycks &
    Gimpel 2016; tanh approximation or exact).

    Written with ``exp``/``tanh``/``erf`` and exact arithmetic rather than ``F.silu``/``F.gelu``:
    on the CPU those take a vectorised path for most elements and a scalar one for a tail whose
    place depends on the tensor's size, and the two paths differ in the last bit (measured), so a
    row's bits would depend on the rows beside it. ``exp``, ``tanh`` and ``erf`` give the same
    bits on both paths (tests/test_attention.py checks it). Within 5e-7 of the library functions.
    ``out`` (same shape as ``gate``, contiguous): where SiLU writes its result, or ``None``.
    """
    if name in ("silu", "swish"):
        # gate / (1 + exp(-gate)) with one temporary, updated in place (the same ops, so the
        # same bits, with fewer passes over fresh memory)
        e = torch.neg(gate) if out is None else torch.neg(gate, out=out)
        e.exp_().add_(1.0)
        return torch.div(gate, e, out=e)
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        inner = _SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
        return 0.5 * gate * (1.0 + torch.tanh(inner))
    if name == "gelu":
        return 0.5 * gate * (1.0 + torch.erf(gate * _INV_SQRT_2))
    raise ValueError(f"unsupported activation {name!r}")


def gated_mlp(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: str, linear: Linear = linear,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """``down(act(gate(x)) * up(x))`` (Shazeer 2020, GLU variants); ``x [M, hidden]``,
    ``gate_up = [gate; up]`` stacked ``[2 * intermediate, hidden]``, ``down [hidden,
    intermediate]``; ``linear(x, w, out=...)`` is the back end's GEMM. With ``scratch`` the
    ``[M, 2 * intermediate]`` and ``[M, intermediate]`` temporaries are its reused buffers."""
    if scratch is None or not isinstance(gate_up, torch.Tensor):
        gate, up = linear(x, gate_up).chunk(2, dim=-1)
        return linear(activation(gate, act).mul_(up), down)
    m = x.shape[0]
    gate, up = linear(x, gate_up, out=scratch.get("mlp.gate_up", (m, gate_up.shape[0]), x)).chunk(2, dim=-1)
    return linear(activation(gate, act, out=scratch.get("mlp.act", tuple(gate.shape), x)).mul_(up), down)
