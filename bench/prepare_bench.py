"""Cost of tokenizing messages (``Segmenter.prepare``), with seams and with every question's prompt
tokenized whole.

    python bench/prepare_bench.py                                  # spam x 200 SMS, bbc56 x 20 articles, 3 tokenizers
    python bench/prepare_bench.py --models smollm2-135m --reps 3

Prints milliseconds per message (best of ``--reps`` passes over the messages; each pass after a
first warm-up pass, so the per-pack caches of question tails are warm, as in the service). Both
ways give the same tokens (tests/test_segment.py); the whole-prompt way is what a tokenizer
without seams (``spinf_stream.engine.seams``) costs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson

from spinf_stream.packs import load_pack
from spinf_stream.engine.segment import Segmenter
from spinf_stream.engine.tokenizer import PromptTokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CASES = [("spam", "sms_spam", 200), (str(Path(__file__).parent / "packs" / "bbc56.yaml"), "bbc_news", 20)]


def _rows(name: str, n: int) -> list[dict]:
    rows = []
    with open(DATA / name / "dev.jsonl", "rb") as f:
        for line in f:
            rows.append(orjson.loads(line))
            if len(rows) == n:
                break
    return rows


def _ms_per_message(seg: Segmenter, messages: list[dict], reps: int) -> float:
    for i, m in enumerate(messages):  # warm-up
        seg.prepare(i, str(i), m)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for i, m in enumerate(messages):
            seg.prepare(i, str(i), m)
        best = min(best, time.perf_counter() - t)
    return best / len(messages) * 1e3


def main() -> None:
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,gemma-3-270m")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"{'tokenizer':20s} {'pack':7s} {'msgs':>4s} {'Q':>3s} {'seams':>8s} {'whole':>8s}  (ms per message)")
    for model in args.models.split(","):
        tokenizer = PromptTokenizer(AutoTokenizer.from_pretrained(str(resolve(model).path)))
        for ref, data, n in CASES:
            pack = load_pack(ref)
            messages = [{f: r[f] for f in pack.fields} for r in _rows(data, n)]
            seams = Segmenter(tokenizer, pack, 1 << 20)
            whole = Segmenter(tokenizer, pack, 1 << 20)
            whole.tokenizer.seams = None
            a, b = _ms_per_message(seams, messages, args.reps), _ms_per_message(whole, messages, args.reps)
            print(f"{model:20s} {pack.name:7s} {n:4d} {len(seams.questions):3d} {a:8.2f} {b:8.2f}", flush=True)


if __name__ == "__main__":
    main()
