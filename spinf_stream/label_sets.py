"""Labelled sets: the labelled input of ``evaluate`` / ``calibrate`` for a pack, built from data
sets (``$SPINF_DATA_DIR``, else ``../shared/data`` beside the repository) by the pack's mapping.

    spinf-stream labels --pack spam [--data DIR] [--output FILE] [--rows N]

How a data set's labels answer a pack's questions lives beside the pack, in
``packs/<pack>/data.yaml``, not here::

    target: accuracy                # optional: calibrate --target for the pack (bench/calibrate_packs.py)
    variants: {recall95: recall=0.95}  # optional: more shipped calibrations, other targets (--calibration recall95)
    labelled_only: true             # optional: calibrate with only the labelled questions (--labelled-only)
    robustness:                     # optional: the questions bench/adversarial.py attacks, and the
      spam: {subject: spam, positive: "yes", max_flip_rate: 0.55}  # most answers a manipulation may change
    detectors: {tells_how_to_classify: "yes"}  # optional: questions that detect the attack, with
                                    # the choice that says so (bench/adversarial.py reports their AUC)
    sets:
      - data: sms_spam              # a folder of ../shared/data (its dev.jsonl)
        rows: 1000                  # the first rows of dev.jsonl (a fixed pseudo-random order)
        per_label: 400              # instead of rows: the first 400 rows of each label (equal priors)
        held_out: 50                # with per_label: the next 50 rows of each label are held out, with
                                    # rows: the next 50 rows (never calibrated on: `labels --held-out`)
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

import os
from pathlib import Path
from typing import Any

import orjson
import yaml

from spinf_stream.packs import load_pack

REPO = Path(__file__).resolve().parents[1]


class LabelSetError(ValueError):
    """A pack's mapping or its data cannot make labelled rows: names the file and what is wrong."""


def data_dir(given: str | Path | None = None) -> Path:
    """The data sets' folder: ``given``, else ``$SPINF_DATA_DIR``, else ``../shared/data`` beside the repository."""
    if given is not None:
        return Path(given)
    if os.environ.get("SPINF_DATA_DIR"):
        return Path(os.environ["SPINF_DATA_DIR"])
    return REPO.parent / "shared" / "data"


def mapping_path(pack_file: Path) -> Path:
    return pack_file.parent / pack_file.stem / "data.yaml"


def load_mapping(pack_file: Path) -> list[dict[str, Any]]:
    """The ``sets`` of a pack's ``data.yaml``, checked against the pack's questions and choices."""
    pack = load_pack(pack_file)
    questions = {q.id: q for q in pack.expand()}
    path = mapping_path(pack_file)
    if not path.is_file():
        raise LabelSetError(f"pack {pack.name} has no labelled sets: {path} does not exist")
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    sets = doc.get("sets") if isinstance(doc, dict) else None
    if not isinstance(sets, list) or not sets:
        raise LabelSetError(f"{path}: expected a non-empty list under 'sets'")
    for i, s in enumerate(sets):
        where = f"{path}: sets[{i}]"
        if isinstance(s, dict) and isinstance(s.get("file"), str):
            from spinf_stream.labelled import read_labelled

            read_labelled(path.parent / s["file"], list(questions.values()))  # raises naming a bad row
            continue
        if not isinstance(s.get("data"), str) or not isinstance(s.get("labels", {}), dict):
            raise LabelSetError(f"{where}: needs 'data' (a data set folder) and 'labels' (question: {{label: choice}})")
        for qid, how in (s.get("values") or {}).items():
            q = questions.get(qid)
            if q is None or q.extract is None or q.extract.kind != "text":
                raise LabelSetError(f"{where}.values.{qid}: no text extraction question {qid!r} in {pack_file}")
            if not isinstance(how, dict) or set(how) != {"meta"} or not isinstance(how["meta"], str):
                raise LabelSetError(f"{where}.values.{qid}: expected {{meta: <field of the rows' meta>}}")
        if not s.get("labels") and not s.get("values"):
            raise LabelSetError(f"{where}: needs 'labels' or 'values'")
        for qid, m in s.get("labels", {}).items():
            if qid not in questions:
                raise LabelSetError(f"{where}.labels.{qid}: no question {qid!r} in {pack_file}")
            for label, choice in m.items():
                if not isinstance(choice, str) or choice not in questions[qid].choices:
                    raise LabelSetError(
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


def labelled_rows(pack_file: Path, data_dir: Path, rows_override: int | None = None,
                  held_out: bool = False) -> list[dict[str, Any]]:
    """The labelled rows of a pack's sets (see the module docstring); with ``held_out``, instead the
    rows its ``rows`` and ``per_label`` sets hold out (``held_out`` rows after those taken, per label
    with ``per_label``; files hold out none).

    Raises:
        LabelSetError: a data set cannot be read, or the mapping is wrong (names file and key).
    """
    pack = load_pack(pack_file)
    out = []
    for s in load_mapping(pack_file):
        if held_out and not ((s.get("per_label") or s.get("rows")) and s.get("held_out")):
            continue
        if "file" in s:
            lines = (mapping_path(pack_file).parent / s["file"]).read_bytes().splitlines()
            out.extend(orjson.loads(line) for line in lines[:rows_override] if line.strip())
            continue
        n = rows_override or s.get("rows")
        source = data_dir / s["data"] / "dev.jsonl"
        try:
            lines = source.read_bytes().splitlines()
        except OSError as e:
            raise LabelSetError(f"{mapping_path(pack_file)}: data set {s['data']!r}: cannot read {source} "
                                f"({e.strerror or e}); give --data DIR or set SPINF_DATA_DIR") from None
        taken: dict[str, int] = {}
        if held_out and not s.get("per_label"):
            lines = lines[n:n + s["held_out"]]
        elif n and not s.get("per_label"):
            lines = lines[:n]
        for line in lines:
            row = orjson.loads(line)
            if s.get("per_label"):
                seen = taken[row["label"]] = taken.get(row["label"], 0) + 1
                if (seen > s["per_label"]) != held_out or seen > s["per_label"] + s.get("held_out", 0):
                    continue
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
