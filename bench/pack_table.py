"""Print the pack quality table of ``packs/README.md`` from the committed calibrate reports.

    python bench/pack_table.py [--check] [packs/*/reports/*.json]

Each report is the ``--report`` of ``spinf-stream calibrate`` (raw metrics on every labelled row,
calibrated metrics k-fold cross-validated). The data set column comes from the pack's
``data.yaml``. A second table holds the extraction questions (reports with ``extractions``), a
third the robustness reports of ``bench/adversarial.py`` (``packs/*/robustness/*.json``).
``--check`` also lists every labelled question where the default model misses
the quality bar (:func:`quality_bar`) and exits 1 if there is one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
MODELS = ("qwen2.5-coder-0.5b", "gemma-3-270m", "smollm2-135m")
#: how far a question without signal may be from the class prior's log loss
PRIOR_TOLERANCE = 0.005


def data_sets(pack: str) -> dict[str, list[str]]:
    """question id → the data sets that label it (from ``packs/<pack>/data.yaml``; a set of our own
    rows is named by its file, and labels whichever questions its rows label)."""
    doc = yaml.safe_load((REPO / "packs" / pack / "data.yaml").read_text(encoding="utf-8"))
    out: dict[str, list[str]] = {}
    for s in doc["sets"]:
        if "file" in s:
            rows = (REPO / "packs" / pack / s["file"]).read_bytes().splitlines()
            for qid in dict.fromkeys(k for r in rows if r.strip() for k in orjson.loads(r).get("labels", {})):
                out.setdefault(qid, []).append(f"{s['file']} (ours)")
            continue
        for qid in [*s.get("labels", {}), *s.get("values", {})]:
            out.setdefault(qid, []).append(s["data"])
    return out


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def rows(paths: list[Path]) -> list[str]:
    docs = [orjson.loads(p.read_bytes()) for p in paths]
    docs.sort(key=lambda d: (d["pack"]["name"], MODELS.index(d["model"]) if d["model"] in MODELS else 9))
    out = [
        "| pack | question | data set | rows | model | method | AUC | accuracy raw → cal | macro-F1 raw → cal "
        "| ECE raw → cal | log loss raw → cal | majority acc | prior log loss | signal (CV AUC, 95 % interval) |",
        "|---|---|---|---:|---|---|---:|---|---|---|---|---:|---:|---|",
    ]
    for d in docs:
        if not d["questions"]:
            continue
        pack = d["pack"]["name"]
        sets = data_sets(pack)
        method = d["calibration"].split("/")[1] if d["calibration"] else "–"
        for qid, q in d["questions"].items():
            r, c, b = q["raw"], q["calibrated"] or {}, q["baseline"]
            out.append(
                f"| {pack} | {qid} | {', '.join(sets.get(qid, ['?']))} | {q['n']} | {d['model']} | {method} "
                f"| {_f(r['auc'])} | {_f(r['accuracy'])} → {_f(c.get('accuracy'))} "
                f"| {_f(r['macro_f1'])} → {_f(c.get('macro_f1'))} | {_f(r['ece'])} → {_f(c.get('ece'))} "
                f"| {_f(r['log_loss'])} → {_f(c.get('log_loss'))} | {_f(b['accuracy'])} | {_f(b['log_loss'])} "
                f"| {signal(q, d['model'])} |"
            )
    return out


def signal(q: dict, model: str) -> str:
    """The signal column: the fitted map's cross-validated AUC and its interval, and "no signal
    for <model>" (shipped as the class prior) when the interval holds 0.5."""
    s = q.get("signal")
    if not s or s["auc_ci95"] is None:
        return "–"
    lo, hi = s["auc_ci95"]
    text = f"{s['auc']:.3f} [{lo:.3f}, {hi:.3f}]"
    if s["present"] is False:
        text = f"**no signal for {model}**: {text}" + (", class prior shipped" if s["prior_map"] else "")
    return text


def extraction_rows(paths: list[Path]) -> list[str]:
    """The extraction table: per extraction question and model, exact match (all rows, rows with a
    value), none accuracy, ECE of ``probability``, raw and (where the calibration decides none)
    cross-validated with it, the AUC of the raw ``none_probability``, and the signal of the none
    decision's fitted map (:func:`signal`)."""
    docs = [orjson.loads(p.read_bytes()) for p in paths]
    docs = [d for d in docs if d.get("extractions")]
    docs.sort(key=lambda d: (d["pack"]["name"], MODELS.index(d["model"]) if d["model"] in MODELS else 9))
    out = [
        "| pack | question | kind | data set | rows (with a value / none) | model | exact match raw → cal | of values raw → cal "
        "| none accuracy raw → cal | value answered none raw → cal | ECE raw → cal | none AUC "
        "| none decision's signal (CV AUC, 95 % interval) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---:|---|",
    ]

    def both(e: dict, c: dict, key: str) -> str:
        return f"{_f(e[key])} → {_f(c.get(key))}" if c else _f(e[key])

    for d in docs:
        pack = d["pack"]["name"]
        sets = data_sets(pack)
        for qid, e in d["extractions"].items():
            c = e.get("calibrated_cv") or {}
            out.append(
                f"| {pack} | {qid} | {e['kind']} | {', '.join(sets.get(qid, ['?']))} | {e['n']} ({e['n_value']} / {e['n_none']}) "
                f"| {d['model']} | {both(e, c, 'exact_match')} | {both(e, c, 'value_exact_match')} | {both(e, c, 'none_accuracy')} "
                f"| {both(e, c, 'value_answered_none')} | {both(e, c, 'ece')} | {_f(e['none_auc'])} "
                f"| {signal(e.get('none_decision') or {}, d['model'])} |"
            )
    return out


def quality_bar(doc: dict) -> list[str]:
    """What a cross-validated calibrate report misses of the bar every shipped pack meets for the
    default model: per labelled question ECE <= 0.05, log loss below the raw one and the class
    prior's, accuracy at least the majority baseline and above it where the AUC is >= 0.8. A
    question without signal for the model (``signal.present`` false) is shipped the class prior's
    map and meets the bar when its log loss is within :data:`PRIOR_TOLERANCE` of the prior's."""
    misses = []
    for qid, q in doc["questions"].items():
        c, r, b = q["calibrated"], q["raw"], q["baseline"]
        where = f"{doc['pack']['name']}.{qid} ({doc['model']})"
        if c is None:
            misses.append(f"{where}: no calibrated numbers")
            continue
        s = q.get("signal") or {}
        if s.get("present") is False:
            if not s.get("prior_map"):
                misses.append(f"{where}: no signal, but the fitted map is shipped instead of the class prior's")
            elif abs(c["log_loss"] - b["log_loss"]) > PRIOR_TOLERANCE:
                misses.append(f"{where}: no signal, log loss {c['log_loss']:.4f} not within {PRIOR_TOLERANCE} "
                              f"of the prior's {b['log_loss']:.4f}")
            continue
        if c["ece"] > 0.05:
            misses.append(f"{where}: ECE {c['ece']:.3f} > 0.05")
        if not c["log_loss"] < min(r["log_loss"], b["log_loss"]):
            misses.append(f"{where}: log loss {c['log_loss']:.4f} not below raw {r['log_loss']:.4f} and prior {b['log_loss']:.4f}")
        if c["accuracy"] < b["accuracy"]:
            misses.append(f"{where}: accuracy {c['accuracy']:.3f} below the majority's {b['accuracy']:.3f}")
        if r["auc"] is not None and r["auc"] >= 0.8 and not c["accuracy"] > b["accuracy"]:
            misses.append(f"{where}: AUC {r['auc']:.3f} but accuracy {c['accuracy']:.3f} not above the majority's {b['accuracy']:.3f}")
    return misses


def robustness_rows(paths: list[Path]) -> list[str]:
    """One row per attacked question and model: clean and worst-manipulation accuracy and recall,
    and the worst flip rate (``bench/adversarial.py``'s reports)."""
    out = ["| pack | question | model | held-out rows | clean accuracy | clean recall | worst manipulation "
           "| its accuracy | its recall | flip rate |",
           "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for path in paths:
        doc = orjson.loads(path.read_bytes())
        for qid, q in doc["questions"].items():
            clean, worst = q["manipulations"]["clean"], q["worst"]
            out.append(f"| {doc['pack']} | {qid} | {doc['model']} | {clean['n']} | {_f(clean['accuracy'])} "
                       f"| {_f(clean['recall'])} | {worst['manipulation']} | {_f(worst['accuracy'])} "
                       f"| {_f(worst['recall'])} | {_f(worst['flip_rate'])} |")
    return out


def flip_rows(paths: list[Path]) -> list[str]:
    """One row per attacked question and model: each manipulation's flip rate, and each detector
    question's AUC over all manipulations (``bench/adversarial.py``'s reports)."""
    docs = [orjson.loads(p.read_bytes()) for p in paths]
    if not docs:
        return []
    names = [m for m in next(iter(docs[0]["questions"].values()))["manipulations"] if m != "clean"]
    out = ["| pack | question | model | " + " | ".join(n.replace("_", " ") for n in names) + " |",
           "|---|---|---|" + "---:|" * len(names)]
    for doc in docs:
        for qid, q in doc["questions"].items():
            out.append(f"| {doc['pack']} {doc.get('version', '')} | {qid} | {doc['model']} | "
                       + " | ".join(_f(q["manipulations"][n]["flip_rate"]) for n in names) + " |")
        for qid, d in (doc.get("detectors") or {}).items():
            out.append(f"| {doc['pack']} {doc.get('version', '')} | {qid} (detector: AUC of p({d['choice']}), "
                       f"manipulated against clean) | {doc['model']} | "
                       + " | ".join(_f(d["auc"][n]["auc"]) for n in names) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    paths = [Path(a) for a in args if a != "--check"] or sorted(REPO.glob("packs/*/reports/*.json"))
    print("\n".join(rows(paths)))
    print()
    print("\n".join(extraction_rows(paths)))
    print()
    print("\n".join(robustness_rows(sorted(REPO.glob("packs/*/robustness/*.json")))))
    print()
    print("\n".join(flip_rows(sorted(REPO.glob("packs/*/robustness/*.json")))))
    if check:
        misses = [m for p in paths for m in quality_bar(orjson.loads(p.read_bytes())) if MODELS[0] in m]
        print("\n".join(misses) or "every labelled question of the default model meets the bar", file=sys.stderr)
        return 1 if misses else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
