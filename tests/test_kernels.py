"""spinf_stream/kernels/: each Triton kernel against its torch twin, each twin against an independent
computation, and batch invariance (a row's or message's bits do not depend on its neighbours).

The Triton kernels run on CPU under TRITON_INTERPRET=1, in fp32 (the interpreter gets bf16
`tl.dot` wrong). Triton fixes interpreter mode when it is first imported in a process, and other
test modules may import it first (`from transformers import <model>` does); then the kernels run
in one fresh spawned process that imports Triton with the variable set. With TRITON_INTERPRET=0
and a GPU, the same tests run the kernels on CUDA.
"""

from __future__ import annotations

import os
import sys

# Before any triton import; see the module docstring for when this is too late.
_TRITON_ALREADY_IMPORTED = "triton" in sys.modules
os.environ.setdefault("TRITON_INTERPRET", "1")

import multiprocessing  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from spinf_stream.kernels import (  # noqa: E402
    TreeMask,
    logsumexp_ref,
    logsumexp_triton,
    matmul_fp8_ref,
    matmul_fp8_triton,
    matmul_int8_ref,
    matmul_int8_triton,
    quantize_rows,
    matmul,
    matmul_ref,
    matmul_triton,
    rms_norm,
    rms_norm_ref,
    rms_norm_triton,
    rows_per_block,
    tree_attention,
    tree_attention_ref,
    tree_attention_triton,
)

INTERPRET = os.environ["TRITON_INTERPRET"].strip().lower() in {"1", "true", "on", "yes"}


# --------------------------------------------------------------------------- running Triton


def _to(value: Any, device: str) -> Any:
    if isinstance(value, (torch.Tensor, TreeMask)):
        return value.to(device)
    return value


class TritonRunner:
    """Calls a `*_triton` entry point where Triton can run it; returns the result on the CPU."""

    def __init__(self) -> None:
        if not INTERPRET and not torch.cuda.is_available():
            pytest.skip(
                "Triton kernels need TRITON_INTERPRET=1 (this file's default; CI runs them so) or a CUDA GPU;"
                " TRITON_INTERPRET was set off and there is no GPU"
            )
        self.device = "cpu" if INTERPRET else "cuda"
        # Interpreter mode requested, but Triton was imported without it: use a fresh process.
        fresh = INTERPRET and _TRITON_ALREADY_IMPORTED
        self.pool = (
            ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            if fresh else None
        )

    def __call__(self, fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple(_to(a, self.device) for a in args)
        if self.pool is None:
            out = fn(*args, **kwargs)
        else:
            out = self.pool.submit(fn, *args, **kwargs).result()
        return out.cpu()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


@pytest.fixture(scope="module")
def triton_run() -> Iterator[TritonRunner]:
    runner = TritonRunner()
    yield runner
    runner.close()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- matmul


def test_matmul_triton_matches_torch_on_ragged_shapes(triton_run: TritonRunner) -> None:
    # M, N, K all off the tile sizes, and x transposed in memory: masks and strides are exercised.
    g = _gen(0)
    x = torch.randn(100, 70, generator=g).t()  # [70, 100], column-major
    w = torch.randn(150, 100, generator=g) / 10  # outputs of order one, like a Linear layer's
    _close(triton_run(matmul_triton, x, w), x.double() @ w.double().t())


def test_matmul_ref_matches_torch() -> None:
    g = _gen(1)
    x, w = torch.randn(130, 48, generator=g), torch.randn(40, 48, generator=g) / 7
    _close(matmul_ref(x, w), x.double() @ w.double().t())


def test_matmul_triton_row_is_bitwise_batch_invariant(triton_run: TritonRunner) -> None:
    g = _gen(2)
    x, w = torch.randn(90, 72, generator=g), torch.randn(136, 72, generator=g)
    packed = triton_run(matmul_triton, x, w)
    for row in (0, 41, 89):  # alone at row 0 of a 1-row batch vs inside a 90-row batch
        assert torch.equal(triton_run(matmul_triton, x[row:row + 1], w), packed[row:row + 1])


@pytest.mark.parametrize("m", [1, 3, 64, 65, 300])
def test_matmul_ref_row_is_bitwise_batch_invariant(m: int) -> None:
    g = _gen(3)
    x, w = torch.randn(m, 96, generator=g), torch.randn(200, 96, generator=g)
    packed = matmul_ref(x, w)
    for row in {0, m // 2, m - 1}:
        assert torch.equal(matmul_ref(x[row:row + 1].clone(), w), packed[row:row + 1])


@pytest.mark.parametrize("x_shape, w_shape", [((4, 8), (5, 7)), ((4, 8, 1), (5, 8)), ((8,), (5, 8))])
def test_matmul_rejects_mismatched_shapes(x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        matmul(torch.zeros(x_shape), torch.zeros(w_shape))


# --------------------------------------------------------------------------- fp8 matmul


def _fp8_weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from spinf_stream.models import quantize_fp8

    w = torch.randn(n, k, generator=_gen(seed)) / 10
    q = quantize_fp8(w)
    return w, q.data, q.scale


def test_fp8_weight_quantization_is_within_e4m3_precision() -> None:
    w, w8, sw = _fp8_weights(96, 130, 20)
    deq = w8.float() * sw[:, None]
    # e4m3: 3 mantissa bits, so a normal value rounds within 2**-4 of itself; tiny ones to the grid
    assert bool(((deq - w).abs() <= w.abs() / 16 + sw[:, None] * 2.0**-9).all())
    assert torch.equal(w8.float().abs().amax(dim=1), torch.full((96,), 448.0))  # each channel uses the range


def test_matmul_fp8_triton_matches_the_dequantized_product(triton_run: TritonRunner) -> None:
    """The fp8 GEMM against its definition: (x8 * sx) @ (w8 * sw).T in float64 (float8 values
    are exact in float64), and against its torch twin."""
    x = torch.randn(70, 130, generator=_gen(21)) * 2
    _, w8, sw = _fp8_weights(150, 130, 22)
    x8, sx = quantize_rows(x)
    want = (x8.double() * sx.double()[:, None]) @ (w8.double() * sw.double()[:, None]).t()
    got = triton_run(matmul_fp8_triton, x, w8, sw)
    _close(got, want, rtol=1e-5, atol=1e-5)
    _close(matmul_fp8_ref(x, w8, sw), want, rtol=1e-5, atol=1e-5)


def test_matmul_fp8_triton_row_is_bitwise_batch_invariant(triton_run: TritonRunner) -> None:
    x = torch.randn(90, 72, generator=_gen(23))
    _, w8, sw = _fp8_weights(136, 72, 24)
    packed = triton_run(matmul_fp8_triton, x, w8, sw)
    for row in (0, 41, 89):
        assert torch.equal(triton_run(matmul_fp8_triton, x[row:row + 1], w8, sw), packed[row:row + 1])


# --------------------------------------------------------------------------- int8 matmul (W8A16)


def _int8_weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from spinf_stream.models import quantize_int8

    w = torch.randn(n, k, generator=_gen(seed)) / 10
    w[3] = 0.0  # an all-zero channel: a tiny scale, zeros, no division by zero
    q = quantize_int8(w)
    return w, q.data, q.scale


def test_int8_weight_quantization_is_the_symmetric_per_channel_rounding() -> None:
    """Against the definition, in float64: s[n] = max|w[n]| / 127, q = round-half-even(w / s)."""
    w, q, s = _int8_weights(96, 130, 30)
    wd = w.double()
    want_s = wd.abs().amax(dim=1) / 127
    assert torch.allclose(s.double(), want_s.clamp(min=1e-12 / 127), rtol=1e-6, atol=0)
    want_q = torch.round(wd / s.double()[:, None])
    assert q.dtype == torch.int8 and torch.equal(q.double(), want_q)
    assert bool(((q.double() * s.double()[:, None] - wd).abs() <= s.double()[:, None] / 2 * (1 + 1e-6)).all())
    assert torch.equal(q[torch.arange(96) != 3].abs().amax(dim=1), torch.full((95,), 127, dtype=torch.int8))
    assert not q[3].any()


@pytest.mark.parametrize(("m", "n", "k"), [(70, 150, 130), (1, 136, 72), (65, 9, 200)])
def test_matmul_int8_triton_matches_the_dequantized_product(triton_run: TritonRunner, m: int, n: int, k: int) -> None:
    """The W8A16 GEMM against its definition, x @ (q * s).T in float64 (int8 values and their
    products with fp32 values are exact in float64), and against its torch twin; ragged M, N, K."""
    x = torch.randn(m, k, generator=_gen(31)) * 2
    _, q, s = _int8_weights(n, k, 32)
    want = x.double() @ (q.double() * s.double()[:, None]).t()
    got = triton_run(matmul_int8_triton, x, q, s)
    assert got.dtype == x.dtype
    _close(got, want, rtol=1e-5, atol=1e-5)
    _close(matmul_int8_ref(x, q, s), want, rtol=1e-5, atol=1e-5)


def test_matmul_int8_ref_in_bfloat16_rounds_once_from_the_fp32_product() -> None:
    """The twin in bf16 (the pass's dtype): the fp32 product and scale, rounded once to bf16."""
    x = (torch.randn(40, 96, generator=_gen(33)) * 2).to(torch.bfloat16)
    _, q, s = _int8_weights(50, 96, 34)
    want = (x.double() @ (q.double() * s.double()[:, None]).t()).to(torch.bfloat16)
    got = matmul_int8_ref(x, q, s)
    assert got.dtype == torch.bfloat16
    # one bf16 rounding of a value within fp32 summation error of the exact one: at most 1 ulp apart
    assert bool(((got.float() - want.float()).abs() <= want.float().abs() * 2.0**-7 + 1e-6).all())


def test_matmul_int8_triton_row_is_bitwise_batch_invariant(triton_run: TritonRunner) -> None:
    x = torch.randn(90, 72, generator=_gen(35))
    _, q, s = _int8_weights(136, 72, 36)
    packed = triton_run(matmul_int8_triton, x, q, s)
    for row in (0, 41, 89):
        assert torch.equal(triton_run(matmul_int8_triton, x[row:row + 1], q, s), packed[row:row + 1])
    assert torch.equal(triton_run(matmul_int8_triton, x.flip(0), q, s), packed.flip(0))


def test_matmul_int8_ref_row_is_bitwise_batch_invariant() -> None:
    x = torch.randn(150, 72, generator=_gen(37)).to(torch.bfloat16)
    _, q, s = _int8_weights(136, 72, 38)
    packed = matmul_int8_ref(x, q, s)
    for row in (0, 63, 64, 149):
        assert torch.equal(matmul_int8_ref(x[row:row + 1], q, s), packed[row:row + 1])


@pytest.mark.parametrize(("x", "q", "s"), [
    (torch.zeros(2, 8), torch.zeros(4, 8), torch.ones(4)),  # float weights: not int8
    (torch.zeros(2, 8), torch.zeros(4, 9, dtype=torch.int8), torch.ones(4)),  # K mismatch
    (torch.zeros(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(3)),  # one scale per row
    (torch.zeros(2, 8, dtype=torch.int8), torch.zeros(4, 8, dtype=torch.int8), torch.ones(4)),  # int activations
])
def test_matmul_int8_refuses_bad_operands(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="matmul_int8"):
        matmul_int8_ref(x, q, s)


# --------------------------------------------------------------------------- logsumexp


@pytest.mark.parametrize("vocab", [100, 49152, 151936])
def test_logsumexp_matches_float64_and_its_row_is_invariant(triton_run: TritonRunner, vocab: int) -> None:
    x = torch.randn(5, vocab, generator=_gen(25)) * 6
    want = torch.logsumexp(x.double(), dim=-1)
    ref = logsumexp_ref(x)
    _close(ref, want, rtol=1e-6, atol=1e-5)
    for row in range(5):  # a single row reduced alone: torch.logsumexp would split it across threads
        assert torch.equal(logsumexp_ref(x[row:row + 1].clone()), ref[row:row + 1])
    if vocab < 100_000:  # the interpreter walks 1024 columns per step: keep CI quick
        got = triton_run(logsumexp_triton, x)
        _close(got, want, rtol=1e-6, atol=1e-5)
        assert torch.equal(triton_run(logsumexp_triton, x[2:3]), got[2:3])


# --------------------------------------------------------------------------- rms_norm


def _rms_norm_float64(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (offset + w.double())


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("hidden", [40, 5000])  # 5000: wider than one block, walked in chunks
def test_rms_norm_triton_matches_formula(triton_run: TritonRunner, hidden: int, offset: float) -> None:
    g = _gen(4)
    x, w = torch.randn(5, hidden, generator=g) * 3, torch.randn(hidden, generator=g)
    _close(triton_run(rms_norm_triton, x, w, 1e-6, offset), _rms_norm_float64(x, w, 1e-6, offset))


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_ref_matches_formula(offset: float) -> None:
    g = _gen(5)
    x, w = torch.randn(33, 640, generator=g) * 3, torch.randn(640, generator=g)
    _close(rms_norm_ref(x, w, 1e-5, offset), _rms_norm_float64(x, w, 1e-5, offset))


def test_rms_norm_triton_row_is_bitwise_batch_invariant(triton_run: TritonRunner) -> None:
    g = _gen(6)
    x, w = torch.randn(9, 300, generator=g), torch.randn(300, generator=g)
    packed = triton_run(rms_norm_triton, x, w, 1e-6, 1.0)
    for row in (0, 7):
        assert torch.equal(triton_run(rms_norm_triton, x[row:row + 1], w, 1e-6, 1.0), packed[row:row + 1])


@pytest.mark.parametrize("t", [2, 64, 1000])
def test_rms_norm_ref_row_is_bitwise_batch_invariant(t: int) -> None:
    g = _gen(7)
    x, w = torch.randn(t, 896, generator=g), torch.randn(896, generator=g)
    packed = rms_norm_ref(x, w, 1e-6, 0.0)
    for row in {0, t // 2, t - 1}:
        assert torch.equal(rms_norm_ref(x[row:row + 1].clone(), w, 1e-6, 0.0), packed[row:row + 1])


def test_rms_norm_rejects_weight_of_wrong_width() -> None:
    with pytest.raises(ValueError):
        rms_norm(torch.zeros(3, 8), torch.zeros(7), 1e-6)


# --------------------------------------------------------------------------- tree attention: packs


@dataclass
class Msg:
    """A message's shape: content length, and per question branch its length and the lengths of
    its multi-token choices (sub-branches hanging off the branch's last token)."""

    content: int
    branches: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.content + sum(b + sum(subs) for b, subs in self.branches)


def pack_segments(msgs: list[Msg], preamble: int = 0) -> list[tuple[int, int, int]]:
    """The engine's layout: [preamble][C1 B1_1 (choices) B1_2 ..][C2 ..] as (start, len, parent)."""
    segments = [(0, preamble, -1)] if preamble else []
    at = preamble
    for m in msgs:
        content = at
        segments.append((content, m.content, preamble - 1))  # -1 without a preamble: a root
        at += m.content
        for length, subs in m.branches:
            branch = at
            segments.append((branch, length, content + m.content - 1))
            at += length
            for sub in subs:
                segments.append((at, sub, branch + length - 1))
                at += sub
    return segments


def parents_from_segments(segments: list[tuple[int, int, int]]) -> list[int]:
    parent = [0] * sum(n for _, n, _ in segments)
    for start, n, p in segments:
        parent[start] = p
        for key in range(start + 1, start + n):
            parent[key] = key - 1
    return parent


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, parent: list[int], queries: list[int],
    scale: float, window: int | None, softcap: float | None,
) -> torch.Tensor:
    """Attention from first principles, in float64: a full [T, S] mask built by walking each
    query's ancestors, positions as depths, and torch's softmax over all S keys."""
    S = len(parent)
    depth = []
    for key in range(S):
        depth.append(0 if parent[key] < 0 else depth[parent[key]] + 1)
    allowed = torch.zeros(len(queries), S, dtype=torch.bool)
    for row, key in enumerate(queries):
        a = key
        while a >= 0:
            if window is None or depth[a] > depth[key] - window:
                allowed[row, a] = True
            a = parent[a]
    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("thd,shd->hts", q.double(), kk) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hts,shd->thd", p, vv)


@dataclass
class Case:
    msgs: list[Msg]
    preamble: int = 0
    heads: tuple[int, int] = (4, 2)  # (Hq, Hkv)
    head_dim: int = 16
    window: int | None = None
    softcap: float | None = None
    cached_preamble: bool = False  # the preamble's keys are given, its queries are not recomputed


CASES = {
    # content longer than BLOCK_N and BLOCK_M: several key tiles and query blocks per message
    "gqa_plain": Case([Msg(70, [(3, []), (5, [])]), Msg(20, [(4, [])])]),
    "preamble_window": Case([Msg(30, [(6, [])]), Msg(12, [(3, [])])], preamble=9, window=8),
    "subbranches_softcap_mha": Case(
        [Msg(25, [(4, [2, 3]), (3, [1, 1, 2])]), Msg(5, [(2, [3])])], heads=(2, 2), softcap=5.0),
    "cached_preamble_all_options": Case(
        [Msg(40, [(4, [2, 2])]), Msg(9, [(3, [])])], preamble=11, heads=(6, 2), head_dim=24,
        window=13, softcap=8.0, cached_preamble=True),
}


def case_inputs(
    case: Case, seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, TreeMask, list[int]]:
    segments = pack_segments(case.msgs, case.preamble)
    S = sum(n for _, n, _ in segments)
    queries = list(range(case.preamble if case.cached_preamble else 0, S))
    g = _gen(seed)
    hq, hkv = case.heads
    q = torch.randn(len(queries), hq, case.head_dim, generator=g)
    k = torch.randn(S, hkv, case.head_dim, generator=g)
    v = torch.randn(S, hkv, case.head_dim, generator=g)
    mask = TreeMask.from_segments(segments, queries=queries, block_rows=rows_per_block(hq // hkv))
    return q, k, v, mask, queries


def case_options(case: Case) -> dict[str, Any]:
    return {"scale": case.head_dim ** -0.5, "window": case.window, "softcap": case.softcap}


# --------------------------------------------------------------------------- tree attention: layout


def test_tree_mask_layout_is_one_range_per_segment_on_the_path() -> None:
    # content c0 c1 c2 | branch A: a0 a1 | branch B: b0 b1 | choice of B: x0
    mask = TreeMask.from_segments([(0, 3, -1), (3, 2, 2), (5, 2, 2), (7, 1, 6)])
    assert mask.kv_start.tolist() == [
        [0, 0, 0], [0, 0, 0], [0, 0, 0],  # content: causal over its own range
        [0, 3, 0], [0, 3, 0],  # A: all content, then causal within A
        [0, 5, 0], [0, 5, 0],  # B
        [0, 5, 7],  # x0: all content, all of B, itself
    ]
    assert mask.kv_len.tolist() == [
        [1, 0, 0], [2, 0, 0], [3, 0, 0],
        [3, 1, 0], [3, 2, 0],
        [3, 1, 0], [3, 2, 0],
        [3, 2, 1],
    ]
    # logical positions: every branch starts where the content ends, a choice after its branch
    assert mask.k_pos.tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    assert torch.equal(mask.q_pos, mask.k_pos)
    # one query block per segment: rows of a block share every range start
    assert mask.blocks.tolist() == [[0, 3], [3, 2], [5, 2], [7, 1]]


def test_tree_mask_cuts_long_segments_into_blocks_from_their_own_start() -> None:
    mask = TreeMask.from_segments([(0, 5, -1), (5, 150, -1)])
    assert mask.blocks.tolist() == [[0, 5], [5, 64], [69, 64], [133, 22]]


def test_tree_mask_rejects_overlapping_ranges() -> None:
    with pytest.raises(ValueError, match="overlapping"):
        TreeMask.build(torch.tensor([[0, 2]]), torch.tensor([[3, 1]]), torch.tensor([2]), torch.arange(4))


def test_tree_mask_rejects_range_past_the_keys() -> None:
    with pytest.raises(ValueError, match="outside"):
        TreeMask.build(torch.tensor([[2]]), torch.tensor([[3]]), torch.tensor([0]), torch.arange(4))


def test_tree_mask_rejects_segments_with_a_gap() -> None:
    with pytest.raises(ValueError, match="tile"):
        TreeMask.from_segments([(0, 3, -1), (4, 2, 2)])


def test_tree_mask_rejects_a_parent_after_its_segment() -> None:
    with pytest.raises(ValueError, match="parent"):
        TreeMask.from_segments([(0, 3, 4), (3, 2, -1)])


@pytest.mark.parametrize("q_shape, kv_shape", [
    ((5, 3, 8), (5, 2, 8)),  # 3 query heads over 2 kv heads
    ((4, 2, 8), (5, 2, 8)),  # 4 queries, the mask has 5
    ((5, 2, 8), (5, 2, 4)),  # head dims differ
])
def test_tree_attention_rejects_mismatched_shapes(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...],
) -> None:
    mask = TreeMask.from_segments([(0, 5, -1)])
    with pytest.raises(ValueError):
        tree_attention(torch.zeros(q_shape), torch.zeros(kv_shape), torch.zeros(kv_shape), mask)


# --------------------------------------------------------------------------- tree attention: values


@pytest.mark.parametrize("name", list(CASES))
def test_tree_attention_ref_matches_dense_mask_attention(name: str) -> None:
    case = CASES[name]
    q, k, v, mask, queries = case_inputs(case)
    parent = parents_from_segments(pack_segments(case.msgs, case.preamble))
    expected = dense_attention(q, k, v, parent, queries, **case_options(case))
    _close(tree_attention_ref(q, k, v, mask, **case_options(case)), expected, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_tree_attention_triton_matches_ref(triton_run: TritonRunner, name: str) -> None:
    case = CASES[name]
    q, k, v, mask, _ = case_inputs(case)
    expected = tree_attention_ref(q, k, v, mask, **case_options(case))
    _close(triton_run(tree_attention_triton, q, k, v, mask, **case_options(case)), expected, atol=1e-5)


def test_tree_attention_row_that_sees_no_key_is_zero() -> None:
    # row 1 has a single, empty range
    mask = TreeMask.build(
        torch.tensor([[0], [0]]), torch.tensor([[1], [0]]), torch.tensor([0, 0]), torch.tensor([0]),
    )
    out = tree_attention_ref(torch.ones(2, 1, 16), torch.ones(1, 1, 16), torch.ones(1, 1, 16), mask)
    assert torch.equal(out[1], torch.zeros(1, 16))


# --------------------------------------------------------------------------- tree attention: invariance

TARGET = Msg(70, [(4, [2, 3]), (5, [])])  # spans two key tiles and two query blocks
NEIGHBOURS = (Msg(23, [(3, [1, 2])]), Msg(50, [(6, [])]))
INVARIANCE = dict(preamble=7, heads=(4, 2), head_dim=16, window=20, softcap=6.0)


def _message_tensors(msg: Msg, seed: int, hq: int, hkv: int, d: int) -> tuple[torch.Tensor, ...]:
    g = _gen(seed)
    n = msg.size
    q = torch.randn(n, hq, d, generator=g)
    return q, torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)


def _pack(msgs: list[tuple[Msg, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, TreeMask]:
    """q, k, v and mask for a pass: the shared preamble, then the messages (with their own seeds)."""
    hq, hkv = INVARIANCE["heads"]
    d, preamble = INVARIANCE["head_dim"], INVARIANCE["preamble"]
    parts = [_message_tensors(Msg(preamble), 99, hq, hkv, d)]
    parts += [_message_tensors(m, seed, hq, hkv, d) for m, seed in msgs]
    q, k, v = (torch.cat(t) for t in zip(*parts))
    mask = TreeMask.from_segments(pack_segments([m for m, _ in msgs], preamble), block_rows=rows_per_block(hq // hkv))
    return q, k, v, mask


def _alone_and_packed(run: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    options = {"window": INVARIANCE["window"], "softcap": INVARIANCE["softcap"]}
    preamble, n = INVARIANCE["preamble"], TARGET.size
    alone = run(*_pack([(TARGET, 1)]), **options)[preamble:preamble + n]
    packed_msgs = [(NEIGHBOURS[0], 2), (TARGET, 1), (NEIGHBOURS[1], 3)]
    at = preamble + NEIGHBOURS[0].size  # a different packed offset, not a multiple of any tile
    packed = run(*_pack(packed_msgs), **options)[at:at + n]
    return alone, packed


def test_tree_attention_triton_message_is_bitwise_independent_of_its_pack(triton_run: TritonRunner) -> None:
    alone, packed = _alone_and_packed(lambda *a, **kw: triton_run(tree_attention_triton, *a, **kw))
    assert torch.equal(alone, packed)


def test_tree_attention_ref_message_is_bitwise_independent_of_its_pack() -> None:
    alone, packed = _alone_and_packed(tree_attention_ref)
    assert torch.equal(alone, packed)


# --------------------------------------------------------------------------- dispatch


def test_dispatchers_run_the_torch_twins_on_cpu() -> None:
    g = _gen(8)
    x, w = torch.randn(5, 32, generator=g), torch.randn(7, 32, generator=g)
    assert torch.equal(matmul(x, w), matmul_ref(x, w))
    assert torch.equal(rms_norm(x, w[0], 1e-6, 1.0), rms_norm_ref(x, w[0], 1e-6, 1.0))
    q, k, v, mask, _ = case_inputs(CASES["preamble_window"])
    options = case_options(CASES["preamble_window"])
    assert torch.equal(tree_attention(q, k, v, mask, **options), tree_attention_ref(q, k, v, mask, **options))


# --------------------------------------------------------------------------- fused GEMM epilogues, the persistent
# TMA kernel, quantizing norms (issue 53). Helpers at module level: the runner may call them in a
# fresh process.


def _launch(x: torch.Tensor, w: torch.Tensor, kernel: str, activation: str | None = None,
            sx: torch.Tensor | None = None, sw: torch.Tensor | None = None) -> torch.Tensor:
    """``matmul.launch`` with small tiles of the named kernel (the tiles a GPU would take are
    too slow for the interpreter; the code is the same)."""
    from spinf_stream.kernels.matmul import TileConfig, gated_config, launch

    cfg = TileConfig(32, 32 if activation is None else 64, 32, 4, 2, kernel, 2)
    n = w.shape[0] // 2 if activation else w.shape[0]
    y = torch.empty(x.shape[0], n, dtype=torch.float32, device=x.device)
    launch(x, w, y, gated_config(cfg) if activation else cfg, sx, sw, activation)
    return y


def _rms_norm_fp8_bytes(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``rms_norm_fp8_triton``'s rows and scales as one tensor: ``[T, H + 4]`` bytes."""
    from spinf_stream.kernels import rms_norm_fp8_triton

    x8, sx = rms_norm_fp8_triton(x, w, 1e-6, 1.0)
    return torch.cat([x8.view(torch.uint8), sx[:, None].view(torch.uint8)], dim=1)


def _quantize_bytes(x: torch.Tensor) -> torch.Tensor:
    from spinf_stream.kernels import quantize_rows_triton

    x8, sx = quantize_rows_triton(x)
    return torch.cat([x8.view(torch.uint8), sx[:, None].view(torch.uint8)], dim=1)


def _twin_bytes(x8: torch.Tensor, sx: torch.Tensor) -> torch.Tensor:
    return torch.cat([x8.view(torch.uint8), sx[:, None].view(torch.uint8)], dim=1)


def _gated_fp8(x: torch.Tensor, w8: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    from spinf_stream.kernels import gated_matmul_fp8_triton, rms_norm_fp8_triton

    ones = torch.zeros(x.shape[1], device=x.device)
    return gated_matmul_fp8_triton(rms_norm_fp8_triton(x, ones, 1e-6, 1.0), w8, sw, "silu", out_dtype=torch.float32)


@pytest.mark.parametrize("kernel", ["tiled", "tma"])
@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh", "gelu"])
def test_gated_matmul_writes_the_activation_times_up_of_the_definition(triton_run: TritonRunner, kernel: str,
                                                                      activation: str) -> None:
    """act(x @ gate.T) * (x @ up.T) against the definition in float64 (Shazeer 2020), on sizes off
    the tiles: I = 40 leaves a ragged last gate tile whose loads run into the up rows."""
    from spinf_stream.kernels import gated_matmul_ref

    x = torch.randn(70, 96, generator=_gen(50))
    w = torch.randn(80, 96, generator=_gen(51)) / 10
    want = gated_matmul_ref(x.double(), w.double(), activation)
    _close(triton_run(_launch, x, w, kernel, activation), want, rtol=1e-5, atol=1e-5)


def test_the_persistent_tma_kernel_sums_as_the_tiled_kernel_does_and_its_rows_are_invariant(
        triton_run: TritonRunner) -> None:
    """Same tiles, same K order: bitwise the tiled kernel's result; rows alone, in a subset and
    reversed (other tile counts, so other programs compute them) bitwise those of the batch."""
    x = torch.randn(90, 96, generator=_gen(52))
    w = torch.randn(48, 96, generator=_gen(53))
    full = triton_run(_launch, x, w, "tma")
    _close(full, x.double() @ w.double().t())
    assert torch.equal(full, triton_run(_launch, x, w, "tiled"))
    assert torch.equal(triton_run(_launch, x[41:42].contiguous(), w, "tma"), full[41:42])
    assert torch.equal(triton_run(_launch, x.flip(0).contiguous(), w, "tma").flip(0), full)


def test_the_gated_epilogue_rows_are_bitwise_invariant(triton_run: TritonRunner) -> None:
    x = torch.randn(90, 64, generator=_gen(54))
    w = torch.randn(96, 64, generator=_gen(55)) / 8
    for kernel in ("tiled", "tma"):
        full = triton_run(_launch, x, w, kernel, "gelu_pytorch_tanh")
        for rows in (slice(0, 1), slice(41, 42), slice(60, 90)):
            assert torch.equal(triton_run(_launch, x[rows].contiguous(), w, kernel, "gelu_pytorch_tanh"), full[rows])


def test_the_quantizing_norm_is_bitwise_quantize_rows_of_the_norm(triton_run: TritonRunner) -> None:
    """One kernel writes what ``quantize_rows(rms_norm_triton(x))`` writes, byte for byte: values
    that round up into the next binade (127.7 → 128), an all-zero row, rows wider than one chunk."""
    for hidden in (96, 5000):
        x = torch.randn(37, hidden, generator=_gen(56)) * 3
        x[5] = 0.0
        w = torch.randn(hidden, generator=_gen(57))
        want = _twin_bytes(*quantize_rows(rms_norm_ref(x, w, 1e-6, 1.0)))
        got = triton_run(_rms_norm_fp8_bytes, x, w)
        # the Triton norm and its twin agree to rounding, not bitwise: compare through the same norm
        normed = triton_run(rms_norm_triton, x, w, 1e-6, 1.0)
        assert torch.equal(got, _twin_bytes(*quantize_rows(normed)))
        assert (got[:, :hidden].float() - want[:, :hidden].float()).abs().max() <= 1  # one fp8 step at most
        assert torch.equal(triton_run(_rms_norm_fp8_bytes, x[7:8].contiguous(), w), got[7:8])


def test_the_quantizing_pass_is_bitwise_quantize_rows(triton_run: TritonRunner) -> None:
    x = torch.randn(20, 64, generator=_gen(58)) * 5
    x[0, :4] = torch.tensor([127.69, -127.69, 448.0, 1e-30])  # a binade round-up, the largest, a tiny value
    assert torch.equal(triton_run(_quantize_bytes, x), _twin_bytes(*quantize_rows(x)))


def test_the_fp8_gated_gemm_on_normed_quantized_rows_matches_the_definition(triton_run: TritonRunner) -> None:
    """The fp8 MLP's first half as the engine runs it: the norm writes quantized rows, the gated
    GEMM reads them; against float64 on the same quantized operands."""
    x = torch.randn(40, 128, generator=_gen(59))
    _, w8, sw = _fp8_weights(96, 128, 60)
    x8, sx = quantize_rows(rms_norm_ref(x, torch.zeros(128), 1e-6, 1.0))
    y = (x8.double() * sx.double()[:, None]) @ (w8.double() * sw.double()[:, None]).t()
    g, u = y.chunk(2, dim=1)
    _close(triton_run(_gated_fp8, x, w8, sw), g * torch.sigmoid(g) * u, rtol=2e-3, atol=2e-3)


def test_measured_tiles_are_used_only_for_their_architecture_dtype_n_and_k() -> None:
    from spinf_stream.kernels import aot
    from spinf_stream.kernels.matmul import TUNED, TileConfig, install_tiles, tile_config, tile_row

    cfg = TileConfig(128, 128, 64, 8, 5, "tma", 16)
    saved = dict(TUNED)
    try:
        install_tiles([tile_row(90, torch.bfloat16, 8192, 3840, cfg)])
        token = aot._TARGET.set(90)
        try:
            cpu = torch.device("cpu")
            assert tile_config(cpu, torch.bfloat16, 8192, k=3840) == cfg
            assert tile_config(cpu, torch.bfloat16, 8192, k=4096) != cfg  # another K: the rule
            assert tile_config(cpu, torch.float8_e4m3fn, 8192, 128, k=3840) != cfg
        finally:
            aot._TARGET.reset(token)
        assert tile_config(torch.device("cpu"), torch.bfloat16, 8192, k=3840) != cfg  # the interpreter: the rule
        with pytest.raises(ValueError, match="gemm_tiles.json"):
            install_tiles([{"sm": 90, "dtype": "bfloat16", "n": 1, "k": 1, "kernel": "cublas", "block_m": 1,
                            "block_n": 1, "block_k": 1, "num_warps": 1, "num_stages": 1}])
    finally:
        TUNED.clear()
        TUNED.update(saved)


def _gemm_residual(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, kernel: str) -> torch.Tensor:
    from spinf_stream.kernels.matmul import TileConfig, launch

    r = r.clone()
    launch(x, w, r, TileConfig(32, 32, 32, 4, 2, kernel, 2), residual=True)
    return r


def _norm_add(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    from spinf_stream.kernels import rms_norm_add_triton

    r = r.clone()
    rms_norm_add_triton(x, w, 1e-6, 1.0, r)
    return r


@pytest.mark.parametrize("kernel", ["tiled", "tma"])
def test_the_residual_epilogue_adds_the_product_to_the_residual_stream(triton_run: TritonRunner, kernel: str) -> None:
    """residual + x @ w.T against float64, in place; a row's bits its own (a subset of rows).
    A "tma" config adds through the tiled kernel (the persistent one spills with the residual)."""
    x = torch.randn(70, 96, generator=_gen(61))
    w = torch.randn(48, 96, generator=_gen(62)) / 10
    r = torch.randn(70, 48, generator=_gen(63))
    got = triton_run(_gemm_residual, x, w, r, kernel)
    _close(got, r.double() + x.double() @ w.double().t())
    assert torch.equal(triton_run(_gemm_residual, x[9:12].contiguous(), w, r[9:12].contiguous(), kernel), got[9:12])


def test_the_norm_added_to_the_residual_is_bitwise_the_norm_then_the_add(triton_run: TritonRunner) -> None:
    x = torch.randn(33, 96, generator=_gen(64)) * 4
    w = torch.randn(96, generator=_gen(65))
    r = torch.randn(33, 96, generator=_gen(66))
    got = triton_run(_norm_add, x, w, r)
    assert torch.equal(got, r + triton_run(rms_norm_triton, x, w, 1e-6, 1.0))
    assert torch.equal(triton_run(_norm_add, x[4:5].contiguous(), w, r[4:5].contiguous()), got[4:5])
