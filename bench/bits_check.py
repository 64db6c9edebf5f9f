"""Digests of long messages across token budgets, orders and thread counts, on this machine.

    python bench/bits_check.py [--models smollm2-135m gemma-3-270m qwen2.5-coder-0.5b]
                               [--budgets 64 100 160] [--skip 600] [--n 8] [--threads 1 2]

Workload: ``--n`` long messages that the test suite does not use — half the longest SMS of
``sms_spam/dev.jsonl`` after its first ``--skip`` rows, half BBC articles after its first 10, cut
to 1,500 characters — scored with the first 10 questions of the ``moderation`` pack. For each
model: every message alone (budget 16,384) is the reference; then all messages at each of
``--budgets``, reversed at 16,384, and alone again with each ``--threads`` count of compute
workers. Prints, per setting, how many of the messages' digests equal the reference, and the
model's ``numerics`` block. Nothing is downloaded; the models come from their PyPI packages.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DATA = Path(os.environ.get("SPINF_DATA_DIR", REPO.parent / "shared" / "data"))


def rows(path: Path, start: int, count: int) -> list[dict]:
    out = []
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if i >= start:
                out.append(orjson.loads(line))
            if len(out) == count:
                break
    return out


def messages(n: int, skip: int) -> list:
    from spinf_stream.engine import Message

    sms = sorted(rows(DATA / "sms_spam" / "dev.jsonl", skip, 400), key=lambda r: -len(r["text"]))[: n - n // 2]
    news = rows(DATA / "bbc_news" / "dev.jsonl", 10, n // 2)
    picked = [{"id": r["id"], "text": r["text"]} for r in sms] + [{"id": r["id"], "text": r["text"][:1500]} for r in news]
    return [Message(id=r["id"], fields=r) for r in picked]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m", "qwen2.5-coder-0.5b"])
    ap.add_argument("--budgets", nargs="+", type=int, default=[64, 100, 160])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--skip", type=int, default=600, help="SMS rows skipped (the tests use the first 600)")
    args = ap.parse_args(argv)
    if not (DATA / "sms_spam" / "dev.jsonl").exists():
        raise SystemExit(f"bits_check: no data at {DATA} (SPINF_DATA_DIR=/path/to/data)")

    from spinf_stream.engine import Engine
    from spinf_stream.cli.evaluation import sub_pack
    from spinf_stream.models import load_decoder
    from spinf_stream.models.resolve import resolve
    from spinf_stream.packs import load_pack
    from transformers import AutoTokenizer

    full = load_pack("moderation")
    pack = sub_pack(full, [q.id for q in full.expand()[:10]])
    msgs = messages(args.n, args.skip)
    for model in args.models:
        path = resolve(model).path
        tok = AutoTokenizer.from_pretrained(str(path))
        decoder = load_decoder(path)
        engine = lambda budget, d=decoder: Engine(d, tok, pack, model, token_budget=budget)  # noqa: E731
        ref = {m.id: r.digest for m in msgs for r in engine(16384).score([m])}
        tokens = [p.n_tokens for p in engine(16384).prepare(msgs)]
        print(f"{model}: {len(msgs)} messages of {min(tokens)}-{max(tokens)} tokens (content + 10 branches); "
              f"numerics {engine(16384).model_info.numerics.model_dump()}")

        def report(label: str, got: dict[str, str]) -> None:
            same = sum(got[k] == ref[k] for k in got)
            print(f"  {label:<28} {same} of {len(got)} digests equal to each message alone")

        for budget in args.budgets:
            report(f"budget {budget}", {r.id: r.digest for r in engine(budget).score(msgs)})
        report("reversed, budget 16384", {r.id: r.digest for r in engine(16384).score(msgs[::-1])})
        decoder.backend.close()
        for threads in args.threads:
            d = load_decoder(path, threads=threads)
            e = Engine(d, tok, pack, model, token_budget=16384)
            report(f"{threads} compute worker(s), alone", {m.id: r.digest for m in msgs for r in e.score([m])})
            d.backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
