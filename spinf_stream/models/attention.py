"""Attention over a packed pass, on the CPU with torch (the CUDA/Triton path is
:mod:`kernels.tree_attention`; both read the plan that :func:`spinf_stream.layout.build_pass`
makes).

Every query attends to exactly its ancestors (DESIGN.md "Mask"): a content token to its
message's preamble and its own content up to itself; a branch token to the preamble, the whole
content and its own branch's ancestors. Never another message or branch.

Batch invariance on the CPU — the rule, measured on this kind of machine (oneDNN/MKL sgemm, and
checked by ``tests/test_attention.py`` for every family's shape): *a GEMM row's bits are
independent of the other rows and of the row's place when M >= 16 and N >= 12*; below that (GEMV
paths, small-N kernels) they are not (N in {1, 5, 6, 7, 9, 10, 11} fails). So every GEMM here has
M >= 16 (queries padded up) and N a multiple of 16 (keys padded, masked), and every shape is a
property of the message alone:

- content queries, in blocks of :data:`CONTENT_BLOCK` aligned to the message's first content
  token, against the message's keys ``[preamble | content]`` up to the block's end;
- all the message's branch rows in this pass at once against ``[preamble | content]`` (rows are
  independent, so it does not matter which of its branches share the pass); their own-branch
  keys as one small ``[W, W]`` block per branch, ``W`` = the message's longest branch rounded up
  to 16 (a batched GEMM whose items are independent of their batch);
- one softmax per query over ``[preamble | content | own branch]`` of a width fixed by the
  message; softmax and elementwise ops reduce each row on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..layout import MessagePlan, PassLayout
from .blocks import Scratch

#: Content queries attended together, aligned to the message's first content token: smaller
#: blocks compute less of the masked upper triangle (128: +3-5 % engine_bench over 256; 64 no better).
CONTENT_BLOCK = 128
#: Keys are padded to a multiple of this: GEMM N >= 16 (see the module docstring).
KEY_MULTIPLE = 16
#: Fewest GEMM rows: smaller M takes other BLAS code paths whose bits depend on M.
MIN_ROWS = 16

#: Per layer: the preamble's or a carried content's ``(keys, values)``, each ``[n, Hkv, D]``.
KV = tuple[torch.Tensor, torch.Tensor]


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [B, M, K]`` with M padded to :data:`MIN_ROWS` by zero rows (a fresh buffer)."""
    if x.shape[1] >= MIN_ROWS:
        return x
    out = x.new_zeros(x.shape[0], MIN_ROWS, x.shape[2])
    out[:, : x.shape[1]] = x
    return out


def _per_head_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a [H, M, K] @ b [H, K, N] -> [H, M, N]`` as H separate GEMMs (``b`` may be a transposed
    view). Why not ``torch.bmm``: for the few heads of a KV group it runs at about half the speed
    of one GEMM per head on this CPU (measured: ``[3, 1791, 64] x [3, 64, 656]`` 4.8 ms against
    2.4 ms; ``[3, 1791, 656] x [3, 656, 64]`` 3.5 against 2.6). Each head is its own GEMM, so the
    row rule of the module docstring holds per head."""
    if out is None:
        out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for h in range(a.shape[0]):
        torch.mm(a[h], b[h], out=out[h])
    return out


def _softcap(s: torch.Tensor, cap: float | None) -> torch.Tensor:
    return s if cap is None else torch.tanh(s / cap) * cap


@dataclass
class _MessageMasks:
    """Host-side masks of one message, built once per pass (no window), shared by every layer."""

    content_blocks: list[tuple[int, int, int, torch.Tensor]] = field(default_factory=list)  # (i0, i1, N, hidden [n, N])
    branch_qpos: torch.Tensor | None = None  # [Nb] logical positions of the branch rows
    slot_pos: torch.Tensor | None = None  # [Nb, W] logical positions of the own-branch slots


class TorchAttention:
    """The attention of one pass on the CPU; call it once per layer.

    Args:
        layout: the pass (its positions and per-message plans).
        device: where q/k/v live (masks are moved there once).
    """

    def __init__(self, layout: PassLayout, device: torch.device | str = "cpu") -> None:
        self.layout = layout
        self.device = torch.device(device)
        pos = layout.positions
        self.masks: list[_MessageMasks] = []
        for m in layout.messages:
            mm = _MessageMasks()
            P, L = m.prefix_len, m.content_len
            if m.content_start is not None:
                for i0 in range(0, L, CONTENT_BLOCK):
                    i1 = min(i0 + CONTENT_BLOCK, L)
                    N = _round_up(P + i1, KEY_MULTIPLE)
                    qp = torch.arange(P + i0, P + i1)
                    hidden = torch.arange(N)[None, :] > qp[:, None]  # causal: later keys and padding
                    mm.content_blocks.append((i0, i1, N, hidden.to(self.device)))
            if m.branches:
                mm.branch_qpos = pos[m.branch_rows].to(self.device)
                slots = pos[m.slot_rows.reshape(-1)].view(m.slot_rows.shape)  # [nbr, W]
                owner = torch.repeat_interleave(
                    torch.arange(len(m.branches)), torch.tensor([len(b.parents) for b in m.branches])
                )
                mm.slot_pos = slots[owner].to(self.device)
            self.masks.append(mm)
        self._moved: dict[int, tuple[torch.Tensor, ...]] = {}
        # a message's score matrices (~10 MB) live in one buffer reused by every message and
        # layer of the pass: fresh ones page-fault (see blocks.Scratch)
        self._scratch = Scratch()

    def _index(self, i: int, m: MessagePlan) -> tuple[torch.Tensor, ...]:
        """The message's index tensors on the device (moved once per pass)."""
        if i not in self._moved:
            self._moved[i] = tuple(
                t.to(self.device) for t in (m.branch_rows, m.slot_rows, m.slot_index, m.ancestors)
            )
        return self._moved[i]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
        *, scale: float, window: int | None, softcap: float | None,
    ) -> torch.Tensor:
        """Attention of one layer.

        Args:
            q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]`` for the pass's rows, rotary applied.
            prefix: the preamble's keys/values ``[P, Hkv, D]`` of this layer, or ``None``.
            carried: this layer's keys/values of the pass's carried contents, in order.
            scale: multiplies ``q·k``. window: sliding window (keys at positions
                ``> q_pos - window`` are visible) or ``None``. softcap: ``cap * tanh(s / cap)``.
        Returns:
            ``[T, Hq, D]`` in ``q.dtype``; computed in fp32. In fp32 it is a buffer of this
            object, overwritten by the next call: read it before attending the next layer.
        """
        if q.dtype != torch.float32:  # softmax and its sums in fp32, as transformers does
            f32 = lambda kv: (kv[0].float(), kv[1].float())  # noqa: E731
            o = self(q.float(), k.float(), v.float(), f32(prefix) if prefix else None, [f32(c) for c in carried],
                     scale=scale, window=window, softcap=softcap)
            return o.to(q.dtype)
        # The scale goes on the queries once, not on every score matrix (one pass fewer over
        # them). The scaled queries and the output are per-pass buffers reused by every layer.
        q = torch.mul(q, scale, out=self._scratch.get("q", tuple(q.shape), q))
        out = self._scratch.get("out", tuple(q.shape), q)
        for i, m in enumerate(self.layout.messages):
            keys, values = self._keys(m, k, v, prefix, carried)
            if m.content_start is not None:
                self._content(i, m, q, keys, values, out, window, softcap)
            if m.branches:
                self._branches(i, m, q, k, v, keys, values, out, window, softcap)
        return out

    def _keys(
        self, m: MessagePlan, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The message's ``[preamble | content]`` keys and values as fresh ``[Hkv, S_pad, D]``
        buffers, zero-padded to a multiple of :data:`KEY_MULTIPLE` (index = logical position)."""
        P, L = m.prefix_len, m.content_len
        hkv, d = k.shape[1], k.shape[2]
        s_pad = _round_up(max(P + L, 1), KEY_MULTIPLE)
        keys = k.new_zeros(hkv, s_pad, d)
        values = v.new_zeros(hkv, s_pad, d)
        if P:
            assert prefix is not None, "a message attends to a preamble that was not passed"
            keys[:, :P] = prefix[0][:P].transpose(0, 1)
            values[:, :P] = prefix[1][:P].transpose(0, 1)
        if L:
            if m.content_start is not None:
                ck, cv = k[m.content_start : m.content_start + L], v[m.content_start : m.content_start + L]
            else:
                assert m.carried is not None
                ck, cv = carried[m.carried]
            keys[:, P : P + L] = ck.transpose(0, 1)
            values[:, P : P + L] = cv.transpose(0, 1)
        return keys, values

    def _content(
        self, i: int, m: MessagePlan, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
        out: torch.Tensor, window: int | None, softcap: float | None,
    ) -> None:
        hkv, d = keys.shape[0], keys.shape[2]
        hq = q.shape[1]
        g = hq // hkv
        c0 = m.content_start
        assert c0 is not None
        for i0, i1, n_keys, hidden in self.masks[i].content_blocks:
            n = i1 - i0
            qb = q[c0 + i0 : c0 + i1].view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
            qb = _pad_rows(qb)
            scores = self._scratch.get("scores", (hkv, qb.shape[1], n_keys), q)  # [Hkv, >=G*n, N]
            _per_head_mm(qb, keys[:, :n_keys].transpose(1, 2), out=scores)
            s = scores[:, : g * n].view(hkv, g, n, n_keys)
            if window is not None:
                qp = torch.arange(m.prefix_len + i0, m.prefix_len + i1, device=hidden.device)
                hidden = hidden | (torch.arange(n_keys, device=hidden.device)[None, :] <= qp[:, None] - window)
            _scores_to_weights(s, softcap, hidden)
            total = s.sum(dim=-1, keepdim=True)
            o = _per_head_mm(scores, values[:, :n_keys])[:, : g * n].view(hkv, g, n, d) / total
            out[c0 + i0 : c0 + i1] = o.permute(2, 0, 1, 3).reshape(n, hq, d)

    def _branches(
        self, i: int, m: MessagePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        keys: torch.Tensor, values: torch.Tensor, out: torch.Tensor,
        window: int | None, softcap: float | None,
    ) -> None:
        hkv, s_pad, d = keys.shape
        hq = q.shape[1]
        g = hq // hkv
        rows, slot_rows, slot_index, ancestors = self._index(i, m)
        masks = self.masks[i]
        nb = rows.shape[0]
        nbr, w = slot_rows.shape
        # [preamble | content]: every branch row of the message at once.
        qb = q[rows].view(nb, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * nb, d)
        qb = _pad_rows(qb)
        ctx = self._scratch.get("scores", (hkv, qb.shape[1], s_pad), q)  # [Hkv, >=G*Nb, S_pad]
        _per_head_mm(qb, keys.transpose(1, 2), out=ctx)
        s_ctx = ctx[:, : g * nb].view(hkv, g, nb, s_pad)
        # Own branch: one [W, W] block per branch (queries and keys in branch slots).
        flat = slot_rows.reshape(-1)
        qs = q[flat].view(nbr, w, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(nbr * hkv, g * w, d)
        ks = k[flat].view(nbr, w, hkv, d).permute(0, 2, 3, 1).reshape(nbr * hkv, d, w)
        s_own = torch.bmm(qs, ks).view(nbr, hkv, g, w, w).permute(1, 2, 0, 3, 4).reshape(hkv, g, nbr * w, w)
        s_own = s_own[:, :, slot_index]  # [Hkv, G, Nb, W]
        hide_ctx: torch.Tensor | None = None  # None: only the key padding is hidden
        hide_own = ~ancestors
        if window is not None:
            qp = masks.branch_qpos
            key_pos = torch.arange(s_pad, device=qp.device)[None, :]
            hide_ctx = (key_pos >= m.n_keys) | (key_pos <= qp[:, None] - window)  # padding or out of the window
            hide_own = hide_own | (masks.slot_pos <= qp[:, None] - window)
        # One softmax over [preamble | content | own branch], in two parts that share the max.
        for part, hide in ((s_ctx, hide_ctx), (s_own, hide_own)):
            if softcap is not None:
                part.copy_(_softcap(part, softcap))
            if hide is None:
                part[..., m.n_keys :] = float("-inf")  # the padding columns only: no [rows, keys] mask pass
            else:
                part.masked_fill_(hide, float("-inf"))
        top = torch.maximum(s_ctx.amax(dim=-1, keepdim=True), s_own.amax(dim=-1, keepdim=True))
        total = None
        for part in (s_ctx, s_own):
            part.sub_(top).exp_()
            total = part.sum(dim=-1, keepdim=True) if total is None else total + part.sum(dim=-1, keepdim=True)
        o = _per_head_mm(ctx, values)[:, : g * nb].view(hkv, g, nb, d)
        p_slots = s_own.new_zeros(hkv, g, nbr * w, w)
        p_slots[:, :, slot_index] = s_own
        p_slots = p_slots.view(hkv, g, nbr, w, w).permute(2, 0, 1, 3, 4).reshape(nbr * hkv, g * w, w)
        vs = v[flat].view(nbr, w, hkv, d).permute(0, 2, 1, 3).reshape(nbr * hkv, w, d)
        o_own = torch.bmm(p_slots, vs).view(nbr, hkv, g, w, d).permute(1, 2, 0, 3, 4).reshape(hkv, g, nbr * w, d)
        o = (o + o_own[:, :, slot_index]) / total
        out[rows] = o.permute(2, 0, 1, 3).reshape(nb, hq, d)


def _scores_to_weights(s: torch.Tensor, softcap: float | None, hidden: torch.Tensor) -> None:
    """In place: ``s`` (``q·k`` with the scale already on ``q``) becomes the unnormalised softmax
    weights ``exp(s - max)`` with hidden keys at 0 (each row on its own)."""
    if softcap is not None:
        s.copy_(_softcap(s, softcap))
    s.masked_fill_(hidden, float("-inf"))
    s.sub_(s.amax(dim=-1, keepdim=True)).exp_()
