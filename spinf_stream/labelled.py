"""Labelled input of ``evaluate`` and ``calibrate``.

JSON Lines, each row a message (``id`` and
the fields the pack uses, as for ``score``) plus the right choice of any of the pack's questions::

    {"id": "sms-1", "text": "WIN a prize! Call now", "labels": {"spam": "yes"}}

A row whose ``labels`` name an unknown question or choice is an error naming its line, id and
key (all such errors are reported together); a row without labels is skipped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from .messages import Message
from .packs import ExpandedQuestion
from spinf_stream.engine.results import ErrorRecord

#: errors listed in one LabelledInputError before "... and N more"
_MAX_LISTED = 10


class LabelledInputError(ValueError):
    """The labelled file is unusable: lists each bad row (line, id, key) and what is wrong."""

    def __init__(self, path: str | Path, problems: Sequence[str]):
        self.problems = list(problems)
        shown = self.problems[:_MAX_LISTED]
        more = len(self.problems) - len(shown)
        text = f"labelled input {path}: " + ("; ".join(shown) if len(shown) == 1 else "\n  " + "\n  ".join(shown))
        if more:
            text += f"\n  ... and {more} more"
        super().__init__(text)


@dataclass(frozen=True)
class LabelledRow:
    """One labelled message: its 1-based ``line``, the :class:`Message`, and ``labels``
    (question id → index of the right choice in that question's choices)."""

    line: int
    message: Message
    labels: dict[str, int]


@dataclass(frozen=True)
class LabelledSet:
    rows: list[LabelledRow]
    skipped_unlabelled: int
    lines: int


def read_labelled(path: str | Path, questions: Sequence[ExpandedQuestion]) -> LabelledSet:
    """Read ``path`` against a pack's (expanded) questions.

    Raises:
        LabelledInputError: a line that is not a JSON object with an ``id``, ``labels`` that is not
            an object of strings, or a label naming an unknown question or choice.
        OSError: the file cannot be read.
    """
    from spinf_stream.cli.offline import parse_line

    by_id = {q.id: q for q in questions}
    rows: list[LabelledRow] = []
    problems: list[str] = []
    skipped = 0
    n = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            parsed = parse_line(raw, n)
            if isinstance(parsed, ErrorRecord):
                problems.append(parsed.error.message)
                continue
            where = f"line {n} (id {parsed.id!r})"
            labels = parsed.fields.get("labels")
            if labels is None or labels == {}:
                skipped += 1
                continue
            if not isinstance(labels, dict):
                problems.append(f"{where}: 'labels' must be an object of question id → choice, got {type(labels).__name__}")
                continue
            indexed: dict[str, int] = {}
            for qid, choice in labels.items():
                q = by_id.get(qid)
                if q is None:
                    problems.append(f"{where}: labels.{qid}: no question {qid!r} in the pack")
                elif not isinstance(choice, str):
                    problems.append(f"{where}: labels.{qid}: the choice must be a string, got {orjson.dumps(choice).decode()}")
                elif q.extract is not None:
                    problems.append(f"{where}: labels.{qid}: {qid!r} is an extraction question; evaluate and calibrate "
                                    f"take labels of choice questions only")
                elif choice not in q.choices:
                    problems.append(f"{where}: labels.{qid}: {choice!r} is not a choice of {qid!r} ({', '.join(q.choices)})")
                else:
                    indexed[qid] = q.choices.index(choice)
            if len(indexed) == len(labels):
                fields = {k: v for k, v in parsed.fields.items() if k != "labels"}
                rows.append(LabelledRow(n, Message(id=parsed.id, fields=fields), indexed))
    if problems:
        raise LabelledInputError(path, problems)
    return LabelledSet(rows, skipped, n)
