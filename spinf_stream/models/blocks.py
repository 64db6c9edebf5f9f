"""Building blocks shared by every family: RMSNorm, rotary embedding, batch-invariant linear,
gated MLP, and attention over the packed tree layout.

Batch invariance (a message's numbers do not depend on what else is in the pass) is kept by one
rule: every reduction a row goes through has a shape, and so an order, that depends only on that
row's own message. Linear layers rely on the GEMM computing each row independently of the others
(true of oneDNN/MKL on CPU for M >= 12 rows, measured; we pad to 16), attention is computed per
message, with branches in fixed-size chunks of :data:`BRANCH_CHUNK`. On CUDA the linear layers and
norms run the fixed-tile Triton kernels of ``kernels/`` instead (cuBLAS chooses split-K by shape);
attention there still runs this per-message torch path (``kernels.tree_attention`` is not wired
in yet).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layout import MessageRows, PassLayout

#: Rows below which a GEMM may take a different code path (GEMV) and change a row's bits.
MIN_GEMM_ROWS = 16
#: Branches attended together; a fixed count keeps the attention shapes, and so the reduction
#: order, the same however many of a message's branches share the pass.
BRANCH_CHUNK = 8
#: Content queries attended together (aligned to the message's first content token).
CONTENT_BLOCK = 256


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with rows computed independently of each other.

    Args:
        x: ``[M, in]``. weight: ``[out, in]``. bias: ``[out]`` or ``None``.
    Returns:
        ``[M, out]`` in ``x.dtype``.
    """
    if x.is_cuda:  # cuBLAS picks kernels (and split-K) by M: use the fixed-tile Triton GEMM
        from kernels import matmul

        y = matmul(x.contiguous(), weight)
        return y if bias is None else y + bias
    m = x.shape[0]
    if m < MIN_GEMM_ROWS:
        x = torch.cat([x, x.new_zeros(MIN_GEMM_ROWS - m, x.shape[1])])
        return F.linear(x, weight, bias)[:m]
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """Root-mean-square norm over the last dim (Zhang & Sennrich 2019), computed in fp32.

    ``x * rsqrt(mean(x**2) + eps) * (offset + weight)``; ``offset`` = 1.0 for Gemma's stored
    ``w - 1``. Llama casts back to ``x.dtype`` before scaling, Gemma after; in fp32 both agree.
    Shapes: ``x [..., H]``, ``weight [H]``.
    """
    if x.is_cuda and x.ndim == 2:
        from kernels import rms_norm as rms_norm_kernel

        return rms_norm_kernel(x.contiguous(), weight, eps, offset)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (y * (offset + weight.float())).to(x.dtype)
    return weight * y.to(x.dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float) -> torch.Tensor:
    """Rotary position embedding, "rotate half" convention (RoFormer; as in transformers).

    Args:
        x: ``[T, heads, head_dim]``. positions: ``[T]`` int64 logical positions.
        inv_freq: ``[head_dim // 2]`` fp32. scaling: cos/sin multiplier (1.0 for plain rope).
    """
    freqs = positions[:, None].float() * inv_freq[None, :].to(x.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * scaling).to(x.dtype)[:, None, :]
    sin = (emb.sin() * scaling).to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """``down(act(gate(x)) * up(x))`` (Shazeer 2020, GLU variants); ``gate_up = [gate; up]``
    stacked ``[2 * intermediate, hidden]``. ``activation``: ``silu`` or ``gelu_pytorch_tanh``."""
    gu = linear(x, gate_up)
    gate, up = gu.chunk(2, dim=-1)
    if activation in ("silu", "swish"):
        act = F.silu(gate)
    elif activation in ("gelu_pytorch_tanh", "gelu_tanh"):
        act = F.gelu(gate, approximate="tanh")
    elif activation == "gelu":
        act = F.gelu(gate)
    else:
        raise ValueError(f"unsupported activation {activation!r}")
    return linear(act * up, down)


def _softcap(s: torch.Tensor, cap: float | None) -> torch.Tensor:
    return s if cap is None else torch.tanh(s / cap) * cap


def _window_ok(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[n, S]`` bool: key visible under the sliding window (``k > q - window``)."""
    if window is None:
        return torch.ones(qpos.shape[0], kpos.shape[0], dtype=torch.bool, device=qpos.device)
    return kpos[None, :] > (qpos[:, None] - window)


def _attend_content(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor,
    scale: float, window: int | None, softcap: float | None, groups: int,
) -> torch.Tensor:
    """Causal attention of content queries ``[n, Hq, D]`` over ``keys/values [S, Hkv, D]``."""
    n, hq, d = q.shape
    hkv = keys.shape[1]
    qg = q.view(n, hkv, groups, d)
    s = torch.einsum("nkgd,skd->kgns", qg, keys) * scale
    s = _softcap(s, softcap)
    ok = (kpos[None, :] <= qpos[:, None]) & _window_ok(qpos, kpos, window)
    s = s.masked_fill(~ok.to(s.device), float("-inf"))
    a = torch.softmax(s, dim=-1)
    return torch.einsum("kgns,skd->nkgd", a, values).reshape(n, hq, d)


def _attend_branches(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qpos: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor, kpos: torch.Tensor, mask: torch.Tensor,
    scale: float, window: int | None, softcap: float | None, groups: int,
) -> torch.Tensor:
    """Attention of ``c`` branches padded to width ``w``.

    ``q [c, w, Hq, D]``, own ``k/v [c, w, Hkv, D]``, ``qpos [c, w]``; the message's prefix
    ``keys/values [S, Hkv, D]`` at ``kpos [S]``; ``mask [c, w, w]`` (own-branch visibility).
    One softmax over ``prefix ++ own branch`` per query. Returns ``[c, w, Hq, D]``.
    """
    c, w, hq, d = q.shape
    hkv = keys.shape[1]
    n = c * w
    qg = q.reshape(n, hkv, groups, d)
    sp = torch.einsum("nkgd,skd->kgns", qg, keys) * scale
    so = torch.einsum("cwkgd,cvkd->kgcwv", q.view(c, w, hkv, groups, d), k) * scale
    s = torch.cat([sp, so.reshape(hkv, groups, n, w)], dim=-1)
    s = _softcap(s, softcap)
    ok = torch.cat([_window_ok(qpos.reshape(n), kpos, window).to(mask.device), mask.reshape(n, w)], dim=-1)
    s = s.masked_fill(~ok.to(s.device), float("-inf"))
    a = torch.softmax(s, dim=-1)
    nk = keys.shape[0]
    out = torch.einsum("kgns,skd->nkgd", a[..., :nk], values)
    own = torch.einsum("kgcwv,cvkd->cwkgd", a[..., nk:].reshape(hkv, groups, c, w, w), v)
    return (out + own.reshape(n, hkv, groups, d)).reshape(c, w, hq, d)


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PassLayout,
    prefix: tuple[torch.Tensor, torch.Tensor] | None,
    *, scale: float, window: int | None, softcap: float | None,
) -> torch.Tensor:
    """Attention over a packed pass (see ``DESIGN.md``: positions and mask).

    Content tokens see their message's preamble (cached ``prefix`` keys/values, logical
    positions ``0..P-1``) and their own content causally; branch tokens see the whole prefix and
    their own branch's ancestors. Never another message or branch.

    Args:
        q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]`` (after rotary).
        prefix: preamble keys/values ``[P, Hkv, D]`` each, or ``None``.
        scale: multiplies ``q·k``. window: sliding window (tokens) or ``None``.
        softcap: attention logit soft cap or ``None``.
    Returns:
        ``[T, Hq, D]``.
    """
    out = torch.zeros_like(q)
    groups = q.shape[1] // k.shape[1]
    pos = layout.positions  # CPU: masks are built on CPU, moved once per attention call
    for m in layout.messages:
        _attend_message(q, k, v, pos, m, prefix, scale, window, softcap, groups, out)
    return out


def _attend_message(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, m: MessageRows,
    prefix: tuple[torch.Tensor, torch.Tensor] | None,
    scale: float, window: int | None, softcap: float | None, groups: int, out: torch.Tensor,
) -> None:
    c0, c1 = m.content
    keys, values, kpos = k[c0:c1], v[c0:c1], pos[c0:c1]
    if m.use_preamble and prefix is not None and m.prefix_len:
        keys = torch.cat([prefix[0][: m.prefix_len], keys])
        values = torch.cat([prefix[1][: m.prefix_len], values])
        kpos = torch.cat([torch.arange(m.prefix_len, dtype=kpos.dtype, device=kpos.device), kpos])
    n_pre = keys.shape[0] - (c1 - c0)
    for b0 in range(c0, c1, CONTENT_BLOCK):
        b1 = min(b0 + CONTENT_BLOCK, c1)
        kend = n_pre + (b1 - c0)
        out[b0:b1] = _attend_content(
            q[b0:b1], keys[:kend], values[:kend], pos[b0:b1], kpos[:kend], scale, window, softcap, groups
        )
    nb = m.branch_rows.shape[0]
    for g0 in range(0, nb, BRANCH_CHUNK):
        rows = m.branch_rows[g0 : g0 + BRANCH_CHUNK]
        valid = m.branch_valid[g0 : g0 + BRANCH_CHUNK]
        mask = m.branch_mask[g0 : g0 + BRANCH_CHUNK]
        c = rows.shape[0]
        if c < BRANCH_CHUNK:  # pad with dummy branches: the shape must not depend on c
            pad = BRANCH_CHUNK - c
            w = rows.shape[1]
            rows = torch.cat([rows, rows.new_zeros(pad, w)])
            mask = torch.cat([mask, torch.eye(w, dtype=torch.bool).expand(pad, w, w)])
        flat = rows.reshape(-1)
        w = rows.shape[1]
        o = _attend_branches(
            q[flat].view(BRANCH_CHUNK, w, *q.shape[1:]),
            k[flat].view(BRANCH_CHUNK, w, *k.shape[1:]),
            v[flat].view(BRANCH_CHUNK, w, *v.shape[1:]),
            pos[flat].view(BRANCH_CHUNK, w),
            keys, values, kpos, mask, scale, window, softcap, groups,
        )
        sel = valid.reshape(-1)
        out[rows[:c].reshape(-1)[sel]] = o[:c].reshape(c * w, *q.shape[1:])[sel]
