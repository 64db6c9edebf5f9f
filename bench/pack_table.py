"""Print the pack quality table of ``packs/README.md`` from the committed calibrate reports.

    python bench/pack_table.py [packs/*/reports/*.json]

Each report is the ``--report`` of ``spinf-stream calibrate`` (raw metrics on every labelled row,
calibrated metrics k-fold cross-validated). The data set column comes from the pack's
``data.yaml``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
MODELS = ("qwen2.5-coder-0.5b", "gemma-3-270m", "smollm2-135m")


def data_sets(pack: str) -> dict[str, list[str]]:
    """question id → the data sets that label it (from ``packs/<pack>/data.yaml``)."""
    doc = yaml.safe_load((REPO / "packs" / pack / "data.yaml").read_text(encoding="utf-8"))
    out: dict[str, list[str]] = {}
    for s in doc["sets"]:
        for qid in s["labels"]:
            out.setdefault(qid, []).append(s["data"])
    return out


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def rows(paths: list[Path]) -> list[str]:
    docs = [orjson.loads(p.read_bytes()) for p in paths]
    docs.sort(key=lambda d: (d["pack"]["name"], MODELS.index(d["model"]) if d["model"] in MODELS else 9))
    out = [
        "| pack | question | data set | rows | model | method | AUC | accuracy raw → cal | macro-F1 raw → cal "
        "| ECE raw → cal | log loss raw → cal | majority acc | prior log loss |",
        "|---|---|---|---:|---|---|---:|---|---|---|---|---:|---:|",
    ]
    for d in docs:
        pack = d["pack"]["name"]
        sets = data_sets(pack)
        method = d["calibration"].split("/")[1] if d["calibration"] else "–"
        for qid, q in d["questions"].items():
            r, c, b = q["raw"], q["calibrated"] or {}, q["baseline"]
            out.append(
                f"| {pack} | {qid} | {', '.join(sets.get(qid, ['?']))} | {q['n']} | {d['model']} | {method} "
                f"| {_f(r['auc'])} | {_f(r['accuracy'])} → {_f(c.get('accuracy'))} "
                f"| {_f(r['macro_f1'])} → {_f(c.get('macro_f1'))} | {_f(r['ece'])} → {_f(c.get('ece'))} "
                f"| {_f(r['log_loss'])} → {_f(c.get('log_loss'))} | {_f(b['accuracy'])} | {_f(b['log_loss'])} |"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] or sorted(REPO.glob("packs/*/reports/*.json"))
    print("\n".join(rows(paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
