"""Quality of a shipped pack on a labelled dev set: AUC and accuracy of its labelled question.

    python bench/pack_quality.py --pack spam --model smollm2-135m [--n 150] [--oracle engine|transformers]

``--model`` is a short name (resolved by ``spinf_stream.models.resolve``), a Hugging Face
directory or a ``.gguf`` file. The score of a choice is the one the engine promises (see
``docs/structures.md``): full = preamble + prompt(message) + question(q), tokenized as one string
with ``add_special_tokens=True``; a choice's tokens = tokens(full + answer_prefix + label) minus
tokens(full); probability = softmax over the question's choices of the summed log-probabilities.

``--oracle transformers`` computes that with transformers directly (fp32). To stay fast on a CPU it
reuses the KV cache of the preamble and of each message's content across questions, but only where
the tokens of the longer string extend the tokens of the shorter one (checked per string, so the
tokens are always exactly the oracle's); the numbers differ from a cache-free run only by float
rounding. ``--oracle engine`` (the default when ``spinf_stream.engine`` imports) asks the engine.

Metrics: for a binary question, AUC of the positive choice's probability and accuracy of the most
probable choice; for a multi-class question, accuracy and macro one-vs-rest AUC. Also printed: the
preamble's token count, labels that are several tokens, and any choice whose tokens do not extend
the tokens of ``full`` (the engine must tokenize those in context).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.packs import ExpandedQuestion, Pack, load_pack  # noqa: E402

DATA = REPO.parent / "shared" / "data"

# pack name → data set, the question measured against its label, and label → choice
EVALS: dict[str, dict[str, Any]] = {
    "spam": {"data": "sms_spam", "question": "spam", "labels": {"spam": "yes", "ham": "no"}, "positive": "yes"},
    "sentiment": {
        "data": "sentiment_labelled_sentences",
        "question": "sentiment",
        "labels": {"positive": "positive", "negative": "negative"},
        "positive": "positive",
    },
    "news_topics": {
        "data": "ag_news",
        "question": "topic",
        "labels": {"World": "World", "Sports": "Sports", "Business": "Business", "Sci/Tech": "Science and technology"},
        "positive": None,
    },
}


# ---------------------------------------------------------------------------------- metrics


def auc(scores: list[float], positive: list[bool]) -> float:
    """Area under the ROC curve (Mann–Whitney U with average ranks for ties); NaN if one class."""
    n_pos = sum(positive)
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, p in zip(ranks, positive) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


# ------------------------------------------------------------------------------- the oracle


def load_transformers(model_ref: str) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_ref)
    if not path.exists():
        from spinf_stream.models.resolve import resolve  # short names: the engine's resolver

        path = Path(resolve(model_ref).path)
    kw: dict[str, Any] = {}
    if path.is_file():  # a .gguf: dequantized by transformers
        kw["gguf_file"] = path.name
        path = path.parent
    tok = AutoTokenizer.from_pretrained(path, **kw)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()
    return model, tok, model_ref


class TransformersOracle:
    """Scores one message × all questions with transformers, sharing KV caches where exact."""

    def __init__(self, model_ref: str, pack: Pack, only: str | None = None):
        import torch

        self.torch = torch
        self.model, self.tok, self.name = load_transformers(model_ref)
        self.pack = pack
        self.questions = [q for q in pack.expand() if only is None or q.id == only]
        self.notes: dict[str, set[str]] = defaultdict(set)
        self.pre_ids = self.encode(pack.preamble) if pack.preamble else []
        self.pre_cache = self.forward(self.pre_ids, None)[0] if self.pre_ids else None

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=True)["input_ids"]

    def forward(self, ids: list[int], cache: Any, past_len: int = 0) -> tuple[Any, Any]:
        """Run ``ids`` after ``cache``; returns (cache, log-softmax [len(ids), vocab])."""
        torch = self.torch
        from transformers import DynamicCache

        if cache is None:
            cache = DynamicCache(config=self.model.config)
        x = torch.tensor([ids])
        pos = torch.arange(past_len, past_len + len(ids))[None]
        with torch.no_grad():
            out = self.model(input_ids=x, past_key_values=cache, position_ids=pos, use_cache=True)
        return out.past_key_values, torch.log_softmax(out.logits[0].float(), dim=-1)

    def extend(self, prefix_ids: list[int], cache: Any, new_ids: list[int]) -> tuple[Any, Any]:
        """Run ``new_ids`` after a copy of the cached prefix; returns (cache, log-probs at every new position)."""
        cache = copy.deepcopy(cache) if cache is not None else None
        return self.forward(new_ids, cache, past_len=len(prefix_ids))

    def score(self, fields: dict[str, str]) -> dict[str, dict[str, float]]:
        """``{question id: {label: logprob}}`` for one message."""
        pack = self.pack
        content = pack.preamble + pack.render_prompt(fields)
        c_ids = self.encode(content)
        if self.pre_ids and c_ids[: len(self.pre_ids)] == self.pre_ids:
            c_cache, c_logp = self.extend(self.pre_ids, self.pre_cache, c_ids[len(self.pre_ids):])
        else:
            self.notes["content tokens do not extend the preamble's (no preamble cache)"].add(str(len(c_ids)))
            c_cache, c_logp = self.forward(c_ids, None)
        out: dict[str, dict[str, float]] = {}
        for q in self.questions:
            out[q.id] = self.score_question(content, c_ids, c_cache, q)
        return out

    def score_question(self, content: str, c_ids: list[int], c_cache: Any, q: ExpandedQuestion) -> dict[str, float]:
        pack = self.pack
        full = content + pack.render_question(q)
        f_ids = self.encode(full)
        if f_ids[: len(c_ids)] == c_ids:
            base_ids, base_cache = c_ids, c_cache
        else:
            self.notes["full tokens do not extend the content's (no content cache)"].add(q.id)
            base_ids, base_cache = [], None
        f_cache, f_logp = self.extend(base_ids, base_cache, f_ids[len(base_ids):])
        result: dict[str, float] = {}
        for label in q.choices:
            ext = self.encode(full + pack.answer_prefix + label)
            if ext[: len(f_ids)] != f_ids:
                # The oracle is still "tokens(full + choice) minus tokens(full)"; read the whole string.
                self.notes[f"choice tokens do not extend full's tokens ({self.name})"].add(label)
                _, logp = self.forward(ext, None)
                cont = ext[len(f_ids):]
                rows = logp[len(f_ids) - 1 : len(ext) - 1]
            else:
                cont = ext[len(f_ids):]
                if len(cont) > 1:
                    self.notes["multi-token labels"].add(f"{label!r}={len(cont)}")
                    _, more = self.extend(f_ids, f_cache, cont[:-1])
                    rows = self.torch.cat([f_logp[-1:], more], dim=0)
                else:
                    rows = f_logp[-1:]
            if not cont:
                raise SystemExit(f"choice {label!r} adds no tokens after {full[-40:]!r}")
            result[label] = float(sum(rows[i, t] for i, t in enumerate(cont)))
        return result


class EngineOracle:
    def __init__(self, model_ref: str, pack: Pack):
        import torch

        from spinf_stream.engine import Engine

        self.engine = Engine.load(model=model_ref, pack=str(pack.source), token_budget=16384, threads=torch.get_num_threads())
        self.name = self.engine.model_name
        self.notes: dict[str, set[str]] = {}

    def score_many(self, items: list[dict[str, Any]]) -> list[dict[str, dict[str, float]]]:
        from spinf_stream.engine import Message

        prepared = self.engine.prepare([Message(id=it["id"], fields=it) for it in items])
        records = self.engine.run(prepared)
        out = []
        for rec in records:
            if not hasattr(rec, "scores"):
                raise SystemExit(f"engine failed on {rec}")
            out.append({qid: {lab: c.logprob for lab, c in qs.choices.items()} for qid, qs in rec.scores.items()})
        return out


# ------------------------------------------------------------------------------------- main


def softmax(logprobs: dict[str, float]) -> dict[str, float]:
    m = max(logprobs.values())
    ex = {k: math.exp(v - m) for k, v in logprobs.items()}
    z = sum(ex.values())
    return {k: v / z for k, v in ex.items()}


def main(argv: list[str] | None = None) -> int:
    try:
        import spinf_stream.engine.scoring  # noqa: F401

        default_oracle = "engine"
    except Exception:
        default_oracle = "transformers"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", required=True, help="pack name or .yaml path")
    ap.add_argument("--model", required=True, help="short name, HF directory or .gguf file")
    ap.add_argument("--n", type=int, default=150, help="messages from the head of dev.jsonl")
    ap.add_argument("--data", type=Path, help="JSONL with a 'label' field (default: the pack's data set)")
    ap.add_argument("--question", help="question id measured against the label (default: per pack)")
    ap.add_argument("--oracle", choices=["engine", "transformers"], default=default_oracle)
    ap.add_argument("--only-labelled", action="store_true", help="transformers oracle: score only --question")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 is fastest on a shared CPU: oversubscribed threads spin)")
    ap.add_argument("--json", type=Path, help="append the result as one JSON line to this file")
    args = ap.parse_args(argv)

    pack = load_pack(args.pack)
    spec = dict(EVALS.get(pack.name, {}))
    if args.question:
        spec["question"] = args.question
    data = args.data or (DATA / spec["data"] / "dev.jsonl")
    qid = spec["question"]
    items = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()[: args.n]]
    label_map: dict[str, str] = spec["labels"]

    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.oracle == "engine":
        oracle: Any = EngineOracle(args.model, pack)
        scored = oracle.score_many(items)
    else:
        oracle = TransformersOracle(args.model, pack, only=qid if args.only_labelled else None)
        scored = []
        for i, it in enumerate(items):
            scored.append(oracle.score({f: it[f] for f in pack.fields}))
            if (i + 1) % 25 == 0:
                print(f"  {i + 1}/{len(items)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0

    probs = [{q: softmax(lp) for q, lp in s.items()} for s in scored]
    gold = [label_map[it["label"]] for it in items]
    answers = [max(p[qid], key=p[qid].get) for p in probs]
    acc = sum(a == g for a, g in zip(answers, gold)) / len(gold)
    choices = list(probs[0][qid])
    if spec.get("positive"):
        pos = spec["positive"]
        quality = auc([p[qid][pos] for p in probs], [g == pos for g in gold])
    else:  # macro one-vs-rest
        quality = sum(auc([p[qid][c] for p in probs], [g == c for g in gold]) for c in choices) / len(choices)

    n_pre = None
    if args.oracle == "transformers":
        n_pre = len(oracle.tok(pack.preamble, add_special_tokens=False)["input_ids"])
    result = {
        "pack": pack.name, "model": args.model, "oracle": args.oracle, "n": len(items),
        "question": qid, "auc": round(quality, 4), "accuracy": round(acc, 4),
        "preamble_tokens": n_pre, "seconds": round(seconds, 1),
    }
    print(json.dumps(result))
    # Every question's mean probability of its first choice per gold label: a sanity check of the
    # unlabelled questions (e.g. "asks to click a link" should be higher on spam).
    by_gold: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(gold):
        by_gold[g].append(i)
    for q in probs[0]:
        first = next(iter(probs[0][q]))
        means = {g: sum(probs[i][q][first] for i in idx) / len(idx) for g, idx in sorted(by_gold.items())}
        print(f"  P({q}={first}) mean by gold label: " + ", ".join(f"{g}: {m:.3f}" for g, m in means.items()))
    confusion: dict[tuple[str, str], int] = defaultdict(int)
    for a, g in zip(answers, gold):
        confusion[(g, a)] += 1
    print("  confusion (gold → answer): " + ", ".join(f"{g}→{a}: {n}" for (g, a), n in sorted(confusion.items())))
    for note, what in getattr(oracle, "notes", {}).items():
        print(f"  note: {note}: {sorted(what)[:10]}")
    if args.json:
        with args.json.open("a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
