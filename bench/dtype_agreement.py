"""How far bfloat16, fp8 and int8 scores move from float32's, on real messages.

    python bench/dtype_agreement.py [--model qwen2.5-coder-0.5b] [--pack spam] [--data sms_spam] [--n 50]
                                    [--dtypes float32 bfloat16 fp8 int8]

Scores the first ``--n`` messages of ``../shared/data/<data>/dev.jsonl`` with the pack once per
dtype — float32, bfloat16, fp8 (linear weights in float8 e4m3 with per-output-channel scales,
activations quantized per row: the GPU path's quantization, run here through the fp8 GEMM's torch
twin with fp32 accumulation) and int8 (linear weights in int8 with per-output-channel scales,
bf16 activations: the W8A16 GEMM's torch twin) — on the CPU, and prints per pair the largest and
mean |Δprobability| over every (message, question, choice) and how many answers agree. fp8 and
int8 need a GPU for speed; their numbers (up to accumulation order) are these.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from spinf_stream.engine import Engine, Message  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--pack", default="spam")
    ap.add_argument("--data", default="sms_spam")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "fp8", "int8"],
                    choices=["float32", "bfloat16", "fp8", "int8"])
    args = ap.parse_args(argv)
    path = Path(os.environ.get("SPINF_DATA_DIR", REPO.parent / "shared" / "data")) / args.data / "dev.jsonl"
    with path.open("rb") as f:
        rows = [orjson.loads(line) for _, line in zip(range(args.n), f)]
    msgs = [Message(id=r["id"], fields=r) for r in rows]
    scores = {}
    for dtype in args.dtypes:
        engine = Engine.load(args.model, args.pack, dtype=dtype, device="cpu")
        scores[dtype] = [r for r in engine.score(msgs) if hasattr(r, "scores")]
    print(f"{args.model}, pack {args.pack}, {len(msgs)} messages of {args.data}, load average {os.getloadavg()[0]:.1f}")
    pairs = [(a, b) for a in args.dtypes for b in ("float32", "bfloat16") if a != b and b in args.dtypes]
    for a, b in [p for p in pairs if p != ("float32", "bfloat16")]:
        diffs, same, total = [], 0, 0
        for ra, rb in zip(scores[a], scores[b]):
            for q, qa in ra.scores.items():
                qb = rb.scores[q]
                diffs += [abs(c.probability - qb.choices[k].probability) for k, c in qa.choices.items()]
                same += qa.answer == qb.answer
                total += 1
        print(f"{a:>9} vs {b:<9} max |dp| {max(diffs):.4f}  mean |dp| {sum(diffs) / len(diffs):.4f}  "
              f"same answer {same}/{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
