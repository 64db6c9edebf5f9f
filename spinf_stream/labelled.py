"""Labelled input of ``evaluate`` and ``calibrate``.

JSON Lines, each row a message (``id`` and
the fields the pack uses, as for ``score``) plus the right answer of any of the pack's questions::

    {"id": "sms-1", "text": "WIN a prize! Call now", "labels": {"spam": "yes"}}
    {"id": "sms-2", "text": "Pay £250 now", "labels": {"amount": {"value": 250, "currency": "GBP"}}}

A choice question's label is one of its choices. An extraction question's label is what it should
extract, or ``null`` when the message holds no such value (the right answer is the none word):
``number`` a JSON number (``3.5`` for "3.5%"); ``money`` ``{"value": number, "currency": "ISO
code"}`` (``currency`` optional: then only the amount is compared); ``text`` a string or a list of
strings, any of which is right (compared by :func:`spinf_stream.quality.same_text`). Generation
questions take no labels.

A row whose ``labels`` name an unknown question or choice is an error naming its line, id and
key (all such errors are reported together); a row without labels is skipped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
class Expected:
    """The right answer of an extraction question: ``none`` (the message holds no such value), or
    ``value`` (number, money: float) with ``currency`` (money: ISO code or None = not compared),
    or ``texts`` (text: any of them is right)."""

    none: bool = False
    value: float | None = None
    currency: str | None = None
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelledRow:
    """One labelled message: its 1-based ``line``, the :class:`Message`, ``labels`` (choice
    question id → index of the right choice in that question's choices) and ``expected``
    (extraction question id → :class:`Expected`)."""

    line: int
    message: Message
    labels: dict[str, int]
    expected: dict[str, Expected] = field(default_factory=dict)

    @property
    def questions(self) -> list[str]:
        """Every question this row labels, choice and extraction."""
        return [*self.labels, *self.expected]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _expected(kind: str, label: Any) -> Expected | str:
    """The :class:`Expected` of an extraction label, or what is wrong with it."""
    if label is None:
        return Expected(none=True)
    if kind == "number":
        return Expected(value=float(label)) if _number(label) else f"a number question's label is a JSON number or null, got {orjson.dumps(label).decode()}"
    if kind == "money":
        if not isinstance(label, dict) or not _number(label.get("value")) or set(label) - {"value", "currency"}:
            return f'a money question\'s label is {{"value": number, "currency": "ISO code"}} or null, got {orjson.dumps(label).decode()}'
        cur = label.get("currency")
        if cur is not None and not (isinstance(cur, str) and len(cur) == 3 and cur.isascii() and cur.isupper()):
            return f"currency {orjson.dumps(cur).decode()} is not an ISO 4217 code (three capital letters)"
        return Expected(value=float(label["value"]), currency=cur)
    if kind == "text":
        texts = [label] if isinstance(label, str) else label
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            return f"a text question's label is a non-empty string, a list of them, or null, got {orjson.dumps(label).decode()}"
        return Expected(texts=tuple(texts))
    return "a generate question takes no labels (there is no right text to compare with)"


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
            expected: dict[str, Expected] = {}
            for qid, choice in labels.items():
                q = by_id.get(qid)
                if q is None:
                    problems.append(f"{where}: labels.{qid}: no question {qid!r} in the pack")
                elif q.extract is not None:
                    got = _expected(q.extract.kind, choice)
                    if isinstance(got, str):
                        problems.append(f"{where}: labels.{qid}: {got}")
                    else:
                        expected[qid] = got
                elif not isinstance(choice, str):
                    problems.append(f"{where}: labels.{qid}: the choice must be a string, got {orjson.dumps(choice).decode()}")
                elif choice not in q.choices:
                    problems.append(f"{where}: labels.{qid}: {choice!r} is not a choice of {qid!r} ({', '.join(q.choices)})")
                else:
                    indexed[qid] = q.choices.index(choice)
            if len(indexed) + len(expected) == len(labels):
                fields = {k: v for k, v in parsed.fields.items() if k != "labels"}
                rows.append(LabelledRow(n, Message(id=parsed.id, fields=fields), indexed, expected))
    if problems:
        raise LabelledInputError(path, problems)
    return LabelledSet(rows, skipped, n)
