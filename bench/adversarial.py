"""Measure how a pack holds up against messages that argue with it: every manipulation of
``spinf_stream.manipulations`` applied to the pack's held-out labelled rows, each arguing for the
choice the row's label is not.

    spinf-stream labels --pack spam --held-out          # .cache/labelled/spam.held_out.jsonl
    python bench/adversarial.py --pack spam [--model M] [--calibration auto] [--output FILE]

Which questions are attacked, and what each detects, is the ``robustness`` map of the pack's
``data.yaml`` (``question id: {subject: spam, positive: "yes", max_flip_rate: 0.55}``): the
``positive`` choice says the message is the ``subject``; ``max_flip_rate`` is the bound the pack
states for the default model (tests/test_pack_library.py checks its report against it). Each
manipulation argues for the choice at the other end of the question's list from the row's label
(of two choices, the other one; on a scale, its far end). Every row is scored clean and under
each manipulation by ``spinf-stream score`` (the pack's calibration applies). Per question and
manipulation the report (with the pack's ``version`` and the ``calibration_id`` its answers came
from) gives ``n``, ``accuracy``, ``recall`` (of the positive choice), and ``flip_rate``: the share
of rows whose answer differs from the clean row's. ``worst`` is the
manipulation with the highest flip rate. A question named in the ``detectors`` map of
``data.yaml`` (``question id: choice``) asks whether the message argues with the filter: for it
the report gives, per manipulation and over all of them, the AUC of its choice's probability
(calibrated where the pack's calibration covers it, else raw) on the manipulated rows against the
clean ones (the Mann-Whitney statistic: the chance that a manipulated row scores above a clean
one). Written as JSON to ``--output`` (default ``packs/<pack>/robustness/<model>.json``), and
printed as a table.

``--questions attacked`` scores only the attacked and detector questions (the pack's sub-pack of
them, in process, with the whole pack's calibration for them): a pack of ~50 questions reads
~10x faster, and its numbers may differ from the whole pack's in the last bits (a message's
longest branch sets its attention shapes; an answer moves only within that of its threshold).
The report says which (``questions_scored``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.manipulations import MANIPULATIONS, Target  # noqa: E402
from spinf_stream.packs import load_pack  # noqa: E402

CLEAN = "clean"


def _data(pack_name: str) -> dict:
    return yaml.safe_load((REPO / "packs" / pack_name / "data.yaml").read_text(encoding="utf-8")) or {}


def targets(pack_name: str) -> dict[str, dict]:
    """The pack's ``robustness`` map: question id -> {subject, positive}."""
    out = _data(pack_name).get("robustness") or {}
    if not out:
        raise SystemExit(f"packs/{pack_name}/data.yaml has no robustness map (question: {{subject, positive}})")
    return out


def detectors(pack_name: str) -> dict[str, str]:
    """The pack's ``detectors`` map: question id -> the choice that says the message argues."""
    return _data(pack_name).get("detectors") or {}


def argued_for(choices: Sequence[str], label: str) -> str:
    """The choice a manipulation argues for: the one at the other end of the choices' list from the
    row's label (two choices: the other one; a scale such as ``true ... pants on fire``: its far end)."""
    return choices[-1] if choices.index(label) < len(choices) / 2 else choices[0]


def manipulated_rows(pack_name: str, rows: list[dict]) -> list[dict]:
    """Each row clean (id ``<id>|clean``) and under every manipulation (``<id>|<name>``), per
    attacked question labelled in it (``<id>|<question>|<name>``: the argument is the question's)."""
    pack = load_pack(REPO / "packs" / f"{pack_name}.yaml")
    questions = {q.id: q for q in pack.expand()}
    field = pack.fields[0]
    attacked = targets(pack_name)
    out = []
    for row in rows:
        out.append({**row, "id": f"{row['id']}|{CLEAN}"})
        for qid, how in attacked.items():
            label = row["labels"].get(qid)
            if label is None:
                continue
            q = questions[qid]
            wanted = argued_for(q.choices, label)
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


def _probability(score: dict, choice: str) -> float:
    c = score["choices"][choice]
    return c["calibrated"] if c.get("calibrated") is not None else c["probability"]


def detection(pack_name: str, rows: list[dict], probability: dict[str, dict[str, float]],
              which: dict[str, str] | None = None) -> dict[str, dict]:
    """Per detector question (``which``, default the pack's ``detectors``): AUC of its choice's
    probability, manipulated rows against clean ones, per manipulation (``n`` manipulated rows)
    and over all manipulations (``all``)."""
    from sklearn.metrics import roc_auc_score

    attacked = targets(pack_name)
    out: dict[str, dict] = {}
    for qid, choice in (detectors(pack_name) if which is None else which).items():
        clean = [probability[f"{r['id']}|{CLEAN}"][qid] for r in rows]
        per: dict[str, dict] = {}
        every: list[float] = []
        for name in MANIPULATIONS:
            got = [probability[f"{r['id']}|{t}|{name}"][qid] for r in rows for t in attacked if t in r["labels"]]
            every += got
            per[name] = {"n": len(got), "auc": float(roc_auc_score([1] * len(got) + [0] * len(clean), got + clean))}
        per["all"] = {"n": len(every), "auc": float(roc_auc_score([1] * len(every) + [0] * len(clean), every + clean))}
        out[qid] = {"choice": choice, "clean_rows": len(clean), "auc": per}
    return out


def score_cli(pack_name: str, model: str, calibration: str, given: Path, scored: Path) -> None:
    """Score ``given`` (JSON Lines) into ``scored`` with ``spinf-stream score``: the whole pack."""
    subprocess.run([sys.executable, "-m", "spinf_stream.cli", "score", "--pack", pack_name, "--model", model,
                    "--calibration", calibration, "--input", str(given), "--output", str(scored),
                    "--format", "jsonl", "--no-progress"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def score_sub_pack(pack, keep: Sequence[str], model: str, calibration: str, messages: list[dict]) -> list[dict]:
    """Records (JSON) of ``messages`` (``{"id", <fields>}``) scored with ``pack``'s sub-pack of
    the questions ``keep``, in process; ``calibration`` is resolved against the whole ``pack``
    (as ``score`` resolves it) and applied to those questions."""
    from spinf_stream import calibration as cal
    from spinf_stream.cli.evaluation import CHUNK_ROWS, ModelHandle, sub_pack
    from spinf_stream.engine import DEFAULT_TOKEN_BUDGET
    from spinf_stream.messages import Message

    handle = ModelHandle(model)
    chosen = cal.resolve(calibration, pack, handle.resolved)
    if chosen is not None:
        chosen = chosen.model_copy(update={"questions": {q: m for q, m in chosen.questions.items() if q in set(keep)}})
    engine = handle.engine(sub_pack(pack, keep), DEFAULT_TOKEN_BUDGET, chosen)
    out: list[dict] = []
    for start in range(0, len(messages), CHUNK_ROWS):
        items = engine.prepare([Message(id=m["id"], fields={k: v for k, v in m.items() if k != "id"})
                                for m in messages[start:start + CHUNK_ROWS]])
        bad = [it for it in items if hasattr(it, "error")]
        if bad:
            raise SystemExit(f"{bad[0].id}: {bad[0].error.message}")
        out += [rec.model_dump(mode="json", exclude_none=True) for rec in engine.run(items)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--calibration", default="auto")
    ap.add_argument("--input", type=Path, help="held-out labelled rows (default .cache/labelled/<pack>.held_out.jsonl)")
    ap.add_argument("--output", type=Path, help="report (default packs/<pack>/robustness/<model>.json)")
    ap.add_argument("--questions", choices=("all", "attacked"), default="all",
                    help="score with the whole pack (default) or only the attacked and detector questions")
    args = ap.parse_args(argv)
    src = args.input or REPO / ".cache" / "labelled" / f"{args.pack}.held_out.jsonl"
    rows = [orjson.loads(x) for x in src.read_bytes().splitlines() if x.strip()]
    pack = load_pack(REPO / "packs" / f"{args.pack}.yaml")
    messages = [{k: v for k, v in r.items() if k != "labels"} for r in manipulated_rows(args.pack, rows)]
    detected = detectors(args.pack)
    if args.questions == "attacked":
        keep = [q.id for q in pack.expand() if q.id in targets(args.pack) or q.id in detected]
        records = score_sub_pack(pack, keep, args.model, args.calibration, messages)
    else:
        with tempfile.TemporaryDirectory(prefix="adversarial-") as tmp:
            given, scored = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
            given.write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in messages))
            score_cli(args.pack, args.model, args.calibration, given, scored)
            records = [orjson.loads(line) for line in scored.read_bytes().splitlines()]
    answers, probability, calibrations = {}, {}, set()
    for rec in records:
        if "error" in rec:
            raise SystemExit(f"{rec.get('id')}: {rec['error']['message']}")
        calibrations.add(rec.get("calibration"))
        answers[rec["id"]] = {q: s["answer"] for q, s in rec["scores"].items()}
        probability[rec["id"]] = {q: _probability(rec["scores"][q], c) for q, c in detected.items()}
    report = {"pack": args.pack, "version": pack.version, "model": args.model,
              "calibration": args.calibration, "calibration_id": " ".join(sorted(c or "none" for c in calibrations)),
              "questions_scored": args.questions, "rows": len(rows),
              "input": os.path.relpath(src, REPO), "questions": measure(args.pack, rows, answers),
              "detectors": detection(args.pack, rows, probability)}
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
    for qid, d in report["detectors"].items():
        print(f"{args.pack} {qid}: AUC of p({d['choice']}), manipulated against {d['clean_rows']} clean rows")
        for name, m in d["auc"].items():
            print(f"  {name:<16} {m['auc']:>6.3f} ({m['n']} rows)")
    print(f"wrote {os.path.relpath(out, REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
