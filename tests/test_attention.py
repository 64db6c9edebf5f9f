"""Attention over a packed pass (spinf_stream.models.attention, and the Triton kernel through the
same plan): every query sees exactly its ancestors, and a branch's bits do not depend on its slot,
its chunk, its pass or its neighbours.

Systematic, per the fault report of issue 6: for every family's attention shape (the three real
checkpoints, the GPU check's 12B/8B shapes and the tiny test models), one message with a branch of
every width from 1 to 32 is scored with its branches rotated through every slot, split over
passes with its content carried, and between neighbours; each branch must equal, bitwise, the same
branch scored alone. Values are checked against attention computed from the definition in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from spinf_stream.engine.layout import Work, build_pass
from spinf_stream.models import blocks
from spinf_stream.models.attention import DecodeCarry, DecodeContext, TorchAttention
from spinf_stream.engine.segment import Branch, PreparedMessage

#: name -> (query heads, KV heads, head dim, sliding window or None)
SHAPES = {
    "smollm2-135m": (9, 3, 64, None),
    "qwen2.5-coder-0.5b": (14, 2, 64, None),
    "gemma-3-270m-local": (4, 1, 256, 512),
    "gemma-3-12b-local": (16, 8, 256, 1024),
    "qwen3-8b": (32, 8, 128, None),
    "tiny": (4, 2, 16, None),
    "tiny-window": (4, 2, 16, 24),
}
PREAMBLE = 7
#: target message -> (content tokens, uses the preamble, branch widths, {branch: tokens of its
#: first choice when that choice has several}); "short" keeps every key and slot count below 16,
#: where the BLAS takes other code paths.
TARGETS = {
    "long": (40, True, list(range(1, 33)), {3: 2, 17: 4}),
    "short": (3, False, list(range(1, 8)), {2: 3}),
}


def _branch(question: int, width: int, sub: int = 0) -> Branch:
    """A chain of ``width`` tokens; with ``sub`` > 1, a two-choice trie whose first choice has
    ``sub`` tokens (so ``sub - 1`` inner nodes hang off the chain's last token)."""
    tokens = list(range(100, 100 + width))
    parents = list(range(-1, width - 1))
    depths = list(range(width))
    reads = [width - 1]
    choices: list[tuple[tuple[int, int], ...]] = [((0, 1),), ((0, 2),)]
    if sub > 1:
        prev = width - 1
        path = [(0, 1)]
        for j in range(sub - 1):
            tokens.append(200 + j)
            parents.append(prev)
            depths.append(depths[prev] + 1)
            prev = len(tokens) - 1
            reads.append(prev)
            path.append((len(reads) - 1, 3))
        choices = [tuple(path), ((0, 2),)]
    return Branch(question, tuple(tokens), tuple(parents), tuple(depths), tuple(reads), tuple(choices))


def _message(index: int, content: int, widths: list[int], preamble: bool = True, subs: dict[int, int] | None = None) -> PreparedMessage:
    subs = subs or {}
    branches = tuple(_branch(q, w, subs.get(q, 0)) for q, w in enumerate(widths))
    return PreparedMessage(index, f"m{index}", tuple(range(1, content + 1)), preamble, PREAMBLE if preamble else 0, branches)


@dataclass
class Tokens:
    """q, k, v of one message's tokens, fixed per token whatever pass it lands in."""

    content: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    branches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _tokens(m: PreparedMessage, seed: int, shape: tuple) -> Tokens:
    hq, hkv, d, _ = shape
    g = torch.Generator().manual_seed(seed)

    def qkv(n: int):
        return torch.randn(n, hq, d, generator=g), torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)

    return Tokens(qkv(len(m.content)), [qkv(len(b)) for b in m.branches])


def _run(works: list[Work], toks: dict[int, Tokens], prefix, shape) -> torch.Tensor:
    """Attention of one pass built from ``works``; returns ``out [T, Hq, D]`` and the layout."""
    hq, hkv, d, window = shape
    layout = build_pass(works, PREAMBLE)
    T = layout.n_tokens
    q, k, v = torch.empty(T, hq, d), torch.empty(T, hkv, d), torch.empty(T, hkv, d)
    carried = []
    for w, plan in zip(works, layout.messages):
        t = toks[w.message.index]
        if w.with_content:
            c0 = plan.content_start
            for dst, src in zip((q, k, v), t.content):
                dst[c0 : c0 + len(src)] = src
        else:
            carried.append((t.content[1], t.content[2]))
        for bi, bp in zip(w.branches, plan.branches):
            for dst, src in zip((q, k, v), t.branches[bi]):
                dst[bp.start : bp.start + len(src)] = src
    attend = TorchAttention(layout)
    out = attend(q, k, v, prefix, carried, scale=d**-0.5, window=window, softcap=None)
    return out, layout


def _branch_out(out: torch.Tensor, works: list[Work], layout, message: int) -> dict[int, torch.Tensor]:
    got = {}
    for w, plan in zip(works, layout.messages):
        if w.message.index == message:
            for bi, bp in zip(w.branches, plan.branches):
                got[bi] = out[bp.start : bp.start + len(w.message.branches[bi])]
    return got


def _dense_branch(t: Tokens, prefix, bi: int, m: PreparedMessage, shape) -> torch.Tensor:
    """One branch's attention from the definition, float64: every query over the preamble, the
    content and its own ancestors, at logical positions, one softmax."""
    hq, hkv, d, window = shape
    b = m.branches[bi]
    bq, bk, bv = (x.double() for x in t.branches[bi])
    keys, values = t.content[1].double(), t.content[2].double()
    if prefix is not None:
        keys = torch.cat([prefix[0].double(), keys])
        values = torch.cat([prefix[1].double(), values])
    n_ctx = keys.shape[0]
    g = hq // hkv
    out = torch.empty(len(b), hq, d, dtype=torch.float64)
    for i in range(len(b)):
        anc = []
        a = i
        while a >= 0:
            anc.append(a)
            a = b.parents[a]
        qpos = n_ctx + b.depths[i]
        kk = torch.cat([keys, bk[anc]])
        vv = torch.cat([values, bv[anc]])
        kpos = torch.tensor(list(range(n_ctx)) + [n_ctx + b.depths[a] for a in anc])
        ok = torch.ones(len(kpos), dtype=torch.bool) if window is None else kpos > qpos - window
        for h in range(hq):
            s = (kk[:, h // g] @ bq[i, h]) / math.sqrt(d)
            p = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=0)
            out[i, h] = p @ vv[:, h // g]
    return out


@pytest.fixture(scope="module", params=[(s, t) for s in SHAPES for t in TARGETS], ids=lambda p: f"{p[0]}-{p[1]}")
def setup(request):
    name, which = request.param
    shape = SHAPES[name]
    hq, hkv, d, _ = shape
    g = torch.Generator().manual_seed(7)
    prefix = (torch.randn(PREAMBLE, hkv, d, generator=g), torch.randn(PREAMBLE, hkv, d, generator=g))
    content, with_preamble, widths, subs = TARGETS[which]
    target = _message(0, content, widths, preamble=with_preamble, subs=subs)
    neighbours = [_message(1, 23, [5, 9, 2]), _message(2, 61, [12, 1], preamble=False)]
    toks = {0: _tokens(target, 0, shape), 1: _tokens(neighbours[0], 1, shape), 2: _tokens(neighbours[1], 2, shape)}
    alone = {}
    for bi in range(len(widths)):  # each branch alone: its own pass, the content carried
        works = [Work(target, (bi,), 0, with_content=False)]
        out, layout = _run(works, toks, prefix, shape)
        alone[bi] = _branch_out(out, works, layout, 0)[bi]
    return request.param, shape, prefix, target, neighbours, toks, alone


def test_a_branch_alone_matches_attention_from_the_definition(setup):
    name, shape, prefix, target, _, toks, alone = setup
    for bi in sorted({0, 2, 3, 17, len(target.branches) - 1} & set(range(len(target.branches)))):
        want = _dense_branch(toks[0], prefix if target.use_preamble else None, bi, target, shape)
        torch.testing.assert_close(alone[bi].double(), want, rtol=1e-5, atol=1e-5)


def test_every_branch_is_bitwise_the_same_in_every_slot(setup):
    """The message's branches rotated through every slot of one pass (content computed there)."""
    name, shape, prefix, target, _, toks, alone = setup
    n = len(target.branches)
    for r in range(n):
        order = tuple((i + r) % n for i in range(n))
        # A rotated message: the same branches in another order (its longest branch is the same).
        rotated = PreparedMessage(
            0, "m0", target.content, target.use_preamble, target.prefix_len, tuple(target.branches[i] for i in order)
        )
        rtoks = {0: Tokens(toks[0].content, [toks[0].branches[i] for i in order])}
        works = [Work(rotated, tuple(range(n)), 0)]
        out, layout = _run(works, rtoks, prefix, shape)
        got = _branch_out(out, works, layout, 0)
        for slot, bi in enumerate(order):
            assert torch.equal(got[slot], alone[bi]), f"{name}: width {len(target.branches[bi])} differs in slot {slot}"


def test_branches_split_over_passes_and_between_neighbours_are_bitwise_the_same(setup):
    name, shape, prefix, target, neighbours, toks, alone = setup
    n = len(target.branches)
    layouts = [
        # content computed with every third branch, the rest in two later passes (carried content)
        [[Work(target, tuple(range(0, n, 3)), 0, keep_kv=True)],
         [Work(target, tuple(range(1, n, 3)), 0, with_content=False)],
         [Work(target, tuple(range(2, n, 3)), 0, with_content=False)]],
        # between two neighbours, at an odd offset, all branches
        [[Work(neighbours[0], (0, 1, 2), 1), Work(target, tuple(range(n)), 0), Work(neighbours[1], (0, 1), 2)]],
        # carried content beside a neighbour computed in the same pass
        [[Work(neighbours[1], (1,), 2), Work(target, tuple(range(n - 1, -1, -2)), 0, with_content=False)]],
    ]
    for case, passes in enumerate(layouts):
        seen = {}
        for works in passes:
            out, layout = _run(works, toks, prefix, shape)
            seen.update(_branch_out(out, works, layout, 0))
        for bi, got in seen.items():
            assert torch.equal(got, alone[bi]), f"{name} case {case}: width {len(target.branches[bi])} differs"


def test_content_rows_do_not_depend_on_the_pass(setup):
    name, shape, prefix, target, neighbours, toks, _ = setup
    first = [Work(target, (0,), 0)]
    out_a, lay_a = _run(first, toks, prefix, shape)
    mixed = [Work(neighbours[0], (0, 1, 2), 1), Work(target, tuple(range(len(target.branches))), 0)]
    out_b, lay_b = _run(mixed, toks, prefix, shape)
    ca, cb = lay_a.messages[0].content_start, lay_b.messages[1].content_start
    n = len(target.content)
    assert torch.equal(out_a[ca : ca + n], out_b[cb : cb + n])


# --------------------------------------------------------------------------- the CPU rules the attention relies on


@pytest.mark.parametrize("k", [16, 64, 256])
@pytest.mark.parametrize("n", [16, 48, 528])
def test_gemm_rows_are_independent_of_m_and_place_when_m_and_n_are_16_or_more(k, n):
    """The BLAS rule the CPU path is built on (models/attention.py): with M >= 16 and N >= 16, a
    row's bits do not depend on how many rows share the GEMM nor on where the row sits."""
    g = torch.Generator().manual_seed(k + n)
    x, w = torch.randn(300, k, generator=g), torch.randn(3, k, n, generator=g)
    seen = {}
    for m in (16, 17, 33, 100, 256):
        for off in (0, 5, 40):
            y = torch.bmm(x[off : off + m].clone().expand(3, m, k).contiguous(), w)
            for i in range(m):
                ref = seen.setdefault(off + i, y[:, i].clone())
                assert torch.equal(ref, y[:, i]), (m, off, i)


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu"])
def test_activations_give_each_element_the_same_bits_whatever_the_tensor_size(act):
    """torch's F.silu/F.gelu take a scalar path for a size-dependent tail (different last bits);
    blocks.activation must not."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5000, generator=g) * 4
    full = blocks.activation(x, act)
    for n in range(1, 70):
        for s in (0, 3, 1001, 4000):
            assert torch.equal(blocks.activation(x[s : s + n].clone(), act), full[s : s + n])


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu"])
def test_activations_match_torch_within_a_few_ulp(act):
    import torch.nn.functional as F

    x = torch.linspace(-12, 12, 10001)
    want = {"silu": F.silu(x), "gelu_pytorch_tanh": F.gelu(x, approximate="tanh"), "gelu": F.gelu(x)}[act]
    torch.testing.assert_close(blocks.activation(x, act), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_equals_its_formula_bitwise_and_row_by_row(offset):
    """blocks.rms_norm takes torch's fused F.rms_norm in fp32: the same bits as the formula (the
    definition), whatever the number of rows around a row."""
    g = torch.Generator().manual_seed(1)
    for h in (16, 576, 896, 3840):
        x, w = torch.randn(120, h, generator=g) * 3, torch.randn(h, generator=g)
        xf = x.double()
        formula = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * (offset + w)
        full = blocks.rms_norm(x, w, 1e-6, offset)
        assert torch.equal(full, formula)
        want = xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * (offset + w.double())
        torch.testing.assert_close(full.double(), want, rtol=1e-5, atol=1e-5)
        for t in (1, 2, 7, 33):
            assert torch.equal(blocks.rms_norm(x[5 : 5 + t].clone(), w, 1e-6, offset), full[5 : 5 + t])


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["fused", "softcap"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_a_decode_row_matches_the_definition_and_is_bitwise_the_same_in_any_pass(name, softcap):
    """A decode step's row (``Work.decode``: one token after carried content, question and written
    tokens, given as two pieces): its attention from the definition (float64), and bitwise equal
    alone, beside other decode rows and in another order; short (keys below 16) and long cases."""
    hq, hkv, d, window = SHAPES[name]
    gen = torch.Generator().manual_seed(3)
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    prefix = (rand(PREAMBLE, hkv, d), rand(PREAMBLE, hkv, d))
    cases = []
    for i, (content, history, preamble) in enumerate([(40, 13, True), (3, 1, False), (700, 20, True)]):
        tip = Branch(0, (5,), (-1,), (0,), (0,), ())
        m = PreparedMessage(i, f"d{i}", tuple(range(1, content + history + 1)), preamble, PREAMBLE if preamble else 0, (tip,))
        pieces = ((rand(content, hkv, d), rand(content, hkv, d)), (rand(history, hkv, d), rand(history, hkv, d)))
        cases.append((m, pieces, (rand(hq, d), rand(hkv, d), rand(hkv, d))))

    def run(order: list[int]) -> dict[int, torch.Tensor]:
        works = [Work(cases[i][0], (0,), i, with_content=False, decode=True) for i in order]
        layout = build_pass(works, PREAMBLE)
        q, k, v = torch.zeros(len(order), hq, d), torch.zeros(len(order), hkv, d), torch.zeros(len(order), hkv, d)
        rows = [mp.branches[0].start for mp in layout.messages]
        for row, i in zip(rows, order):
            q[row], k[row], v[row] = cases[i][2]
        out = TorchAttention(layout)(q, k, v, prefix, [cases[i][1] for i in order], scale=d**-0.5, window=window, softcap=softcap)
        return {i: out[row].clone() for row, i in zip(rows, order)}

    alone = {i: run([i])[i] for i in range(len(cases))}
    for order in ([0, 1, 2], [2, 0, 1]):
        got = run(order)
        assert all(torch.equal(got[i], alone[i]) for i in range(len(cases))), order
    g = hq // hkv
    for i, (m, ((ck, cv), (hk, hv)), (q1, k1, v1)) in enumerate(cases):
        pre_k, pre_v = (prefix if m.use_preamble else (torch.zeros(0, hkv, d), torch.zeros(0, hkv, d)))
        keys = torch.cat([pre_k, ck, hk, k1[None]]).double()
        values = torch.cat([pre_v, cv, hv, v1[None]]).double()
        n = keys.shape[0]
        ok = torch.ones(n, dtype=torch.bool) if window is None else torch.arange(n) > (n - 1) - window
        want = torch.empty(hq, d, dtype=torch.float64)
        for h in range(hq):
            s = (keys[:, h // g] @ q1[h].double()) / math.sqrt(d)
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            want[h] = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=0) @ values[:, h // g]
        assert torch.allclose(alone[i].double(), want, atol=2e-5), (name, i, (alone[i].double() - want).abs().max())


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["fused", "softcap"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_decode_rows_read_from_a_kept_context_are_bitwise_those_of_fresh_keys(name, softcap):
    """A message's decode context (its preamble and content laid out once, kept across steps
    and shared by its extraction questions in one pass) gives every row the bits of a row whose
    keys are laid out afresh, step after step."""
    hq, hkv, d, window = SHAPES[name]
    gen = torch.Generator().manual_seed(5)
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    prefix = (rand(PREAMBLE, hkv, d), rand(PREAMBLE, hkv, d))
    content = (rand(300, hkv, d), rand(300, hkv, d))
    branches = {0: [rand(6, hkv, d), rand(6, hkv, d)], 1: [rand(11, hkv, d), rand(11, hkv, d)]}  # two questions
    context = DecodeContext(room=11 + 8 + 1)
    for step in range(4):
        works, carries, fresh, rows_qkv = [], [], [], []
        for slot, (bk, bv) in branches.items():
            tip = Branch(slot, (5,), (-1,), (0,), (0,), ())
            m = PreparedMessage(0, "m", tuple(range(1, 300 + bk.shape[0] + 1)), True, PREAMBLE, (tip,))
            works.append(Work(m, (0,), slot, with_content=False, decode=True))
            carries.append(DecodeCarry(content, (bk, bv), context, 0))
            fresh.append((content, (bk, bv)))
            rows_qkv.append((rand(hq, d), rand(hkv, d), rand(hkv, d)))
        layout = build_pass(works, PREAMBLE)
        q, k, v = torch.zeros(2, hq, d), torch.zeros(2, hkv, d), torch.zeros(2, hkv, d)
        rows = [mp.branches[0].start for mp in layout.messages]
        for row, (q1, k1, v1) in zip(rows, rows_qkv):
            q[row], k[row], v[row] = q1, k1, v1
        kw = dict(scale=d**-0.5, window=window, softcap=softcap)
        kept = TorchAttention(layout)(q, k, v, prefix, carries, **kw).clone()
        alone = TorchAttention(layout)(q, k, v, prefix, fresh, **kw)
        assert torch.equal(kept, alone), (name, step)
        for slot, (_, k1, v1) in zip(branches, rows_qkv):  # the row's key joins its branch for the next step
            branches[slot] = [torch.cat((branches[slot][0], k1[None])), torch.cat((branches[slot][1], v1[None]))]
