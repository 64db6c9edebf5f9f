"""Views of a message: the parts of one field a pack's ``views`` also reads, and the rule that
picks, per question, the read that decides.

A message that argues with the classifier adds text to it: a claim, an instruction, a forged
answer after the message, a header or an everyday paragraph before it. That text cannot lower
what the model says about the sentences it was not part of. A pack with ``views`` therefore also
reads the field cut at its sentence boundaries: its *prefixes* (the text before one of its last
``prefixes`` boundaries) and *suffixes* (the text from one of its first ``suffixes`` boundaries),
each as a message of its own, and answers each of the named binary questions from the read whose
first choice leads most: ``max`` over views of ``logprob(first) - logprob(second)`` (the whole
message wins ties). Nothing is random: a view's scores are those of a message holding its text.

A *sentence boundary* is the index where a sentence starts after ``.``, ``!``, ``?`` or ``…``
(optionally followed by closing quotes or brackets) and whitespace, or after a line break.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_BOUNDARY = re.compile(r"""(?:[.!?\u2026]+["'\u201d\u2019)\]]*[ \t]+|[ \t]*(?:\r\n|\r|\n)\s*)(?=\S)""")


def sentence_starts(text: str) -> list[int]:
    """Char indices in ``text`` where a sentence starts after a boundary (never 0), ascending."""
    return [m.end() for m in _BOUNDARY.finditer(text) if m.end() < len(text)]


@dataclass(frozen=True)
class View:
    """One view of a field: ``text`` is ``field[start:end]`` with the boundary's whitespace trimmed;
    ``name`` is ``prefix:<end>`` or ``suffix:<start>`` (char indices in the field as given)."""

    name: str
    text: str


def views_of(text: str, prefixes: int, suffixes: int) -> list[View]:
    """The views of a field's ``text``: prefixes ending at its last ``prefixes`` sentence
    boundaries (longest first), then suffixes starting at its first ``suffixes`` (longest
    first). A view without a visible character, or equal to one before it, is left out."""
    starts = sentence_starts(text)
    out: list[View] = []
    seen = {text}
    for s in reversed(starts[-prefixes:] if prefixes else []):
        end = len(text[:s].rstrip())
        out.append(View(f"prefix:{end}", text[:end]))
    for s in starts[:suffixes]:
        out.append(View(f"suffix:{s}", text[s:]))
    kept = []
    for v in out:
        if v.text.strip() and v.text not in seen:
            seen.add(v.text)
            kept.append(v)
    return kept


def lead(logprobs: Sequence[float]) -> float:
    """How far a binary question's first choice leads: ``logprobs[0] - logprobs[1]`` (nats)."""
    return logprobs[0] - logprobs[1]


def pick(candidates: Sequence[Sequence[float]]) -> int:
    """Index of the read whose first choice leads most (the first such on ties): the whole
    message comes first, so it decides unless a view leads strictly more."""
    best = 0
    for i in range(1, len(candidates)):
        if lead(candidates[i]) > lead(candidates[best]):
            best = i
    return best
