"""Write the labelled input of ``spinf-stream evaluate`` / ``calibrate`` for shipped packs from the
data sets in ``../shared/data``.

    python bench/labelled_data.py [--pack spam ...] [--out .cache/labelled] [--rows N]

How a data set's labels answer a pack's questions lives beside the pack, in
``packs/<pack>/data.yaml``, not here::

    target: accuracy                # optional: calibrate --target for the pack (bench/calibrate_packs.py)
    variants: {recall95: recall=0.95}  # optional: more shipped calibrations, other targets (--calibration recall95)
    sets:
      - data: sms_spam              # a folder of ../shared/data (its dev.jsonl)
        rows: 1000                  # the first rows of dev.jsonl (a fixed pseudo-random order)
        per_label: 400              # instead of rows: the first 400 rows of each label (equal priors)
        split: ","                  # optional: the label is a list with this separator
        labels:                     # question id: {data set label: choice}
          spam: {spam: "yes", ham: "no"}

A set's ``values`` label extraction questions from a row's ``meta``::

        values:
          brand: {meta: cluster_label}  # text: the field's first word, where the row's text holds it

The right answers are the field's first word, and its first two words too when the second has no
digit and the text holds both (``Fisher & Paykel``); a row whose text lacks the first word is
not labelled for that question (nothing to extract).

A set may instead be a labelled file of our own beside the mapping (``- file: composed.jsonl``),
already in the labelled input's format (extraction labels included), taken whole.

With ``split``, the first key of a question's mapping found among the row's labels gives the
choice. A row whose label maps to no choice of any question is left out. The output
``<out>/<pack>.jsonl`` holds, per row, ``id``, the fields the pack uses and ``labels``; every
row of every set of the pack, in the file's order.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.packs import load_pack, packs_dirs  # noqa: E402


def mapping_path(pack_file: Path) -> Path:
    return pack_file.parent / pack_file.stem / "data.yaml"


def load_mapping(pack_file: Path) -> list[dict[str, Any]]:
    """The ``sets`` of a pack's ``data.yaml``, checked against the pack's questions and choices."""
    pack = load_pack(pack_file)
    questions = {q.id: q for q in pack.expand()}
    path = mapping_path(pack_file)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    sets = doc.get("sets") if isinstance(doc, dict) else None
    if not isinstance(sets, list) or not sets:
        raise SystemExit(f"{path}: expected a non-empty list under 'sets'")
    for i, s in enumerate(sets):
        where = f"{path}: sets[{i}]"
        if isinstance(s, dict) and isinstance(s.get("file"), str):
            from spinf_stream.labelled import read_labelled

            read_labelled(path.parent / s["file"], list(questions.values()))  # raises naming a bad row
            continue
        if not isinstance(s.get("data"), str) or not isinstance(s.get("labels", {}), dict):
            raise SystemExit(f"{where}: needs 'data' (a data set folder) and 'labels' (question: {{label: choice}})")
        for qid, how in (s.get("values") or {}).items():
            q = questions.get(qid)
            if q is None or q.extract is None or q.extract.kind != "text":
                raise SystemExit(f"{where}.values.{qid}: no text extraction question {qid!r} in {pack_file}")
            if not isinstance(how, dict) or set(how) != {"meta"} or not isinstance(how["meta"], str):
                raise SystemExit(f"{where}.values.{qid}: expected {{meta: <field of the rows' meta>}}")
        if not s.get("labels") and not s.get("values"):
            raise SystemExit(f"{where}: needs 'labels' or 'values'")
        for qid, m in s.get("labels", {}).items():
            if qid not in questions:
                raise SystemExit(f"{where}.labels.{qid}: no question {qid!r} in {pack_file}")
            for label, choice in m.items():
                if not isinstance(choice, str) or choice not in questions[qid].choices:
                    raise SystemExit(
                        f"{where}.labels.{qid}.{label}: {choice!r} is not a choice of {qid!r} "
                        f"({', '.join(questions[qid].choices)}); quote yes/no in YAML"
                    )
    return sets


def first_words(field: str, text: str) -> list[str]:
    """The right answers a ``values`` mapping takes from ``field`` for a row of ``text`` (see the
    module docstring); empty when the text lacks the first word."""
    words = field.split()
    low = " ".join(text.casefold().split())
    if not words or words[0].casefold() not in low.split():
        return []
    out = [words[0]]
    if len(words) > 1 and not any(c.isdigit() for c in words[1]) and " ".join(words[:2]).casefold() in low:
        out.append(" ".join(words[:2]))
    return out


def labelled_rows(pack_file: Path, data_dir: Path, rows_override: int | None = None) -> list[dict[str, Any]]:
    pack = load_pack(pack_file)
    out = []
    for s in load_mapping(pack_file):
        if "file" in s:
            lines = (mapping_path(pack_file).parent / s["file"]).read_bytes().splitlines()
            out.extend(orjson.loads(line) for line in lines[:rows_override] if line.strip())
            continue
        n = rows_override or s.get("rows")
        with open(data_dir / s["data"] / "dev.jsonl", "rb") as f:
            lines = f.read().splitlines()
        taken: dict[str, int] = {}
        for line in lines[:n] if n and not s.get("per_label") else lines:
            row = orjson.loads(line)
            if s.get("per_label"):
                if taken.get(row["label"], 0) >= s["per_label"]:
                    continue
                taken[row["label"]] = taken.get(row["label"], 0) + 1
            have = set(row["label"].split(s["split"])) if s.get("split") else {row["label"]}
            labels: dict[str, Any] = {}
            for qid, m in s.get("labels", {}).items():
                choice = next((c for label, c in m.items() if label in have), None)
                if choice is not None:
                    labels[qid] = choice
            for qid, how in (s.get("values") or {}).items():
                texts = first_words(str(row.get("meta", {}).get(how["meta"], "")), row["text"])
                if texts:
                    labels[qid] = texts
            if labels:
                out.append({"id": row["id"], **{f: row[f] for f in pack.fields}, "labels": labels})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", action="append", help="pack name (repeatable; default: every pack with a data.yaml)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="folder of the data sets")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "labelled", help="output folder")
    ap.add_argument("--rows", type=int, help="rows per data set (default: each set's 'rows')")
    args = ap.parse_args(argv)
    pack_dir = packs_dirs()[-1]
    names = args.pack or sorted(p.parent.name for p in pack_dir.glob("*/data.yaml"))
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        rows = labelled_rows(pack_dir / f"{name}.yaml", args.data, args.rows)
        path = args.out / f"{name}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        print(f"{path}: {len(rows)} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
