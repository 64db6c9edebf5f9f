"""Questions per second of the engine against two transformers baselines, measured in one run.

    python bench/engine_bench.py [--model smollm2-135m] [--n 20] [--questions 56] [--quick] [--profile]

Workload: the first ``--n`` articles of ``../shared/data/bbc_news/dev.jsonl`` (file order, a fixed
pseudo-random order) whose text has 300–600 words, times every question of
``bench/packs/bbc56.yaml`` (56 questions; ``--questions K`` keeps the first K). The same model, the
same messages, fp32 on the CPU, for:

- **engine**: ``Engine.prepare`` + ``Engine.run`` over all the articles at once (the preamble's
  keys/values are computed when the engine loads, as in service, and are not timed).
- **(a) one prompt per question**: transformers, one forward of the whole prompt
  (preamble + article + question) per question, no cache, logits of the last position only
  (``logits_to_keep=1``); nothing batched across questions. Its cost per question is the cost of a
  whole prompt, so by default it asks only ``--a-per-article`` (1) question per article, spread
  over the pack by a fixed shuffle; its rate is questions asked / seconds (``0`` = ask them all).
- **(b) article KV cache reused (prefix caching)**: transformers, one forward of
  preamble + article with ``use_cache=True``, then per question only the question's tokens against
  that cache, cropped back after each question (copied instead when a layer cannot be cropped,
  e.g. sliding-window layers).

Each baseline tokenizes ``preamble + prompt(article) + question(q)`` as one string, as the score is
defined (``docs/structures.md``); a choice's tokens are ``tokens(full + answer_prefix + label)``
minus ``tokens(full)``; a multi-token choice costs extra forwards over the cache of ``full``.

Printed: questions/s of each, the ratios engine/(a) and engine/(b), the largest |Δprobability|
between the engine and each baseline (and how many answers agree), model FLOPs and achieved FLOP/s
of each against this machine's fp32 matmul peak (``torch.mm`` 2048×2048×2048, best of 3, measured
at the start and the end of the run; the higher is used). The FLOP formula is printed with the
table. On a shared CPU the absolute numbers move with the load (printed); the ratios less so.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import dataclasses
import inspect
import io
import json
import math
import os
import pstats
import random
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from spinf_stream.engine import Engine, Message  # noqa: E402
from spinf_stream.engine.layout import plan_passes  # noqa: E402
from spinf_stream.engine.segment import PreparedMessage  # noqa: E402
from spinf_stream.packs import ExpandedQuestion, Pack, QuestionSpec, load_pack  # noqa: E402
from spinf_stream.engine.results import ErrorRecord  # noqa: E402

DATA = Path(os.environ.get("SPINF_DATA_DIR", REPO.parent / "shared" / "data")) / "bbc_news" / "dev.jsonl"
DEFAULT_PACK = REPO / "bench" / "packs" / "bbc56.yaml"

FORMULA = (
    "model FLOPs = 2 x P x T  +  sum over layers of 4 x Hq x D x (keys each fed token attends to,\n"
    "  capped by the layer's window)  +  2 x hidden x vocab x R;  P = non-embedding parameters\n"
    "  (layer weights and norms), T = tokens fed, R = rows whose logits are computed (engine: read\n"
    "  rows; transformers: 1 per forward with logits_to_keep=1). Useful work only: padding rows,\n"
    "  masked-out attention scores, softmax/norm/rotary and the engine's preamble prefill (done at\n"
    "  load) are not counted. Achieved FLOP/s = model FLOPs / wall seconds of the timed section."
)


# ------------------------------------------------------------------------------------ inputs


def select_articles(path: Path, n: int, min_words: int, max_words: int) -> list[dict[str, Any]]:
    out = []
    if not path.is_file():
        raise SystemExit(
            f"engine_bench: no articles at {path}: it reads bbc_news/dev.jsonl of the data folder "
            "(../shared/data beside the clone, or SPINF_DATA_DIR=/path/to/data), or --data FILE"
        )
    with path.open(encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if min_words <= len(rec["text"].split()) <= max_words:
                out.append(rec)
                if len(out) == n:
                    break
    if len(out) < n:
        raise SystemExit(f"only {len(out)} articles of {min_words}-{max_words} words in {path}")
    return out


def limit_pack(pack: Pack, k: int) -> Pack:
    """The pack with only its first ``k`` expanded questions (as plain questions)."""
    qs = pack.expand()[:k]
    esc = lambda s: s.replace("{", "{{").replace("}", "}}")  # noqa: E731 - expanded text is literal
    specs = tuple(QuestionSpec(id=esc(q.id), text=esc(q.text), choices=q.choices) for q in qs)
    return Pack.model_validate({**pack.model_dump(), "questions": [s.model_dump() for s in specs]})


# ------------------------------------------------------------------------------------- FLOPs


@dataclasses.dataclass
class FlopModel:
    params: int  # non-embedding parameters
    heads: int
    head_dim: int
    hidden: int
    vocab: int
    windows: dict[int | None, int]  # window -> number of layers with it

    @classmethod
    def of(cls, engine: Engine) -> FlopModel:
        dec = engine.decoder
        params = dec.final_norm.numel()
        for lw in dec.layers:
            for f in dataclasses.fields(lw):
                t = getattr(lw, f.name)
                if isinstance(t, torch.Tensor):
                    params += t.numel()
        s = dec.spec
        windows: dict[int | None, int] = {}
        for ls in s.layers:
            windows[ls.window] = windows.get(ls.window, 0) + 1
        return cls(params, s.num_heads, s.head_dim, s.hidden_size, s.vocab_size, windows)

    def attention(self, keys: Sequence[int]) -> float:
        total = 0.0
        for w, n_layers in self.windows.items():
            seen = sum(keys) if w is None else sum(min(k, w) for k in keys)
            total += n_layers * 4.0 * self.heads * self.head_dim * seen
        return total

    def flops(self, tokens: int, keys: Sequence[int], head_rows: int) -> float:
        assert tokens == len(keys)
        return 2.0 * self.params * tokens + self.attention(keys) + 2.0 * self.hidden * self.vocab * head_rows


@dataclasses.dataclass
class Tally:
    questions: int = 0
    seconds: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    forwards: int = 0

    def add(self, fm: FlopModel, keys: list[int], head_rows: int) -> None:
        self.tokens += len(keys)
        self.flops += fm.flops(len(keys), keys, head_rows)
        self.forwards += 1


def engine_tally(fm: FlopModel, prepared: Sequence[PreparedMessage], budget: int) -> Tally:
    t = Tally()
    for works in plan_passes(prepared, budget):
        keys: list[int] = []
        rows = 0
        for w in works:
            m = w.message
            p, n = m.prefix_len, len(m.content)
            keys.extend(p + i + 1 for i in range(n))
            for bi in w.branches:
                b = m.branches[bi]
                keys.extend(p + n + d + 1 for d in b.depths)  # a tree node sees its ancestors and itself
                rows += len(b.reads)
        t.add(fm, keys, rows)
    return t


def matmul_peak(size: int = 2048, repeat: int = 3) -> float:
    a = torch.randn(size, size, dtype=torch.float32)
    b = torch.randn(size, size, dtype=torch.float32)
    torch.mm(a, b)  # warm-up
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


# ------------------------------------------------------------------------- transformers side


class HF:
    """The transformers model with the helpers both baselines share."""

    def __init__(self, path: Path, pack: Pack, attn: str | None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

        kw: dict[str, Any] = {}
        if path.is_file():  # a .gguf
            kw["gguf_file"] = path.name
            path = path.parent
        if attn:
            kw["attn_implementation"] = attn
        self.tok = AutoTokenizer.from_pretrained(str(path), **{k: v for k, v in kw.items() if k == "gguf_file"})
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kw).eval()
        self.DynamicCache = DynamicCache
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.pack = pack
        self.questions = pack.expand()
        self.q_texts = [pack.render_question(q) for q in self.questions]

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=True)["input_ids"]

    def forward(self, ids: list[int], past: int, cache: Any, keep: int) -> torch.Tensor:
        """Feed ``ids`` at positions ``past..``; log-softmax of the last ``keep`` positions ``[keep, V]``."""
        kw: dict[str, Any] = {"use_cache": cache is not None}
        if cache is not None:
            kw[self.cache_kw] = cache
        out = self.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(past, past + len(ids))[None],
            logits_to_keep=keep,
            **kw,
        )
        return torch.log_softmax(out.logits[0, -keep:].float(), dim=-1)

    def choice_tokens(self, full: str, f_ids: list[int], q: ExpandedQuestion) -> list[list[int]]:
        out = []
        for label in q.choices:
            ext = self.encode(full + self.pack.answer_prefix + label)
            if ext[: len(f_ids)] != f_ids or len(ext) == len(f_ids):
                raise SystemExit(f"choice {label!r} of {q.id!r} does not extend the prompt's tokens")
            out.append(ext[len(f_ids):])
        return out

    def can_crop(self, cache: Any) -> bool:
        return all(type(layer).__name__ == "DynamicLayer" for layer in getattr(cache, "layers", [None]))

    def read_choices(
        self, lp_last: torch.Tensor, conts: list[list[int]], f_len: int, cache: Any, fm: FlopModel, t: Tally,
    ) -> list[float]:
        """Logprob of each choice: first token from ``lp_last``; the rest over ``cache`` (of ``full``)."""
        out = []
        for cont in conts:
            lp = float(lp_last[cont[0]])
            if len(cont) > 1:
                c = cache if self.can_crop(cache) else copy.deepcopy(cache)
                more = self.forward(cont[:-1], f_len, c, keep=len(cont) - 1)
                t.add(fm, [f_len + i + 1 for i in range(len(cont) - 1)], len(cont) - 1)
                lp += sum(float(more[i, tok]) for i, tok in enumerate(cont[1:]))
                if c is cache:
                    cache.crop(-(len(cont) - 1))
            out.append(lp)
        return out

    # -- (a) -----------------------------------------------------------------------------------

    def ask_separately(self, fields: dict[str, str], qis: Sequence[int], fm: FlopModel, t: Tally) -> dict[int, list[float]]:
        content = self.pack.preamble + self.pack.render_prompt(fields)
        out = {}
        for qi in qis:
            q = self.questions[qi]
            full = content + self.q_texts[qi]
            f_ids = self.encode(full)
            conts = self.choice_tokens(full, f_ids, q)
            multi = any(len(c) > 1 for c in conts)
            cache = self.DynamicCache(config=self.model.config) if multi else None
            lp = self.forward(f_ids, 0, cache, keep=1)[-1]
            t.add(fm, list(range(1, len(f_ids) + 1)), 1)
            out[qi] = self.read_choices(lp, conts, len(f_ids), cache, fm, t)
            t.questions += 1
        return out

    # -- (b) -----------------------------------------------------------------------------------

    def article_cache(self, fields: dict[str, str], fm: FlopModel, t: Tally) -> tuple[str, list[int], Any]:
        """One forward of preamble + article with a cache: (its text, its tokens, the cache)."""
        content = self.pack.preamble + self.pack.render_prompt(fields)
        c_ids = self.encode(content)
        base = self.DynamicCache(config=self.model.config)
        self.forward(c_ids, 0, base, keep=1)
        t.add(fm, list(range(1, len(c_ids) + 1)), 1)
        return content, c_ids, base

    def ask_with_cache(self, fields: dict[str, str], qis: Sequence[int], fm: FlopModel, t: Tally,
                       article: tuple[str, list[int], Any] | None = None) -> dict[int, list[float]]:
        """Each question over the article's cache (``article``: from :meth:`article_cache`, else
        computed here); the cache is left as it was."""
        content, c_ids, base = article or self.article_cache(fields, fm, t)
        crop = self.can_crop(base)
        out = {}
        for qi in qis:
            q = self.questions[qi]
            full = content + self.q_texts[qi]
            f_ids = self.encode(full)
            conts = self.choice_tokens(full, f_ids, q)
            common = 0
            n = min(len(c_ids), len(f_ids) - 1)
            while common < n and c_ids[common] == f_ids[common]:
                common += 1
            if crop and common == len(c_ids):
                cache = base  # extend in place, crop back below
            else:  # the seam re-tokenized, or a layer that cannot be cropped: copy
                cache = copy.deepcopy(base)
                if common < len(c_ids):
                    cache.crop(-(len(c_ids) - common))
            new = f_ids[common:]
            lp = self.forward(new, common, cache, keep=1)[-1]
            t.add(fm, [common + i + 1 for i in range(len(new))], 1)
            out[qi] = self.read_choices(lp, conts, len(f_ids), cache, fm, t)
            if cache is base:
                base.crop(-len(new))
            t.questions += 1
        return out


# ----------------------------------------------------------------------------------- helpers


def softmax(lps: Sequence[float]) -> list[float]:
    top = max(lps)
    e = [math.exp(x - top) for x in lps]
    z = math.fsum(e)
    return [x / z for x in e]


@dataclasses.dataclass
class Agreement:
    max_dprob: float = 0.0
    max_dlogprob: float = 0.0
    pairs: int = 0
    same_answer: int = 0

    def add(self, ref: list[float], other_lps: list[float]) -> None:
        pa, pb = softmax(ref), softmax(other_lps)
        self.max_dprob = max(self.max_dprob, max(abs(x - y) for x, y in zip(pa, pb)))
        self.max_dlogprob = max(self.max_dlogprob, max(abs(x - y) for x, y in zip(ref, other_lps)))
        self.pairs += 1
        self.same_answer += int(max(range(len(pa)), key=pa.__getitem__) == max(range(len(pb)), key=pb.__getitem__))

    def line(self, name: str) -> str:
        if not self.pairs:
            return f"  {name}: (not run)"
        return (
            f"  {name}: max |dprobability| {self.max_dprob:.2e}, max |dlogprob| {self.max_dlogprob:.2e}, "
            f"same answer {self.same_answer}/{self.pairs} (article, question) pairs"
        )


def fmt_row(name: str, t: Tally, peak: float, note: str = "") -> str:
    if not t.questions:
        return f"{name:<40} {'(not run)':>9}"
    qps = t.questions / t.seconds
    fps = t.flops / t.seconds
    return (
        f"{name:<40} {t.questions:>9} {t.seconds:>9.1f} {qps:>9.2f} {t.tokens:>10} {t.forwards:>8} "
        f"{t.flops / 1e9:>10.1f} {fps / 1e9:>8.2f} {100 * fps / peak:>6.1f}%{note}"
    )


def profile_engine(engine: Engine, prepared: Sequence[PreparedMessage], top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    print(f"\nprofile: engine.run on {len(prepared)} article(s) — torch ops by self CPU time (top {top})")
    pr = cProfile.Profile()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        pr.enable()
        engine.run(prepared)
        pr.disable()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    print(f"same, grouped by input shapes (top {top})")
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=30, max_shapes_column_width=70))
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(r"spinf_stream", top)
    print(f"Python functions of spinf_stream by cumulative time (cProfile, top {top})")
    print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip())[-(top + 3) * 120 :])


# -------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="short name, HF directory or .gguf file (default smollm2-135m)")
    ap.add_argument("--pack", default=str(DEFAULT_PACK), help="pack name or .yaml path (default bench/packs/bbc56.yaml)")
    ap.add_argument("--data", type=Path, default=DATA, help="JSONL with title and text (default ../shared/data/bbc_news/dev.jsonl)")
    ap.add_argument("--n", type=int, default=20, help="articles (default 20)")
    ap.add_argument("--min-words", type=int, default=300)
    ap.add_argument("--max-words", type=int, default=600)
    ap.add_argument("--questions", type=int, default=0, help="keep only the pack's first K questions (0 = all)")
    ap.add_argument("--a-per-article", type=int, default=1, help="questions asked per article by (a) (0 = all; default 1)")
    ap.add_argument("--token-budget", type=int, default=16_384, help="engine tokens per forward pass")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0 = auto: torch's default, or 1 when the load average already exceeds the CPUs)")
    ap.add_argument("--attn", default=None, help="transformers attn_implementation (default: its own, sdpa)")
    ap.add_argument("--skip-a", action="store_true", help="do not run (a)")
    ap.add_argument("--skip-b", action="store_true", help="do not run (b)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up of each method")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 articles (and 1 question per article for (a))")
    ap.add_argument("--profile", action="store_true", help="after timing, profile engine.run on up to 2 articles")
    ap.add_argument("--profile-top", type=int, default=10, help="rows of each profile table (default 10)")
    ap.add_argument("--json", type=Path, help="append the results as one JSON line to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.a_per_article = 2, 1
    threads_note = ""
    if args.threads:
        torch.set_num_threads(args.threads)
    elif os.getloadavg()[0] >= (os.cpu_count() or 1) and torch.get_num_threads() > 1:
        # Oversubscribed: a multi-threaded op waits for descheduled threads at every barrier, which
        # costs milliseconds per small op and buries the comparison. One thread is the fair setting.
        torch.set_num_threads(1)
        threads_note = f" (auto: load average {os.getloadavg()[0]:.1f} >= {os.cpu_count()} CPUs; --threads N to override)"
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_grad_enabled(False)

    load0 = os.getloadavg()
    peak0 = matmul_peak()

    pack = load_pack(args.pack)
    if args.questions:
        pack = limit_pack(pack, args.questions)
    articles = select_articles(args.data, args.n, args.min_words, args.max_words)
    messages = [Message(id=a["id"], fields={f: a[f] for f in pack.fields}) for a in articles]

    t0 = time.perf_counter()
    # the engine's compute workers: as many as the torch threads of the baselines
    engine = Engine.load(model=args.model, pack=pack, token_budget=args.token_budget, threads=torch.get_num_threads())
    load_s = time.perf_counter() - t0
    fm = FlopModel.of(engine)
    nq = len(engine.questions)

    from spinf_stream.models.resolve import resolve

    path = Path(args.model) if Path(args.model).exists() else Path(resolve(args.model).path)
    hf = HF(path, pack, args.attn)

    if not args.no_warmup:  # first-call costs (allocator, oneDNN primitives) out of the timings
        warm = Message(id="warm-up", fields={f: "Warm-up." for f in pack.fields})
        engine.score([warm])
        hf.forward(hf.encode("Warm-up text for the model."), 0, None, keep=1)

    # -- engine ------------------------------------------------------------------------------
    eng = Tally()
    t0 = time.perf_counter()
    items = engine.prepare(messages)
    t1 = time.perf_counter()
    bad = [p for p in items if isinstance(p, ErrorRecord)]
    if bad:
        raise SystemExit(f"engine rejected {len(bad)} article(s): {bad[0]}")
    prepared = [p for p in items if isinstance(p, PreparedMessage)]
    records = engine.run(prepared)
    eng.seconds = time.perf_counter() - t0
    computed, useful = engine.last_run.tokens_computed, sum(p.n_tokens for p in prepared)
    prep_s = t1 - t0
    tally = engine_tally(fm, prepared, args.token_budget)
    eng.tokens, eng.flops, eng.forwards = tally.tokens, tally.flops, tally.forwards
    eng.questions = nq * len(messages)
    eng_lps = [
        [[rec.scores[q.id].choices[c].logprob for c in q.choices] for q in engine.questions] for rec in records
    ]

    # -- (b) ---------------------------------------------------------------------------------
    tb = Tally()
    b_lps: list[dict[int, list[float]]] = []
    if not args.skip_b:
        t0 = time.perf_counter()
        for m in messages:
            b_lps.append(hf.ask_with_cache(dict(m.fields), range(nq), fm, tb))
        tb.seconds = time.perf_counter() - t0

    # -- (a) ---------------------------------------------------------------------------------
    ta = Tally()
    a_lps: list[dict[int, list[float]]] = []
    k = nq if args.a_per_article <= 0 else min(args.a_per_article, nq)
    order = list(range(nq))
    random.Random(0).shuffle(order)
    if not args.skip_a:
        t0 = time.perf_counter()
        for i, m in enumerate(messages):
            qis = sorted(order[(i * k + j) % nq] for j in range(k))
            a_lps.append(hf.ask_separately(dict(m.fields), qis, fm, ta))
        ta.seconds = time.perf_counter() - t0

    peak = max(peak0, matmul_peak())
    load1 = os.getloadavg()

    # -- agreement ---------------------------------------------------------------------------
    e_a, e_b, b_a = Agreement(), Agreement(), Agreement()
    for i in range(len(messages)):
        if a_lps:
            for qi, lps in a_lps[i].items():
                e_a.add(lps, eng_lps[i][qi])
                if b_lps:
                    b_a.add(lps, b_lps[i][qi])
        if b_lps:
            for qi, lps in b_lps[i].items():
                e_b.add(lps, eng_lps[i][qi])
    topic_ok = None
    if "topic" in [q.id for q in engine.questions]:
        topic_ok = sum(r.scores["topic"].answer == a["label"] for r, a in zip(records, articles))

    # -- table -------------------------------------------------------------------------------
    c_tokens = [len(p.content) + p.prefix_len for p in prepared]
    b_tokens = [sum(len(b) for b in p.branches) / len(p.branches) for p in prepared]
    words = [len(a["text"].split()) for a in articles]
    print()
    print(
        f"spinf-stream engine bench: model {engine.model_name}, fp32, CPU, {torch.get_num_threads()} threads{threads_note}, "
        f"torch {torch.__version__}; engine numerics: {engine.model_info.numerics.library}, {engine.model_info.numerics.tiles}"
    )
    print(
        f"workload: {len(messages)} BBC articles of {args.min_words}-{args.max_words} words (mean {sum(words) / len(words):.0f}) "
        f"x pack {pack.name} ({nq} questions); prompt to end of article {sum(c_tokens) / len(c_tokens):.0f} tokens "
        f"on average (preamble {prepared[0].prefix_len} of them, cached by the engine); branch {sum(b_tokens) / len(b_tokens):.1f} tokens"
    )
    print(f"machine: fp32 matmul peak {peak / 1e9:.1f} GFLOP/s (torch.mm 2048^3, best of 3; start {peak0 / 1e9:.1f}); "
          f"load average 1 min {load0[0]:.1f} at start, {load1[0]:.1f} at end, on {os.cpu_count()} CPUs")
    if max(load0[0], load1[0]) >= (os.cpu_count() or 1) and torch.get_num_threads() > 1:
        print(
            "note: the CPU is oversubscribed (load average > CPUs); with several torch threads each small op can\n"
            "      wait milliseconds for a descheduled thread, which penalises many-small-op methods. Try --threads 1."
        )
    print(f"engine: load {load_s:.1f} s (untimed), prepare {prep_s:.2f} s of its total, token budget {args.token_budget}; "
          f"rows computed {computed} = the messages' own tokens {useful} ({computed - useful} padded or recomputed)")
    print()
    hdr = f"{'method':<40} {'questions':>9} {'seconds':>9} {'q/s':>9} {'tokens fed':>10} {'forwards':>8} {'model GFLOP':>10} {'GFLOP/s':>8} {'% peak':>7}"
    print(hdr)
    print("-" * len(hdr))
    print(fmt_row("engine (read once, packed branches)", eng, peak))
    print(fmt_row("(a) transformers, prompt per question", ta, peak, f"  ({k} of {nq} questions per article)" if ta.questions else ""))
    print(fmt_row("(b) transformers, article KV reused", tb, peak))
    print()
    qps = lambda t: t.questions / t.seconds if t.questions else math.nan  # noqa: E731
    ratio_a = qps(eng) / qps(ta) if ta.questions else math.nan
    ratio_b = qps(eng) / qps(tb) if tb.questions else math.nan
    rx = lambda r: "n/a" if math.isnan(r) else f"{r:.2f}x"  # noqa: E731
    print(f"engine / (a) = {rx(ratio_a)} questions/s      engine / (b) = {rx(ratio_b)} questions/s      "
          f"engine model FLOP/s = {100 * eng.flops / eng.seconds / peak:.1f}% of the matmul peak")
    print("agreement (softmax over each question's choices; (a) is the oracle):")
    print(e_a.line("engine vs (a)"))
    print(e_b.line("engine vs (b)"))
    print(b_a.line("(b) vs (a)"))
    if topic_ok is not None:
        print(f"topic question (engine) vs the bbc_news label: {topic_ok}/{len(records)} correct")
    print(FORMULA)

    if args.json:
        result = {
            "model": engine.model_name, "pack": pack.name, "n": len(messages), "questions": nq,
            "peak_gflops": peak / 1e9, "load": [load0[0], load1[0]],
            "engine": dataclasses.asdict(eng), "a": dataclasses.asdict(ta), "b": dataclasses.asdict(tb),
            "engine_over_a": ratio_a, "engine_over_b": ratio_b,
            "engine_peak_fraction": eng.flops / eng.seconds / peak,
            "engine_rows_computed": computed, "engine_rows_useful": useful,
            "max_dprob_engine_a": e_a.max_dprob, "max_dprob_engine_b": e_b.max_dprob,
        }
        with args.json.open("a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")

    if args.profile:
        profile_engine(engine, prepared[:2], args.profile_top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
