"""Attention over a packed pass on the CPU (torch).

The CUDA/Triton path is :mod:`spinf_stream.kernels.tree_attention`; both read the plan that
:func:`spinf_stream.engine.layout.build_pass` makes.

Every query attends to exactly its ancestors (DESIGN.md "Mask"): a content token to its
message's preamble and its own content up to itself (a picture's soft token: and the rest of its
picture); a branch token to the preamble, the whole content and its own branch's ancestors.
Never another message or branch.

Batch invariance: every op runs single-threaded on one of the back end's workers
(:class:`~spinf_stream.models.workers.ComputePool`), on units whose every shape is a property of
the message alone or a fixed constant, never of the pass:

- content queries, in blocks of :data:`CONTENT_BLOCK` aligned to the message's first content
  token, against the message's keys ``[preamble | content]`` up to the block's end (padded to a
  multiple of :data:`KEY_MULTIPLE`, masked);
- branch rows, in chunks of :data:`BRANCH_ROWS` (the last padded with zero queries),
  against ``[preamble | content]``, and each row against the slots of its own branch
  (``W`` = the message's longest branch rounded up to :data:`~spinf_stream.engine.layout.SLOT_MULTIPLE`),
  one softmax over both parts. Which branches share a chunk depends on the pass; a row's bits do
  not, by the BLAS property the bits probe checks (:mod:`spinf_stream.models.numerics`): a GEMM
  row's bits do not depend on the other rows of a fixed-shape GEMM nor on the row's place. A
  decode step's row is a unit of its own: torch's fused attention against its message's keys
  (every shape and input the message's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch
import torch.nn.functional as F

from spinf_stream.engine.layout import MessagePlan, PassLayout
from .blocks import Scratch

#: Content queries attended together, aligned to the message's first content token: smaller
#: blocks compute less of the masked upper triangle (128: +3-5 % engine_bench over 256; 64 no better).
CONTENT_BLOCK = 128
#: Branch rows of one message attended together (the last chunk padded).
BRANCH_ROWS = 32
#: Keys are padded to a multiple of this (every row of a score matrix is a whole number of
#: 16-float vectors: no scalar tail in the elementwise ops).
KEY_MULTIPLE = 16
#: Fewest GEMM rows: smaller M takes other BLAS code paths (GEMV).
MIN_ROWS = 16

#: Per layer: the preamble's or a carried content's ``(keys, values)``, each ``[n, Hkv, D]``.
KV = tuple[torch.Tensor, torch.Tensor]


class DecodeContext:
    """One message's ``[preamble | content]`` keys and values laid out for its decode rows: per
    layer two ``[Hkv, S, D]`` buffers, ``S`` = the context plus ``room`` rounded up
    to :data:`KEY_MULTIPLE`. Built by the first decode step that reads a layer and kept for the
    message's later steps and its other extraction questions, so a step copies only its own
    branch's keys (the question's tokens and those written), never the preamble and content.
    A step writes its branch after the context and reads the keys up to its own: the rows of
    one context run one after the other (one attention unit per message).

    Args:
        room: keys a branch may add after the context (its question, the tokens it may write
            and its own row); a step that needs more grows the buffers.
    """

    def __init__(self, room: int = 0) -> None:
        self.room = room
        self.layers: dict[int, KV] = {}

    def buffers(self, layer: int, prefix: KV | None, prefix_len: int, content: KV, n_keys: int) -> KV:
        """This layer's ``(keys, values)`` ``[Hkv, S, D]`` with ``S >= n_keys``: the preamble's
        ``prefix_len`` keys, then ``content``'s ``[L, Hkv, D]``, then room for a branch."""
        got = self.layers.get(layer)
        if got is not None and got[0].shape[1] >= n_keys:
            return got
        ck, cv = content
        s = _round_up(max(prefix_len + ck.shape[0] + self.room, n_keys, 1), KEY_MULTIPLE)
        keys = ck.new_empty(ck.shape[1], s, ck.shape[2])
        values = cv.new_empty(cv.shape[1], s, cv.shape[2])
        _put(keys, values, 0, [*_preamble(prefix, prefix_len), content])
        self.layers[layer] = (keys, values)
        return keys, values


@dataclass(frozen=True)
class DecodeCarry:
    """A decode row's carried keys/values of one layer: its message's ``content`` and its
    branch so far (``branch``: the question's tokens and the tokens written before the newest),
    each ``([n, Hkv, D], [n, Hkv, D])``, with the message's :class:`DecodeContext`."""

    content: KV
    branch: KV
    context: DecodeContext
    layer: int


def carried_pieces(c: KV | Sequence[KV] | DecodeCarry) -> Sequence[KV]:
    """A carried content of one layer as consecutive pieces: ``(keys, values)``, or a sequence of
    them to be read one after the other (a decode step's content, question and written tokens)."""
    if isinstance(c, DecodeCarry):
        return (c.content, c.branch)
    return (c,) if isinstance(c[0], torch.Tensor) else c  # type: ignore[return-value]


def _preamble(prefix: KV | None, prefix_len: int) -> list[KV]:
    """The preamble's first ``prefix_len`` keys/values as a piece (none when ``prefix_len`` is 0)."""
    if not prefix_len:
        return []
    assert prefix is not None, "a message attends to a preamble that was not passed"
    return [(prefix[0][:prefix_len], prefix[1][:prefix_len])]


def _put(keys: torch.Tensor, values: torch.Tensor, at: int, pieces: Sequence[KV]) -> int:
    """Write ``pieces`` (each ``([n, Hkv, D], [n, Hkv, D])``) one after the other into
    ``keys, values [Hkv, S, D]`` from index ``at``; returns the index after the last."""
    for pk, pv in pieces:
        keys[:, at : at + pk.shape[0]] = pk.transpose(0, 1)
        values[:, at : at + pv.shape[0]] = pv.transpose(0, 1)
        at += pk.shape[0]
    return at


def _as_carry(c: KV | Sequence[KV] | DecodeCarry) -> DecodeCarry:
    """A decode row's carried pieces as a :class:`DecodeCarry` (plain pieces: the first is the
    content, the rest its branch, with a context of their own)."""
    if isinstance(c, DecodeCarry):
        return c
    pieces = carried_pieces(c)
    content, rest = pieces[0], pieces[1:]
    if rest:
        branch = (torch.cat([p[0] for p in rest]), torch.cat([p[1] for p in rest]))
    else:
        branch = (content[0][:0], content[1][:0])
    return DecodeCarry(content, branch, DecodeContext(), 0)

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Runs independent units of work (:class:`~spinf_stream.models.workers.ComputePool`)."""

    def map(self, fn: Callable[[T, Scratch], R], items: Sequence[T]) -> list[R]: ...


class _Inline:
    """Units run one after the other on the calling thread, with its torch thread setting."""

    def __init__(self) -> None:
        self.scratch = Scratch()

    def map(self, fn: Callable[[T, Scratch], R], items: Sequence[T]) -> list[R]:
        return [fn(it, self.scratch) for it in items]


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
    2.4 ms)."""
    if out is None:
        out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for h in range(a.shape[0]):
        torch.mm(a[h], b[h], out=out[h])
    return out


def _softcap(s: torch.Tensor, cap: float | None) -> torch.Tensor:
    return s if cap is None else torch.tanh(s / cap) * cap


@dataclass
class _BranchChunk:
    """:data:`BRANCH_ROWS` consecutive branch rows of one message: pass rows ``[start, start + n)``
    (a chunk is padded past ``n`` with zero queries, whose results are dropped).

    Own-branch keys are read through a window of ``W`` rows ending at each row: window slot
    ``p`` of row ``i`` is pass row ``i - W + 1 + p``. A key's slot is fixed by its distance to the
    row within their branch, so the order in which a row's own-branch terms are summed is a
    property of the branch alone. ``hide_own [BR, W]``: slots that are not the row's ancestors
    (or itself); ``qpos [BR]``, ``own_pos [BR, W]``: logical positions (for sliding windows)."""

    start: int
    n: int
    hide_own: torch.Tensor
    qpos: torch.Tensor
    own_pos: torch.Tensor


@dataclass
class _MessageUnits:
    """Host-side plan of one message, built once per pass and shared by every layer."""

    content_blocks: list[tuple[int, int, int, torch.Tensor]] = field(default_factory=list)  # (i0, i1, N, hidden [n, n])
    branch_chunks: list[_BranchChunk] = field(default_factory=list)


def _branch_chunks(m: MessagePlan, pos: torch.Tensor, device: torch.device) -> list[_BranchChunk]:
    """The message's branch rows (consecutive in the pass) cut into chunks of :data:`BRANCH_ROWS`."""
    if not m.branches:
        return []
    w = m.width_slots
    first = m.branches[0].start
    nb = sum(len(b.parents) for b in m.branches)
    last = m.branches[-1]
    assert last.start + len(last.parents) - first == nb, "a message's branch rows are consecutive in its pass"
    hide = torch.ones(nb, w, dtype=torch.bool)
    for b in m.branches:
        ancestors: list[list[int]] = []  # per branch row: its own ancestors (branch-local), itself first
        for i, par in enumerate(b.parents):
            ancestors.append([i, *(ancestors[par] if par >= 0 else [])])
            row = b.start - first + i
            for a in ancestors[i]:
                hide[row, w - 1 - (i - a)] = False
    n_pass = pos.shape[0]
    chunks = []
    br = BRANCH_ROWS
    for c0 in range(0, nb, br):
        n = min(br, nb - c0)
        start = first + c0
        rows = torch.arange(start, start + br)
        h = torch.ones(br, w, dtype=torch.bool)
        h[:n] = hide[c0 : c0 + n]
        h[n:, w - 1] = False  # a padding row sees itself (no row of all -inf)
        key_rows = rows[:, None] - (w - 1) + torch.arange(w)[None, :]
        own_pos = pos[key_rows.clamp(0, n_pass - 1)]
        chunks.append(_BranchChunk(
            start=start, n=n, hide_own=h.to(device), qpos=pos[rows.clamp(max=n_pass - 1)].to(device),
            own_pos=own_pos.to(device),
        ))
    return chunks


class TorchAttention:
    """The attention of one pass on the CPU; call it once per layer.

    Args:
        layout: the pass (its positions and per-message plans).
        device: where q/k/v live (masks are moved there once).
        executor: runs the units (the back end's :class:`~spinf_stream.models.workers.ComputePool`);
            default: one after the other on the calling thread.
    """

    def __init__(self, layout: PassLayout, device: torch.device | str = "cpu", executor: Executor | None = None) -> None:
        self.layout = layout
        self.device = torch.device(device)
        self.executor: Executor = executor or _Inline()
        pos = layout.positions
        self.units: list[_MessageUnits] = []
        self.work: list[tuple[int, int, int]] = []  # (message, 0 = content block / 1 = branch chunk, index)
        self.decode_rows: list[int] = []  # messages that are a decode step's row
        for i, m in enumerate(layout.messages):
            mu = _MessageUnits()
            P, L = m.prefix_len, m.content_len
            if m.content_start is not None:
                for i0 in range(0, L, CONTENT_BLOCK):
                    i1 = min(i0 + CONTENT_BLOCK, L)
                    # a picture's rows see its whole run (bidirectional): keys up to its end
                    pictures = [(P + a, P + a + n) for a, n in m.images if a < i1 and a + n > i0]
                    N = _round_up(max([P + i1] + [b for _, b in pictures]), KEY_MULTIPLE)
                    qp = torch.arange(P + i0, P + i1)
                    kp = torch.arange(P + i0, N)
                    # keys before the block are all visible: only [P + i0, N) needs a mask
                    hidden = kp[None, :] > qp[:, None]  # causal: later keys and padding
                    for a, b in pictures:
                        hidden &= ~(((qp >= a) & (qp < b))[:, None] & ((kp >= a) & (kp < b))[None, :])
                    mu.content_blocks.append((i0, i1, N, hidden.to(self.device)))
            if m.decode:  # one row, its keys and its softmax; a message's rows in one unit
                self.decode_rows.append(i)
                self.units.append(mu)
                continue
            mu.branch_chunks = _branch_chunks(m, pos, self.device)
            self.work.extend((i, 0, j) for j in range(len(mu.content_blocks)))
            self.work.extend((i, 1, j) for j in range(len(mu.branch_chunks)))
            self.units.append(mu)
        # the largest units first, so that the workers finish together
        self.work.sort(key=lambda w: -self._cost(w))
        self._out: torch.Tensor | None = None
        self._visible_masks: dict[tuple[int, int | None], torch.Tensor] = {}

    def _cost(self, w: tuple[int, int, int]) -> int:
        i, kind, j = w
        m = self.layout.messages[i]
        if kind == 0:
            i0, i1, n_keys, _ = self.units[i].content_blocks[j]
            return (i1 - i0) * n_keys
        return BRANCH_ROWS * (m.n_keys + m.width_slots)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
        *, scale: float, window: int | None, softcap: float | None,
    ) -> torch.Tensor:
        """Attention of one layer.

        Args:
            q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]`` for the pass's rows (and any padding rows
                after them), rotary applied.
            prefix: the preamble's keys/values ``[P, Hkv, D]`` of this layer, or ``None``.
            carried: this layer's keys/values of the pass's carried contents, in order.
            scale: multiplies ``q·k``. window: sliding window (keys at positions
                ``> q_pos - window`` are visible) or ``None``. softcap: ``cap * tanh(s / cap)``.
        Returns:
            ``[T, Hq, D]`` in ``q.dtype``, computed in fp32; rows that are no message's are 0. In
            fp32 it is a buffer of this object, overwritten by the next call.
        """
        if q.dtype != torch.float32:  # softmax and its sums in fp32, as transformers does
            f32 = lambda kv: (kv[0].float(), kv[1].float())  # noqa: E731
            joined = [DecodeCarry(f32(c.content), f32(c.branch), c.context, c.layer) if isinstance(c, DecodeCarry)
                      else tuple(f32(p) for p in carried_pieces(c)) for c in carried]
            o = self(q.float(), k.float(), v.float(), f32(prefix) if prefix else None, joined,
                     scale=scale, window=window, softcap=softcap)
            return o.to(q.dtype)
        if self._out is None or self._out.shape != q.shape:
            self._out = q.new_zeros(q.shape)
        out = self._out
        msgs = self.layout.messages
        if self.decode_rows:
            carries = {i: _as_carry(carried[msgs[i].carried]) for i in self.decode_rows}  # type: ignore[index]
            groups: dict[int, list[int]] = {}
            for i in self.decode_rows:
                groups.setdefault(id(carries[i].context), []).append(i)
            units = sorted(groups.values(), key=lambda g: -sum(msgs[i].n_keys for i in g))  # largest first

            def rows(group: list[int], _: Scratch) -> None:
                for i in group:
                    self._decode(msgs[i], q, k, v, prefix, carries[i], out, scale, window, softcap)

            self.executor.map(rows, units)
            return out
        kv = self.executor.map(lambda i, _: self._keys(msgs[i], k, v, prefix, carried), range(len(msgs)))

        def unit(w: tuple[int, int, int], scratch: Scratch) -> None:
            i, kind, j = w
            keys, values = kv[i]
            if kind == 0:
                self._content(msgs[i], self.units[i].content_blocks[j], q, keys, values, out, scale, window, softcap, scratch)
            else:
                self._branches(msgs[i], self.units[i].branch_chunks[j], q, k, v, keys, values, out, scale, window,
                               softcap, scratch)

        self.executor.map(unit, self.work)
        return out

    def _keys(
        self, m: MessagePlan, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The message's ``[preamble | content]`` keys and values as fresh ``[Hkv, S_pad, D]``
        buffers, zero-padded to a multiple of :data:`KEY_MULTIPLE` (index = logical position)."""
        P, L = m.prefix_len, m.content_len
        hkv, d = k.shape[1], k.shape[2]
        s_pad = _round_up(max(P + L, 1), KEY_MULTIPLE)
        keys = k.new_empty(hkv, s_pad, d)
        values = v.new_empty(hkv, s_pad, d)
        keys[:, P + L :] = 0.0  # the padding (every other key is written below)
        values[:, P + L :] = 0.0
        pieces = _preamble(prefix, P)
        if L:
            if m.content_start is not None:
                pieces.append((k[m.content_start : m.content_start + L], v[m.content_start : m.content_start + L]))
            else:
                assert m.carried is not None
                pieces.extend(carried_pieces(carried[m.carried]))
        at = _put(keys, values, 0, pieces)
        assert at == P + L, "a carried content's keys/values have its length"
        return keys, values

    def _decode(
        self, m: MessagePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None,
        carry: DecodeCarry, out: torch.Tensor, scale: float, window: int | None, softcap: float | None,
    ) -> None:
        """A decode step's row: against its carried ``[preamble | content | question | written]``
        keys and its own key (those in its sliding window), one softmax, no mask: every shape is
        the message's. The keys are read from its :class:`DecodeContext`, its branch written
        after the context. torch's fused attention without a soft cap, else two batched products."""
        r = m.branches[0].start
        n = m.n_keys + 1  # the row's own key is the last visible one, at its logical position
        base = m.prefix_len + carry.content[0].shape[0]
        h = carry.branch[0].shape[0]
        assert base + h + 1 == n, "a decode row's carried keys are its content and its branch"
        keys, values = carry.context.buffers(carry.layer, prefix, m.prefix_len, carry.content, n)
        _put(keys, values, base, (carry.branch, (k[r : r + 1], v[r : r + 1])))
        lo = 0 if window is None else max(0, n - window)  # visible: keys at positions > (n - 1) - window
        keys, values = keys[:, lo:n], values[:, lo:n]
        if softcap is None:
            out[r] = F.scaled_dot_product_attention(q[r][None, :, None, :], keys[None], values[None], scale=scale,
                                                    enable_gqa=True)[0, :, 0]
            return
        hkv, d = keys.shape[0], keys.shape[2]
        g = q.shape[1] // hkv
        s = _softcap(torch.bmm(q[r].view(hkv, g, d) * scale, keys.transpose(1, 2)), softcap)  # [Hkv, G, N]
        s = (s - s.amax(dim=-1, keepdim=True)).exp()
        out[r] = (torch.bmm(s, values) / s.sum(dim=-1, keepdim=True)).reshape(-1, d)

    def _content(
        self, m: MessagePlan, block: tuple[int, int, int, torch.Tensor], q: torch.Tensor, keys: torch.Tensor,
        values: torch.Tensor, out: torch.Tensor, scale: float, window: int | None, softcap: float | None,
        scratch: Scratch,
    ) -> None:
        """One block of the message's content queries against its keys up to the block's end."""
        i0, i1, n_keys, hidden = block
        hkv, d = keys.shape[0], keys.shape[2]
        hq = q.shape[1]
        g = hq // hkv
        c0 = m.content_start
        assert c0 is not None
        n = i1 - i0
        k0 = m.prefix_len + i0
        if softcap is None:
            # torch's fused attention (single-threaded here): a block's shapes and mask are the
            # message's alone, so its bits are too
            visible = self._visible(block, k0, window)
            qb = q[c0 + i0 : c0 + i1].transpose(0, 1).contiguous()[None]  # [1, Hq, n, D]
            o = F.scaled_dot_product_attention(
                qb, keys[None, :, :n_keys], values[None, :, :n_keys], attn_mask=visible, scale=scale, enable_gqa=True,
            )
            out[c0 + i0 : c0 + i1] = o[0].transpose(0, 1)
            return
        qb = q[c0 + i0 : c0 + i1].view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
        qb = _pad_rows(qb * scale)
        scores = scratch.get("attn.scores", (hkv, qb.shape[1], n_keys), q)  # [Hkv, >=G*n, N]
        _per_head_mm(qb, keys[:, :n_keys].transpose(1, 2), out=scores)
        s = scores[:, : g * n].view(hkv, g, n, n_keys)
        s.copy_(_softcap(s, softcap))
        s.masked_fill_(~self._visible(block, k0, window), float("-inf"))
        s.sub_(s.amax(dim=-1, keepdim=True)).exp_()
        total = s.sum(dim=-1, keepdim=True)
        o = _per_head_mm(scores, values[:, :n_keys])[:, : g * n].view(hkv, g, n, d) / total
        out[c0 + i0 : c0 + i1] = o.permute(2, 0, 1, 3).reshape(n, hq, d)

    def _visible(self, block: tuple[int, int, int, torch.Tensor], k0: int, window: int | None) -> torch.Tensor:
        """``[n, N]`` bool, True where a query of the content block may attend (causal, and within
        the sliding window); built once per block and window, then shared by the layers."""
        key = (id(block), window)
        got = self._visible_masks.get(key)
        if got is None:
            i0, i1, n_keys, hidden = block
            n = i1 - i0
            got = torch.ones(n, n_keys, dtype=torch.bool, device=hidden.device)
            got[:, k0:] = ~hidden
            if window is not None:
                qp = torch.arange(k0, k0 + n, device=hidden.device)
                got &= torch.arange(n_keys, device=hidden.device)[None, :] > qp[:, None] - window
            self._visible_masks[key] = got
        return got

    def _branches(
        self, m: MessagePlan, c: _BranchChunk, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        keys: torch.Tensor, values: torch.Tensor, out: torch.Tensor, scale: float,
        window: int | None, softcap: float | None, scratch: Scratch,
    ) -> None:
        """One chunk of the message's branch rows: against ``[preamble | content]`` and against
        each row's own-branch window, one softmax over both."""
        hkv, s_pad, d = keys.shape
        hq = q.shape[1]
        g = hq // hkv
        br, w = c.hide_own.shape
        n, start = c.n, c.start
        # the chunk's queries, scaled, as [Hkv, G, BR, D] (padding rows 0)
        qh = scratch.get("attn.q", (hkv, g, br, d), q)
        qh[:, :, :n] = q[start : start + n].view(n, hkv, g, d).permute(1, 2, 0, 3) * scale
        qh[:, :, n:] = 0.0
        # the keys/values of the rows [start - W + 1, start + BR) as [Hkv, BR + W - 1, D]
        lo = start - (w - 1)
        ks = scratch.get("attn.k_slab", (hkv, br + w - 1, d), k)
        vs = scratch.get("attn.v_slab", (hkv, br + w - 1, d), v)
        a0, a1 = max(lo, 0), min(start + br, k.shape[0])
        for slab, src in ((ks, k), (vs, v)):
            slab.zero_()
            slab[:, a0 - lo : a1 - lo] = src[a0:a1].transpose(0, 1)
        # [preamble | content]: one GEMM per KV head, [G * BR, D] @ [D, S_pad]
        ctx = scratch.get("attn.ctx", (hkv, g * br, s_pad), q)
        _per_head_mm(qh.view(hkv, g * br, d), keys.transpose(1, 2), out=ctx)
        s_ctx = ctx.view(hkv, g, br, s_pad)
        # own branch: per (KV head, row) its [G, D] queries against its window [W, D]
        win_k = ks.as_strided((hkv, br, d, w), (ks.stride(0), d, 1, d)).reshape(hkv * br, d, w)
        q_rows = qh.permute(0, 2, 1, 3).reshape(hkv * br, g, d)
        s_own = torch.bmm(q_rows, win_k).view(hkv, br, g, w).permute(0, 2, 1, 3).contiguous()  # [Hkv, G, BR, W]
        hide_own = c.hide_own
        hide_ctx: torch.Tensor | None = None  # None: only the key padding is hidden
        if window is not None:
            key_pos = torch.arange(s_pad, device=c.qpos.device)[None, :]
            hide_ctx = (key_pos >= m.n_keys) | (key_pos <= c.qpos[:, None] - window)
            hide_own = hide_own | (c.own_pos <= c.qpos[:, None] - window)
        for part, hide in ((s_ctx, hide_ctx), (s_own, hide_own)):
            if softcap is not None:
                part.copy_(_softcap(part, softcap))
            if hide is None:
                part[..., m.n_keys :] = float("-inf")  # the padding columns only
            else:
                part.masked_fill_(hide, float("-inf"))
        top = torch.maximum(s_ctx.amax(dim=-1, keepdim=True), s_own.amax(dim=-1, keepdim=True))
        s_ctx.sub_(top).exp_()
        s_own.sub_(top).exp_()
        total = s_ctx.sum(dim=-1, keepdim=True) + s_own.sum(dim=-1, keepdim=True)
        o = _per_head_mm(ctx, values).view(hkv, g, br, d)
        win_v = vs.as_strided((hkv, br, w, d), (vs.stride(0), d, d, 1)).reshape(hkv * br, w, d)
        p_own = s_own.permute(0, 2, 1, 3).reshape(hkv * br, g, w)
        o_own = torch.bmm(p_own, win_v).view(hkv, br, g, d).permute(0, 2, 1, 3)
        o = (o + o_own) / total
        out[start : start + n] = o.permute(2, 0, 1, 3).reshape(br, hq, d)[:n]
