"""Packed tree attention: many messages, each read once, its questions as branches, in one pass.

The layout (see DESIGN.md): a forward pass packs `[C1, B1_1 .. B1_k, C2, B2_1 ..]` with no padding.
Every token has a parent and attends to its ancestors and itself; nothing else. In key order the
tokens form *segments*, chains of consecutive keys where each key is the parent of the next:

    preamble (optional, shared)   root segment, positions 0..P-1
    message content C             parent: last preamble key (or none), positions P..P+L-1
    question branch B_j           parent: last content key, positions P+L..
    multi-token choice c          parent: last key of its question branch (a sub-branch)

So a query's visible keys are the union of at most R contiguous key ranges, one per segment on its
path from the root: a content token sees `[content_start, itself]` (plus the whole preamble), a
branch token sees the whole content and `[branch_start, itself]`, a choice token additionally its
whole question branch. `TreeMask` stores exactly that, per query row t and range r:

    kv_start[t, r], kv_len[t, r]     keys kv_start .. kv_start + kv_len - 1 are visible
                                     (kv_len == 0: an unused slot; ranges are disjoint)
    q_pos[t], k_pos[s]               logical positions (rotary, sliding window), not packed indices

`TreeMask.from_segments` builds it from the segments; `TreeMask.build` takes the ranges directly.

Batch invariance: each range is walked in `BLOCK_N`-key tiles *starting at its own `kv_start`*,
ranges in column order, with FlashAttention-2's online softmax (Dao 2023, "FlashAttention-2:
Faster Attention with Better Parallelism and Work Partitioning", arXiv:2307.08691). A query's
reduction order over keys therefore depends only on its own ranges' lengths, which are a property
of its message, never of the packed offset or the neighbours. Query rows are scheduled in blocks of
rows that share every `kv_start` (the rows of one segment), so the tiles are shared; a tile that
lies past a row's own `kv_len` is fully masked for that row and leaves its softmax state bitwise
unchanged (the `m_safe` guard below), so which rows share a block does not matter either. The
query heads that share a KV head (GQA) share a program too: each (row, head) pair is one row of
the program's tile, reduced on its own.

The torch twin computes the same blocks with explicit masks; its GEMMs see shapes fixed by the
message's structure (the block's rows, the ranges' lengths), so it is batch-invariant on CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .aot import planned_capability, shared_memory_limit
from ._triton import FP_FUSION, dot_precision, jit, tl

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "WIDE_HEAD_BLOCK_N",
    "keys_per_step",
    "pipeline_stages",
    "TILE_ROWS",
    "TreeMask",
    "rows_per_block",
    "tree_attention",
    "tree_attention_ref",
    "tree_attention_triton",
]

# Fixed tiles: TILE_ROWS (query row, head) pairs per program — the BLOCK_R query rows of one
# block times the query heads that share one KV head (GQA), so a program reads each K/V tile once
# for all of them — and BLOCK_N keys per step of the online softmax. BLOCK_N sets the reduction
# order over keys; changing it changes the bits. Head dims above 128, and every head dim on
# datacenter Blackwell, take WIDE_HEAD_BLOCK_N keys: with 64 the kernel spills registers (Hopper,
# sm_100) or overflows the 99 KiB of shared memory of Ada and consumer Blackwell
# (bench/kernel_table.py, docs/kernels.md).
TILE_ROWS = 64
BLOCK_N = 64
WIDE_HEAD_BLOCK_N = 32
#: Query rows per block when every query head has its own KV head (the TreeMask default).
BLOCK_M = TILE_ROWS


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def keys_per_step(device: torch.device, block_d: int) -> int:
    """Keys per step of the online softmax for a head dim padded to ``block_d`` on ``device``'s
    GPU: a function of the model and the kind of GPU only, so a row's reduction order is too."""
    capability = planned_capability(device)
    if capability is not None and capability[0] == 10:
        # datacenter Blackwell: 64 keys fit head dim 256 (214 registers without the window, 250
        # with it, no spills: compiled with Triton 3.9), while at head dim 128 its 128-register
        # tcgen05 kernels spill with 64 (docs/kernels.md)
        return BLOCK_N if block_d > 128 else WIDE_HEAD_BLOCK_N
    return WIDE_HEAD_BLOCK_N if block_d > 128 else BLOCK_N


def attention_warps(device: torch.device, block_d: int) -> int:
    """Warps per program: 4 up to head dim 64, else 8 (warps only split the tile's rows and
    columns among threads, never a sum's order)."""
    return 4 if block_d <= 64 else 8


def pipeline_stages(device: torch.device, block_d: int, itemsize: int) -> int:
    """Software-pipeline stages of the attention kernel on ``device``: 2 (K and V tiles loaded
    ahead) where twice the tiles fit the GPU's shared memory per block, else 1. An upper bound
    of what 2 stages take: Q's tile once, K's and V's twice, ``(2 * 2 * keys + TILE_ROWS) *
    block_d * itemsize`` bytes (exact on Hopper; Ampere and Ada take less). Stages change when
    loads are issued, never the order of any sum: a row's bits do not depend on them.
    """
    limit = shared_memory_limit(device)
    two = (2 * 2 * keys_per_step(device, block_d) + TILE_ROWS) * block_d * itemsize
    return 2 if limit is None or two <= limit else 1


def rows_per_block(group: int) -> int:
    """Query rows per program for ``group`` query heads per KV head: ``TILE_ROWS // next_pow2(group)``
    (at least 1). Build the pass's :class:`TreeMask` with this ``block_rows``."""
    return max(1, TILE_ROWS // _next_pow2(group))


@jit()
def _tree_attention_kernel(
    Q, K, V, O,
    KV_START, KV_LEN, Q_POS, K_POS, BLOCKS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    scale, window, softcap,
    R: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    block = tl.program_id(0)
    kv_head = tl.program_id(1)

    first_row = tl.load(BLOCKS + 2 * block)
    n_rows = tl.load(BLOCKS + 2 * block + 1)
    # Tile row i is query row first_row + i // GROUP_P2 at head kv_head * GROUP + i % GROUP_P2.
    offs_m = tl.arange(0, BLOCK_R * GROUP_P2)
    r_in = offs_m // GROUP_P2
    g_in = offs_m % GROUP_P2
    rows = first_row + r_in
    row_ok = (r_in < n_rows) & (g_in < GROUP)
    head = kv_head * GROUP + g_in
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(Q + rows.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = tl.load(Q_POS + rows, mask=row_ok, other=0)
    # Sliding window: a tile whose keys are all at or below this position is masked for every row.
    horizon = tl.min(tl.where(row_ok, q_pos, 2147483647), axis=0) - window

    m_i = tl.full((BLOCK_R * GROUP_P2,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_R * GROUP_P2,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_R * GROUP_P2, BLOCK_D), dtype=tl.float32)

    for r in tl.static_range(R):
        start = tl.load(KV_START + first_row * R + r)  # shared by every row of the block
        lens = tl.load(KV_LEN + rows * R + r, mask=row_ok, other=0)
        max_len = tl.max(lens, axis=0)
        # Tiles start at the range's own start: the alignment travels with the message.
        for j in range(0, max_len, BLOCK_N):
            offs = j + offs_n
            key_ok = offs < max_len
            keys = (start + offs).to(tl.int64)
            visible = (offs[None, :] < lens[:, None]) & row_ok[:, None]
            run = True
            if USE_WINDOW:
                k_pos = tl.load(K_POS + keys, mask=key_ok, other=-2147483647)
                visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
                # Skipping a tile that is masked for every row is bitwise the same as computing it.
                run = tl.max(tl.where(key_ok, k_pos, -2147483647), axis=0) > horizon
            if run:
                k = tl.load(K + keys[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                            mask=key_ok[:, None] & d_ok[None, :], other=0.0)
                v = tl.load(V + keys[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                            mask=key_ok[:, None] & d_ok[None, :], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
                if USE_SOFTCAP:
                    # cap * tanh(s / cap), tanh written with exp: portable to the interpreter.
                    s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * (s / softcap)) + 1.0))
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                # A row with nothing visible yet keeps m = -inf; exponentiate against 0 instead,
                # so alpha = p = 0 rather than NaN and the row's state stays exactly zero.
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m_i - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
                m_i = m_new

    # A row that saw no key (or a padding row) has l = 0 and acc = 0: write 0, not 0 / 0.
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(O + rows.to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@dataclass(frozen=True)
class TreeMask:
    """Which keys each query row of a packed pass may see, and the logical positions.

    Build it once per forward pass (every layer shares it) with `from_segments` or `build`, and
    move it to the GPU once with `.to(device)`.

    Attributes:
        kv_start: [T, R] int32, first key of each visible range (0 where `kv_len` is 0).
        kv_len: [T, R] int32, number of keys in each range; 0 marks an unused slot.
        q_pos: [T] int32, logical position of each query row.
        k_pos: [S] int32, logical position of each key.
        blocks: [B, 2] int32, the query blocks `(first_row, n_rows)`: runs of consecutive rows with
            identical `kv_start`, cut into pieces of at most `block_rows` rows from the run's start.
        block_rows: the most rows per block (see `rows_per_block`).
    """

    kv_start: Tensor
    kv_len: Tensor
    q_pos: Tensor
    k_pos: Tensor
    blocks: Tensor
    block_rows: int = BLOCK_M

    @property
    def n_queries(self) -> int:
        """T, the number of query rows."""
        return int(self.kv_start.shape[0])

    @property
    def n_keys(self) -> int:
        """S, the number of keys."""
        return int(self.k_pos.shape[0])

    @property
    def n_ranges(self) -> int:
        """R, the number of range slots per row (the depth of the deepest segment chain)."""
        return int(self.kv_start.shape[1])

    def to(self, device: torch.device | str) -> TreeMask:
        """This mask with every tensor on `device`."""
        fields = (self.kv_start, self.kv_len, self.q_pos, self.k_pos, self.blocks)
        return TreeMask(*(t.to(device) for t in fields), block_rows=self.block_rows)

    @classmethod
    def build(
        cls, kv_start: Tensor, kv_len: Tensor, q_pos: Tensor, k_pos: Tensor, block_rows: int = BLOCK_M,
    ) -> TreeMask:
        """A mask from explicit ranges (CPU tensors; see the module docstring for their meaning).

        Args:
            kv_start: [T, R] integer, first key of each range.
            kv_len: [T, R] integer, keys in each range, >= 0.
            q_pos: [T] integer logical positions of the queries.
            k_pos: [S] integer logical positions of the keys.
            block_rows: the most query rows per block (`rows_per_block(group)` for the kernel).

        The ranges must be *structural* for batch invariance: one range per segment (preamble,
        content, branch, sub-branch), never two segments merged because they happen to be adjacent
        in this pack, or the tiles would align differently when the message moves.

        Raises:
            ValueError: on shape mismatches, a range outside [0, S), negative lengths, or two
                overlapping ranges in one row.
        """
        if kv_start.dim() != 2 or kv_len.shape != kv_start.shape:
            raise ValueError(f"TreeMask: kv_start and kv_len must both be [T, R], got "
                             f"{tuple(kv_start.shape)} and {tuple(kv_len.shape)}")
        T, R = kv_start.shape
        if q_pos.shape != (T,) or k_pos.dim() != 1:
            raise ValueError(f"TreeMask: expected q_pos [{T}] and k_pos [S], got "
                             f"{tuple(q_pos.shape)} and {tuple(k_pos.shape)}")
        for name, t in (("kv_start", kv_start), ("kv_len", kv_len), ("q_pos", q_pos), ("k_pos", k_pos)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"TreeMask: {name} must be an integer tensor, got {t.dtype}")
        S = k_pos.shape[0]
        start = kv_start.detach().to("cpu", torch.int64)
        length = kv_len.detach().to("cpu", torch.int64)
        if bool((length < 0).any()):
            raise ValueError("TreeMask: kv_len must be >= 0")
        used = length > 0
        start = torch.where(used, start, 0)  # unused slots must not split a block
        end = start + length
        if bool(((start < 0) | (end > S))[used].any()):
            raise ValueError(f"TreeMask: a range lies outside the {S} keys")
        for a in range(R):
            for b in range(a + 1, R):
                overlap = used[:, a] & used[:, b] & (start[:, a] < end[:, b]) & (start[:, b] < end[:, a])
                if bool(overlap.any()):
                    row = int(overlap.nonzero()[0, 0])
                    raise ValueError(f"TreeMask: row {row} has overlapping ranges {a} and {b}")
        return cls(
            kv_start=start.to(torch.int32),
            kv_len=length.to(torch.int32),
            q_pos=q_pos.detach().to("cpu", torch.int32),
            k_pos=k_pos.detach().to("cpu", torch.int32),
            blocks=_query_blocks(start, block_rows),
            block_rows=block_rows,
        )

    @classmethod
    def from_segments(
        cls,
        segments: Sequence[tuple[int, int, int]],
        queries: Sequence[int] | Tensor | None = None,
        block_rows: int = BLOCK_M,
        blocks: Sequence[tuple[int, int]] = (),
    ) -> TreeMask:
        """A mask, and the logical positions, from the pass's segments.

        Args:
            segments: `(start, length, parent)` per segment, in key indices: keys
                `start .. start + length - 1` form a chain (each the parent of the next), and the
                first one's parent is key `parent`, or -1 for a root (a preamble, or a message
                without one). Together the segments must tile the keys `0 .. S-1` exactly, and a
                parent must come before its child (`parent < start`).
            queries: key index of each query row, in row order; default every key (`T == S`, self
                attention over the pass). Pass e.g. `range(P, S)` when keys `0..P-1` are a cached
                preamble that is not recomputed.
            block_rows: the most query rows per block (`rows_per_block(group)` for the kernel).
            blocks: `(start, length)` runs of keys inside one segment that see each other whole
                (bidirectional; Gemma 3's image soft tokens): each row of a run sees its segment
                up to the run's end.

        Returns:
            The mask, with `k_pos` = depth in the tree (a root's first key is 0; a segment starts
            one after its parent), so content runs 0..L-1 and every branch of it starts at L.

        Raises:
            ValueError: if the segments do not tile the keys, a parent does not precede its
                segment, or a query index is out of range.
        """
        segs = sorted((int(s), int(n), int(p)) for s, n, p in segments)
        S = 0
        for s, n, p in segs:
            if s != S or n <= 0:
                raise ValueError(f"TreeMask.from_segments: segments must tile the keys without gaps "
                                 f"or overlaps; got a segment ({s}, {n}) where key {S} was expected")
            if not -1 <= p < s:
                raise ValueError(f"TreeMask.from_segments: segment at {s} has parent {p}; "
                                 f"a parent must precede its segment (or be -1)")
            S += n
        seg_of_key = torch.empty(S, dtype=torch.int64)
        k_pos = torch.empty(S, dtype=torch.int64)
        # ranges_above[g]: the ranges every key of segment g inherits from its ancestors.
        ranges_above: list[list[tuple[int, int]]] = []
        for g, (s, n, p) in enumerate(segs):
            seg_of_key[s:s + n] = g
            if p < 0:
                above: list[tuple[int, int]] = []
                first_pos = 0
            else:
                pg = int(seg_of_key[p])
                pstart = segs[pg][0]
                above = ranges_above[pg] + [(pstart, p - pstart + 1)]
                first_pos = int(k_pos[p]) + 1
            ranges_above.append(above)
            k_pos[s:s + n] = torch.arange(first_pos, first_pos + n)
        R = 1 + max(len(a) for a in ranges_above) if segs else 1
        starts = torch.zeros(S, R, dtype=torch.int64)
        lens = torch.zeros(S, R, dtype=torch.int64)
        for g, (s, n, _) in enumerate(segs):
            above = ranges_above[g]
            for r, (rs, rn) in enumerate(above):
                starts[s:s + n, r] = rs
                lens[s:s + n, r] = rn
            starts[s:s + n, len(above)] = s
            lens[s:s + n, len(above)] = torch.arange(1, n + 1)  # causal within its own segment
        for b0, bn in blocks:
            g = int(seg_of_key[b0]) if 0 <= b0 < S else -1
            if g < 0 or bn < 1 or b0 + bn > segs[g][0] + segs[g][1]:
                raise ValueError(f"TreeMask.from_segments: block ({b0}, {bn}) is not inside one segment")
            lens[b0:b0 + bn, len(ranges_above[g])] = b0 + bn - segs[g][0]
        if queries is None:
            rows = torch.arange(S)
        else:
            rows = torch.as_tensor(queries, dtype=torch.int64).reshape(-1)
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= S):
                raise ValueError(f"TreeMask.from_segments: a query index lies outside the {S} keys")
        return cls.build(starts[rows], lens[rows], k_pos[rows], k_pos, block_rows)


def _query_blocks(kv_start: Tensor, block_rows: int) -> Tensor:
    """[B, 2] int32 `(first_row, n_rows)`: runs of rows with equal `kv_start`, cut every `block_rows`."""
    T = kv_start.shape[0]
    if T == 0:
        return torch.zeros((0, 2), dtype=torch.int32)
    new_run = torch.ones(T, dtype=torch.bool)
    new_run[1:] = (kv_start[1:] != kv_start[:-1]).any(dim=1)
    run_starts = new_run.nonzero().flatten().tolist() + [T]
    blocks = [
        (b, min(block_rows, end - b))
        for begin, end in zip(run_starts[:-1], run_starts[1:])
        for b in range(begin, end, block_rows)  # cut from the run's own start: a structural split
    ]
    return torch.tensor(blocks, dtype=torch.int32)


def _check(q: Tensor, k: Tensor, v: Tensor, mask: TreeMask) -> tuple[int, int, int]:
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"tree_attention: expected q [T, Hq, D], k and v [S, Hkv, D], got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    T, Hq, D = q.shape
    S, Hkv, Dk = k.shape
    if Dk != D:
        raise ValueError(f"tree_attention: head dim mismatch, q {D} vs k {Dk}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"tree_attention: {Hq} query heads are not a multiple of {Hkv} kv heads")
    if mask.n_queries != T or mask.n_keys != S:
        raise ValueError(f"tree_attention: mask is for {mask.n_queries} queries and {mask.n_keys} keys, "
                         f"got q with {T} rows and k with {S}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"tree_attention: dtype mismatch {q.dtype}, {k.dtype}, {v.dtype}")
    return Hq, Hkv, D


def tree_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: TreeMask,
    *,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Tree attention with the Triton kernel (CUDA, or CPU under `TRITON_INTERPRET=1`).

    Args:
        q: [T, Hq, D] queries (rotary already applied), fp32/bf16/fp16.
        k: [S, Hkv, D] keys; Hq must be a multiple of Hkv (GQA: query head h reads kv head
            h // (Hq // Hkv)). Same dtype and device as q.
        v: [S, Hkv, D] values.
        mask: which keys each query row sees, and positions; its tensors on q's device.
        scale: multiplies q.k (default D ** -0.5).
        window: sliding window in positions: key s is masked for query t when
            `k_pos[s] <= q_pos[t] - window` (Gemma 3 local layers: 512). None: no window.
        softcap: logit soft-cap, `s = softcap * tanh(s / softcap)` after scaling. None: off.

    Returns:
        [T, Hq, D] in q.dtype, softmax accumulated in fp32. A row that sees no key gets zeros.
        A message's rows are bitwise independent of whatever else is packed with it.

    Raises:
        ValueError: on shape, dtype or mask mismatches, or `window < 1`.
        RuntimeError: if Triton is not installed.
    """
    Hq, Hkv, D = _check(q, k, v, mask)
    if window is not None and window < 1:
        raise ValueError(f"tree_attention: window must be >= 1, got {window}")
    T = q.shape[0]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if T == 0 or mask.blocks.shape[0] == 0:
        return out.zero_()
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    mask = mask.to(q.device)  # no-op when the caller already moved it once per pass
    group = Hq // Hkv
    block_r = rows_per_block(group)
    if mask.block_rows != block_r:
        raise ValueError(f"tree_attention: the mask's blocks have {mask.block_rows} rows; with {group} query "
                         f"heads per KV head the kernel needs {block_r} (TreeMask.from_segments(..., "
                         f"block_rows=rows_per_block({group})))")
    block_d = max(16, 1 << (D - 1).bit_length())
    grid = (mask.blocks.shape[0], Hkv)
    _tree_attention_kernel[grid](
        q, k, v, out,
        mask.kv_start, mask.kv_len, mask.q_pos, mask.k_pos, mask.blocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        float(D ** -0.5 if scale is None else scale),
        int(window or 0), float(softcap or 1.0),
        R=mask.n_ranges, GROUP=group, GROUP_P2=_next_pow2(group), HEAD_DIM=D, BLOCK_D=block_d,
        BLOCK_R=block_r, BLOCK_N=keys_per_step(q.device, block_d),
        USE_WINDOW=window is not None, USE_SOFTCAP=softcap is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=attention_warps(q.device, block_d), num_stages=pipeline_stages(q.device, block_d, q.element_size()),
        enable_fp_fusion=FP_FUSION,
    )
    return out


def tree_attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: TreeMask,
    *,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Torch twin of `tree_attention_triton`: same arguments, result (to rounding) and errors.

    Computes the kernel's query blocks one at a time in fp32: gathers the block's key ranges
    (each from its own start), builds the explicit [rows, keys] mask, and runs a plain softmax.
    """
    Hq, Hkv, D = _check(q, k, v, mask)
    if window is not None and window < 1:
        raise ValueError(f"tree_attention: window must be >= 1, got {window}")
    group = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    mask = mask.to(q.device)
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    kv_start = mask.kv_start.tolist()
    kv_len = mask.kv_len.to(torch.int64)
    for first, n in mask.blocks.tolist():
        rows = slice(first, first + n)
        lens = kv_len[rows]
        keys, visible = [], []
        for r, start in enumerate(kv_start[first]):
            width = int(lens[:, r].max())
            if width:
                keys.append(torch.arange(start, start + width, device=q.device))
                visible.append(torch.arange(width, device=q.device)[None, :] < lens[:, r, None])
        if not keys:
            continue
        idx = torch.cat(keys)
        seen = torch.cat(visible, dim=1)  # [n, keys]
        if window is not None:
            seen &= mask.k_pos[idx][None, :] > mask.q_pos[rows, None] - window
        # [Hkv, group * n, D] @ [Hkv, D, keys]: GQA without repeating k; shapes fixed by the block.
        # Operands are fresh copies (the gathers, copy=True), so the BLAS never sees a pointer
        # whose alignment depends on where the message sits in the pack.
        qh = q[rows].to(torch.float32, copy=True).reshape(n, Hkv, group, D).permute(1, 2, 0, 3)
        qh = qh.reshape(Hkv, group * n, D)
        kh = k[idx].to(torch.float32).permute(1, 2, 0)
        vh = v[idx].to(torch.float32).permute(1, 0, 2)
        s = torch.bmm(qh, kh) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        s = s.view(Hkv, group, n, -1).masked_fill(~seen, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # all-masked rows: NaN -> 0, like the kernel
        o = torch.bmm(p.view(Hkv, group * n, -1), vh)
        out[rows] = o.view(Hkv, group, n, D).permute(2, 0, 1, 3).reshape(n, Hq, D).to(q.dtype)
    return out


def tree_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: TreeMask,
    *,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Batch-invariant tree attention: the Triton kernel on CUDA tensors, the torch twin elsewhere.

    Arguments, result and errors as `tree_attention_triton`.
    """
    if q.is_cuda:
        return tree_attention_triton(q, k, v, mask, scale=scale, window=window, softcap=softcap)
    return tree_attention_ref(q, k, v, mask, scale=scale, window=window, softcap=softcap)
