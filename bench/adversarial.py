"""Measure how a pack holds up against messages that argue with it: every manipulation of
``spinf_stream.manipulations`` applied to the pack's held-out labelled rows, each arguing for the
choice the row's label is not.

    spinf-stream labels --pack spam --held-out          # .cache/labelled/spam.held_out.jsonl
    python bench/adversarial.py --pack spam [--model M] [--calibration auto] [--output FILE]

Which questions are attacked, and what each detects, is the ``robustness`` map of the pack's
``data.yaml`` (``question id: {subject: spam, positive: "yes"}``): a two-choice question whose
``positive`` choice says the message is the ``subject``. Every row is scored clean and under each
manipulation by ``spinf-stream score`` (the pack's calibration applies). Per question and
manipulation the report gives ``n``, ``accuracy``, ``recall`` (of the positive choice), and
``flip_rate``: the share of rows whose answer differs from the clean row's. ``worst`` is the
manipulation with the highest flip rate. Written as JSON to ``--output`` (default
``packs/<pack>/robustness/<model>.json``), and printed as a table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.manipulations import MANIPULATIONS, Target  # noqa: E402
from spinf_stream.packs import load_pack  # noqa: E402

CLEAN = "clean"


def targets(pack_name: str) -> dict[str, dict]:
    """The pack's ``robustness`` map: question id -> {subject, positive}."""
    doc = yaml.safe_load((REPO / "packs" / pack_name / "data.yaml").read_text(encoding="utf-8"))
    out = (doc or {}).get("robustness") or {}
    if not out:
        raise SystemExit(f"packs/{pack_name}/data.yaml has no robustness map (question: {{subject, positive}})")
    return out


def manipulated_rows(pack_name: str, rows: list[dict]) -> list[dict]:
    """Each row clean (id ``<id>|clean``) and under every manipulation (``<id>|<name>``), per
    attacked question labelled in it (``<id>|<question>|<name>``: the argument is the question's)."""
    pack = load_pack(REPO / "packs" / f"{pack_name}.yaml")
    questions = {q.id: q for q in pack.expand()}
    field = pack.fields[0]
    out = []
    for row in rows:
        out.append({**row, "id": f"{row['id']}|{CLEAN}"})
        for qid, how in targets(pack_name).items():
            label = row["labels"].get(qid)
            if label is None:
                continue
            q = questions[qid]
            wanted = next(c for c in q.choices if c != label)
            t = Target(subject=how["subject"], wanted=wanted, positive=wanted == how["positive"],
                       question=pack.render_question(q))
            for name, f in MANIPULATIONS.items():
                out.append({**row, field: f(row[field], t), "id": f"{row['id']}|{qid}|{name}"})
    return out


def measure(pack_name: str, rows: list[dict], answers: dict[str, dict[str, str]]) -> dict[str, dict]:
    """Per attacked question: clean and per-manipulation n, accuracy, recall, flip rate."""
    report: dict[str, dict] = {}
    for qid, how in targets(pack_name).items():
        labelled = [r for r in rows if qid in r["labels"]]
        per: dict[str, dict] = {}
        for name in (CLEAN, *MANIPULATIONS):
            right = flips = pos = caught = 0
            for r in labelled:
                clean = answers[f"{r['id']}|{CLEAN}"][qid]
                got = clean if name == CLEAN else answers[f"{r['id']}|{qid}|{name}"][qid]
                right += got == r["labels"][qid]
                flips += got != clean
                if r["labels"][qid] == how["positive"]:
                    pos += 1
                    caught += got == how["positive"]
            n = len(labelled)
            per[name] = {"n": n, "accuracy": right / n, "recall": caught / pos if pos else None, "flip_rate": flips / n}
        worst = max(MANIPULATIONS, key=lambda m: per[m]["flip_rate"])
        report[qid] = {"subject": how["subject"], "positive": how["positive"], "manipulations": per,
                       "worst": {"manipulation": worst, **per[worst]}}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--calibration", default="auto")
    ap.add_argument("--input", type=Path, help="held-out labelled rows (default .cache/labelled/<pack>.held_out.jsonl)")
    ap.add_argument("--output", type=Path, help="report (default packs/<pack>/robustness/<model>.json)")
    args = ap.parse_args(argv)
    src = args.input or REPO / ".cache" / "labelled" / f"{args.pack}.held_out.jsonl"
    rows = [orjson.loads(x) for x in src.read_bytes().splitlines() if x.strip()]
    with tempfile.TemporaryDirectory(prefix="adversarial-") as tmp:
        given, scored = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        given.write_bytes(b"".join(orjson.dumps({k: v for k, v in r.items() if k != "labels"}) + b"\n"
                                   for r in manipulated_rows(args.pack, rows)))
        subprocess.run([sys.executable, "-m", "spinf_stream.cli", "score", "--pack", args.pack, "--model", args.model,
                        "--calibration", args.calibration, "--input", str(given), "--output", str(scored),
                        "--format", "jsonl", "--no-progress"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        answers = {}
        for line in scored.read_bytes().splitlines():
            rec = orjson.loads(line)
            if "error" in rec:
                raise SystemExit(f"{rec.get('id')}: {rec['error']['message']}")
            answers[rec["id"]] = {q: s["answer"] for q, s in rec["scores"].items()}
    report = {"pack": args.pack, "model": args.model, "calibration": args.calibration, "rows": len(rows),
              "input": os.path.relpath(src, REPO), "questions": measure(args.pack, rows, answers)}
    out = args.output or REPO / "packs" / args.pack / "robustness" / f"{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    for qid, q in report["questions"].items():
        print(f"{args.pack} {qid} ({args.model}, {q['manipulations'][CLEAN]['n']} held-out rows)")
        print(f"  {'manipulation':<16} {'accuracy':>8} {'recall':>7} {'flips':>6}")
        for name, m in q["manipulations"].items():
            recall = "-" if m["recall"] is None else f"{m['recall']:.3f}"
            print(f"  {name:<16} {m['accuracy']:>8.3f} {recall:>7} {m['flip_rate']:>6.3f}")
        print(f"  worst: {q['worst']['manipulation']} (flip rate {q['worst']['flip_rate']:.3f})")
    print(f"wrote {os.path.relpath(out, REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
