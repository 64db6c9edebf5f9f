"""The human view of score records: one table row per message and a summary of the answers.

Reads records as plain JSON objects (``score``, ``stream_score``, ``error`` and ``dlq`` records,
see ``schemas/``), so the offline ``score`` and the stream's ``dev`` share it. Printed with
``rich``; the records themselves stay the JSON Lines contract.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

#: questions shown as columns of their own; a pack with more gets one "answers" column
MAX_QUESTION_COLUMNS = 6
#: questions listed in the summary (the rest are counted)
MAX_SUMMARY_QUESTIONS = 12
#: characters of a message's text shown
TEXT_CHARS = 48


def answer_cell(score: Mapping[str, Any]) -> str:
    """One question's answer and how sure it is: ``yes 0.86`` (calibrated when there is one),
    an extraction's value ``£250 0.89`` or ``none 0.97``."""
    if "kind" in score:  # an extraction or generation
        answer = score.get("answer")
        if answer is None:
            p = score.get("none_calibrated", score.get("none_probability"))
            return "none" if p is None else f"none {p:.2f}"
        return f"{answer} {score['probability']:.2f}"
    chosen = score["choices"][score["answer"]]
    p = chosen.get("calibrated", chosen["probability"])
    cell = f"{score['answer']} {p:.2f}"
    if "threshold" in score:  # the rule, on the first choice: "no 0.98 (yes if ≥0.24)"
        cell += f" ({next(iter(score['choices']))} if ≥{score['threshold']:.2f})"
    return cell


def _short(text: str | None, n: int = TEXT_CHARS) -> str:
    if not text:
        return ""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= n else one_line[: n - 1] + "…"


@dataclass
class ResultsView:
    """Collects records (in the order given) for :meth:`table` and :meth:`summary`.

    ``questions``: the pack's question ids, in pack order (the columns). ``keep_rows=False``
    counts for the summary only (memory stays flat on a file of millions of lines).
    """

    questions: Sequence[str]
    keep_rows: bool = True
    n_rows: int = 0
    rows: list[tuple[str, str, dict[str, Any] | None, str | None]] = field(default_factory=list)
    answers: dict[str, Counter[str]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, record: Mapping[str, Any], text: str | None = None) -> None:
        """One record (a plain JSON object) and the message's text (``None``: not known)."""
        rid = str(record.get("id") or _source_name(record.get("source")) or "?")
        self.n_rows += 1
        if "error" in record:
            err = record["error"]
            self.errors[err["kind"]] += 1
            if self.keep_rows:
                self.rows.append((rid, _short(text), None, f"{err['kind']}: {err['message']}"))
            return
        scores = record["scores"]
        for qid, s in scores.items():
            key = "none" if "kind" in s and s.get("answer") is None else ("value" if "kind" in s else s["answer"])
            self.answers.setdefault(qid, Counter())[key] += 1
        if self.keep_rows:
            self.rows.append((rid, _short(text), dict(scores), None))

    def table(self) -> Table:
        """The rows as a ``rich`` table: id, text, one column per question (or one "answers"
        column for a pack of more than :data:`MAX_QUESTION_COLUMNS` questions), errors."""
        t = Table(show_lines=False, header_style="bold")
        t.add_column("id", no_wrap=True)
        t.add_column("text", overflow="fold", max_width=TEXT_CHARS)
        wide = len(self.questions) > MAX_QUESTION_COLUMNS
        cols = ["answers"] if wide else list(self.questions)
        for c in cols:
            t.add_column(c, overflow="fold")
        for rid, text, scores, error in self.rows:
            if error is not None:
                t.add_row(rid, text, Text(f"error: {error}", style="red"), *[""] * (len(cols) - 1))
            elif wide:
                assert scores is not None
                t.add_row(rid, text, "; ".join(f"{q}: {answer_cell(s)}" for q, s in scores.items()))
            else:
                assert scores is not None
                t.add_row(rid, text, *(answer_cell(scores[q]) if q in scores else "" for q in cols))
        return t

    def summary(self, seconds: float | None = None, messages: int | None = None) -> list[str]:
        """Lines: answers per question (``spam: 5 yes / 7 no``), errors by kind, throughput."""
        lines = []
        shown = [q for q in self.questions if q in self.answers]
        for q in shown[:MAX_SUMMARY_QUESTIONS]:
            counts = self.answers[q]
            lines.append(f"{q}: " + " / ".join(f"{n} {a}" for a, n in counts.most_common()))
        if len(shown) > MAX_SUMMARY_QUESTIONS:
            lines.append(f"... and {len(shown) - MAX_SUMMARY_QUESTIONS} more questions")
        n_err = sum(self.errors.values())
        lines.append(
            f"errors: {n_err}" + (" (" + ", ".join(f"{n} {k}" for k, n in self.errors.most_common()) + ")" if n_err else "")
        )
        scored = self.n_rows - n_err
        if seconds is not None and seconds > 0:
            done = messages if messages is not None else scored
            lines.append(f"{done} messages in {seconds:.1f} s: {done / seconds:.1f} messages/s, "
                         f"{done * len(self.questions) / seconds:.1f} questions/s")
        return lines

    def print(self, console: Console, seconds: float | None = None) -> None:
        """The table, then the summary."""
        console.print(self.table())
        for line in self.summary(seconds):
            console.print(line, highlight=False, markup=False)


def _source_name(source: Any) -> str | None:
    if isinstance(source, Mapping) and {"topic", "partition", "offset"} <= set(source):
        return f"{source['topic']}:{source['partition']}:{source['offset']}"
    return None
