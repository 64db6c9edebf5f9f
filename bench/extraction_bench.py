"""The engine against transformers (b) on choice and extraction questions, measured in one run.

    python bench/extraction_bench.py [--model smollm2-135m] [--n 10] [--quick]

Workload: the first ``--n`` BBC articles of 300–600 words (``engine_bench.py``'s selection) times
``bench/packs/bbc56.yaml``'s 56 choice questions plus the 4 extraction questions of ``EXTRA`` below
(the company, the person quoted, a percentage change, an amount of money). The same model, the
same messages, fp32 on the CPU, for:

- **engine**: ``Engine.prepare`` + ``Engine.run`` over all the articles at once: one read per
  article, then decode steps over every open extraction of the batch.
- **(b) article KV cache reused**: transformers, one forward of preamble + article with
  ``use_cache=True``; each choice question's tokens against that cache (``engine_bench.py``'s
  (b)); then one ``generate`` call per extraction question on a copy of that cache (the way a
  user extracts with a guided-decoding library today): greedy, a logits processor allowing only
  the tokens the question's kind allows (the engine's own precomputed token grammar, so both
  decode the same language), ending at the grammar's stop tokens or ``max_tokens``.

Printed: questions/s and extracted tokens/s of each, engine/(b) for the whole pack, the engine's
decode passes against its longest extraction, how many extractions agree (same answer), and the
load average at the start and the end. Target (issue 19): engine/(b) >= 2.5x on an idle CPU.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from engine_bench import DATA, DEFAULT_PACK, HF, FlopModel, Tally, select_articles  # noqa: E402

from spinf_stream.engine import Engine, Message  # noqa: E402
from spinf_stream.engine.results import ErrorRecord  # noqa: E402
from spinf_stream.engine.segment import PreparedMessage  # noqa: E402
from spinf_stream.packs import Pack, load_pack  # noqa: E402

EXTRA = [
    {"id": "company", "text": "Which company is the article mainly about? Give its name, or none.",
     "extract": "text", "max_tokens": 8},
    {"id": "person", "text": "Who is the first person quoted in the article? Give the name, or none.",
     "extract": "text", "max_tokens": 8},
    {"id": "percent", "text": "What percentage change does the article report first? Give the number, or none.",
     "extract": "number"},
    {"id": "amount", "text": "What is the first amount of money the article mentions? Give the amount, or none.",
     "extract": "money"},
]


def with_extractions(pack: Pack) -> Pack:
    data = pack.model_dump(exclude_none=True)
    return Pack.model_validate({**data, "name": f"{pack.name}_x4", "questions": [*data["questions"], *EXTRA]})


class Masked:
    """A transformers logits processor: only the tokens a grammar allows after the tokens
    generated so far (``n0``: the prompt's length)."""

    def __init__(self, grammar: Any, n0: int) -> None:
        self.grammar, self.n0 = grammar, n0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        state = self.grammar.start
        for t in input_ids[0, self.n0 :].tolist():
            state = self.grammar.advance(state, t)
        keep = self.grammar.allowed(state)
        out = torch.full_like(scores, float("-inf"))
        out[:, keep] = scores[:, keep]
        return out


def generate(hf: HF, base: Any, c_ids: list[int], full: str, grammar: Any, kind: str, max_tokens: int) -> tuple[list[int], int]:
    """One ``generate`` call over a copy of the article's cache: (tokens written, stop excluded; prompt tokens fed)."""
    from transformers import LogitsProcessorList

    f_ids = hf.encode(full)
    common = 0
    n = min(len(c_ids), len(f_ids) - 1)
    while common < n and c_ids[common] == f_ids[common]:
        common += 1
    cache = copy.deepcopy(base)
    if common < len(c_ids):
        cache.crop(-(len(c_ids) - common))
    procs = LogitsProcessorList([] if kind in ("text", "generate") else [Masked(grammar, len(f_ids))])
    stops = sorted(grammar.stop_ids)
    out = hf.model.generate(
        input_ids=torch.tensor([f_ids]), attention_mask=torch.ones(1, len(f_ids), dtype=torch.int64),
        past_key_values=cache, max_new_tokens=max_tokens, do_sample=False, logits_processor=procs,
        eos_token_id=stops, pad_token_id=stops[0], temperature=None, top_p=None, top_k=None,
    )
    written = out[0, len(f_ids):].tolist()
    if written and written[-1] in grammar.stop_ids:
        written = written[:-1]
    return written, len(f_ids) - common


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=10, help="articles (default 10)")
    ap.add_argument("--token-budget", type=int, default=16_384)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 articles")
    args = ap.parse_args(argv)
    if args.quick:
        args.n = 2
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(False)
    load0 = os.getloadavg()

    pack = with_extractions(load_pack(DEFAULT_PACK))
    articles = select_articles(DATA, args.n, 300, 600)
    messages = [Message(id=a["id"], fields={f: a[f] for f in pack.fields}) for a in articles]
    engine = Engine.load(model=args.model, pack=pack, token_budget=args.token_budget, threads=torch.get_num_threads())
    from spinf_stream.models.resolve import resolve

    path = Path(args.model) if Path(args.model).exists() else Path(resolve(args.model).path)
    hf = HF(path, pack, None)
    qs = engine.questions
    choice_q = [i for i, q in enumerate(qs) if q.extract is None]
    extract_q = [i for i, q in enumerate(qs) if q.extract is not None]
    assert engine.grammars is not None and len(extract_q) == len(EXTRA)
    engine.score([Message(id="warm-up", fields={f: "Warm-up." for f in pack.fields})])  # first-call costs untimed
    hf.forward(hf.encode("Warm-up text for the model."), 0, None, keep=1)

    # -- engine ------------------------------------------------------------------------------
    t0 = time.perf_counter()
    items = engine.prepare(messages)
    prepared = [p for p in items if isinstance(p, PreparedMessage)]
    if len(prepared) != len(items):
        raise SystemExit(f"engine rejected an article: {next(p for p in items if isinstance(p, ErrorRecord))}")
    records = engine.run(prepared)
    e_s = time.perf_counter() - t0
    stats = engine.last_run
    e_tokens = sum(records[i].scores[qs[q].id].tokens for i in range(len(records)) for q in extract_q)
    longest = max(records[i].scores[qs[q].id].tokens for i in range(len(records)) for q in extract_q)

    # -- (b) ---------------------------------------------------------------------------------
    fm, tally = FlopModel.of(engine), Tally()
    t0 = time.perf_counter()
    b_answers: list[dict[int, str | None]] = []
    b_tokens = b_calls = 0
    for m in messages:
        fields = dict(m.fields)
        article = hf.article_cache(fields, fm, tally)  # one forward of the article, its cache for every question
        hf.ask_with_cache(fields, choice_q, fm, tally, article)
        content, c_ids, base = article
        got: dict[int, str | None] = {}
        for qi in extract_q:
            x, g = qs[qi].extract, engine.grammars.grammars[qi]
            written, _ = generate(hf, base, c_ids, content + hf.q_texts[qi], g, x.kind, x.max_tokens)
            text = b"".join(engine.grammars.vocab[t] for t in written)
            state = None
            if x.kind not in ("text", "generate"):
                state = g.start
                for t in written:
                    state = g.advance(state, t)
            got[qi] = g.finish(state, text).answer
            b_tokens += len(written)
            b_calls += 1
        b_answers.append(got)
    b_s = time.perf_counter() - t0
    load1 = os.getloadavg()

    same = sum(records[i].scores[qs[q].id].answer == b_answers[i][q] for i in range(len(records)) for q in extract_q)
    n_q = len(qs) * len(messages)
    e_qps, b_qps = n_q / e_s, n_q / b_s
    print(f"\nspinf-stream extraction bench: model {engine.model_name}, fp32, CPU, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; engine numerics {engine.model_info.numerics.tiles}")
    print(f"workload: {len(messages)} BBC articles x {len(choice_q)} choice + {len(extract_q)} extraction questions "
          f"({', '.join(qs[q].id for q in extract_q)}); token budget {args.token_budget}")
    print(f"load average (1 min) {load0[0]:.2f} at start, {load1[0]:.2f} at end, on {os.cpu_count()} CPUs")
    print(f"{'method':<44} {'seconds':>8} {'questions/s':>12} {'extracted tok':>14} {'extracted tok/s':>16}")
    print(f"{'engine (read once, decode steps batched)':<44} {e_s:>8.1f} {e_qps:>12.2f} {e_tokens:>14} {e_tokens / e_s:>16.1f}")
    print(f"{'(b) transformers, KV reused + generate':<44} {b_s:>8.1f} {b_qps:>12.2f} {b_tokens:>14} {b_tokens / b_s:>16.1f}")
    print(f"engine / (b) = {e_qps / b_qps:.2f}x questions/s (whole pack)")
    print(f"engine: {stats.passes} passes, of them {stats.decode_passes} decode passes; longest extraction "
          f"{longest} tokens; {b_calls} generate calls in (b)")
    print(f"extractions with the same answer, engine vs (b): {same}/{b_calls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
