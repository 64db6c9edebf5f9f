"""Prompt packs: a YAML file → a validated :class:`Pack`; placeholder expansion; rendering.

- ``pack``: the schema (:class:`Pack`, :class:`QuestionSpec`, :class:`ExpandedQuestion`), templates,
  expansion and rendering; the file format is described there.
- ``load``: YAML text, a file or a bare name → :class:`Pack` (:func:`parse_pack`,
  :func:`load_pack`, :func:`packs_dirs`), or a :class:`PackError`.
"""

from spinf_stream.packs.load import PackError, load_pack, packs_dirs, parse_pack
from spinf_stream.packs.pack import MAX_QUESTIONS, NAME_PATTERN, ExpandedQuestion, Pack, QuestionSpec

__all__ = [
    "MAX_QUESTIONS", "NAME_PATTERN", "ExpandedQuestion", "Pack", "PackError", "QuestionSpec", "load_pack", "packs_dirs",
    "parse_pack",
]
