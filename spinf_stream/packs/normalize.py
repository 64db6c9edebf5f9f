"""Normalization of a message's field text before it is rendered: what a pack's
``normalize_fields`` names.

- ``none``: the text as written.
- ``nfkc``: Unicode NFKC (compatibility forms: fullwidth ``ＦＲＥＥ``, mathematical ``𝐅𝐑𝐄𝐄``,
  ligatures and superscripts become their plain letters; UAX #15).
- ``latin_lookalikes``: NFKC, then every invisible format character (Unicode category Cf: zero-width
  space and joiners, soft hyphen, word joiner, bidi controls) is removed, then the letters of
  another script drawn like a Latin letter (Unicode's confusables, UTS #39, through the
  ``confusable-homoglyphs`` package) become that Latin letter, in every word that also holds a
  Latin letter, and in every word made only of such letters when the text holds more Latin letters
  than letters of other scripts that are not drawn like Latin ones. Text in another script keeps
  its letters: a Russian sentence is not folded, ``pаypаl`` with Cyrillic ``а`` is.

Every step is a pure function of the text (bit-stable), and none can write a character the
prompt's fence needs that NFKC does not: the pack escapes its delimiters after normalizing.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Literal

NormalizeFields = Literal["none", "nfkc", "latin_lookalikes"]
NORMALIZE_FIELDS: tuple[str, ...] = ("none", "nfkc", "latin_lookalikes")

_WORD = re.compile(r"[^\W\d_]+")


@lru_cache(maxsize=4096)
def _latin_lookalike(ch: str) -> str | None:
    """The one Latin letter ``ch`` (a letter of another script) is drawn like, else ``None``."""
    from confusable_homoglyphs import categories, confusables

    if categories.alias(ch) in ("LATIN", "COMMON"):
        return None
    found = confusables.is_confusable(ch, preferred_aliases=["latin"])
    if not found:
        return None
    for glyph in found[0]["homoglyphs"]:
        c = glyph["c"]
        if len(c) == 1 and glyph["n"].startswith("LATIN ") and c.isalpha():
            return c
    return None


def _is_latin(ch: str) -> bool:
    return ch.isalpha() and unicodedata.name(ch, "").startswith("LATIN ")


def fold_latin_lookalikes(text: str) -> str:
    """``text`` with lookalike letters of other scripts made Latin (module docstring's rule)."""
    latin = sum(1 for ch in text if _is_latin(ch))
    foreign = sum(1 for ch in text if ch.isalpha() and not _is_latin(ch) and _latin_lookalike(ch) is None)
    latin_text = latin > foreign

    def fold(m: re.Match[str]) -> str:
        word = m.group()
        mapped = [_latin_lookalike(ch) if not _is_latin(ch) else None for ch in word]
        if not any(mapped):
            return word
        mixed = any(_is_latin(ch) for ch in word)
        all_lookalike = all(_is_latin(ch) or to is not None for ch, to in zip(word, mapped))
        if mixed or (all_lookalike and latin_text):
            return "".join(to or ch for ch, to in zip(word, mapped))
        return word

    return _WORD.sub(fold, text)


def drop_format_characters(text: str) -> str:
    """``text`` without its characters of Unicode category Cf (invisible format characters)."""
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


def normalize(text: str, how: NormalizeFields) -> str:
    """A field's text as the pack's ``normalize_fields`` says (module docstring).

    Raises:
        ValueError: an unknown ``how``.
    """
    if how == "none":
        return text
    if how == "nfkc":
        return unicodedata.normalize("NFKC", text)
    if how == "latin_lookalikes":
        return fold_latin_lookalikes(drop_format_characters(unicodedata.normalize("NFKC", text)))
    raise ValueError(f"normalize_fields must be one of {', '.join(NORMALIZE_FIELDS)}, got {how!r}")
