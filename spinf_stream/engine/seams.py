r"""Seams: places in a prompt where the tokenizer's output provably splits.

A *seam* of a string ``s`` is a char position ``p`` with ``s[p-1] == "\n"`` and ``s[p]`` a
letter, digit, punctuation mark or symbol (Unicode category ``L*``, ``N*``, ``P*`` or ``S*``) that
no vocabulary entry puts right after a newline (and, for the GPT-2 pattern, ``s[p-2]`` no space:
see 3a). For the tokenizer pipelines :func:`find_seams` accepts, and any two strings ``s``,
``s2`` that agree on ``s[:p+1]``:

    encode(s2) == encode(s)[:j] + encode(s2[p:], add_special_tokens=False)

where ``j`` counts the tokens of ``encode(s)`` that end at or before ``p``. So a prompt's tokens up
to a seam are shared by every prompt that agrees with it one character past the seam, and its
tokens after the seam are those of the rest tokenized alone. :mod:`spinf_stream.engine.segment` uses
this to tokenize each question's tail alone and still get exactly the whole prompt's tokens.

Why it holds, stage by stage of a Hugging Face ``tokenizers`` pipeline:

1. **Added tokens** are matched first, leftmost-longest, and cut the text into segments. None may
   strip neighbouring spaces (``lstrip``/``rstrip``/``single_word``), and none may contain a
   newline followed by the seam's character; so no match spans ``p``, the matches before ``p``
   depend on ``s[:p]`` only, and the scan starts afresh at ``p``.
2. **Normalizer**: none; ``Replace`` of one character by one character (e.g. Gemma's
   ``" " -> "▁"``), which acts char by char; or NFC (Qwen2), for which a newline is always a
   boundary (it has no decomposition, composes with nothing, and as a starter stops canonical
   reordering). Either way ``norm(s) = norm(s[:p]) + norm(s[p:])``, and the seam's character is
   checked in its normalized form too.
3. **Pre-tokenizer**, one of:

   a. the GPT-2 pattern (``ByteLevel`` with ``use_regex``) or the Llama 3 / Qwen2 pattern (a
      ``Split`` before ``ByteLevel``). In both, every alternative that can take a newline takes
      only whitespace (or, for ``[^\s\p{L}\p{N}]+[\r\n]*``, ends with its newlines), and the
      only look-around is ``(?!\S)``, one character ahead. So no piece holds ``"\n"`` followed by a
      non-space character, every scan has a piece boundary at ``p``, the searches before ``p`` read
      no further than ``s[p]``, and the search at ``p`` is a fresh start (no look-behind). Each
      piece is then byte-mapped on its own. One more case: an added token may start at ``p`` in
      one string and not in the other, so the scan before ``p`` may meet the end of its text
      there instead of ``s[p]``. For the Llama 3 / Qwen2 pattern that changes nothing (a space run
      ending in a newline is taken whole by ``\s*[\r\n]+``, which has no look-ahead), but GPT-2's
      ``\s+(?!\S)`` takes a run of two or more spaces whole before the end of the text and leaves
      its last newline alone before a non-space character; so with that pattern the newline at
      ``p-1`` must follow a character that is no space (or start the string).
   b. none, or a ``Split`` on one whitespace character other than a newline: pieces are cut at
      fixed characters, so the pieces of ``s[p:]`` are those of ``s`` after ``p``, with the piece
      that crosses ``p`` (if any) cut at ``p`` — which stage 4 shows changes nothing.
4. **Model**: BPE without dropout, applied to each piece. Each step merges the lowest-ranked
   adjacent pair (leftmost on ties). A merge across ``p`` would make a vocabulary entry that
   holds a newline followed by ``s[p]``, which (in case 3b) the vocabulary has none of; so every
   step merges a pair on one side of ``p``, and each side goes through exactly the merges it goes
   through alone. (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword
   Units", for BPE; the independence argument is the one behind GitHub's ``bpe`` crate,
   ``github/rust-gems``, "Corollary II".) In case 3a pieces never cross ``p``.
5. **Post-processor**: adds tokens before the text only (checked by
   :class:`spinf_stream.engine.tokenizer.PromptTokenizer`, which tokenizes tails without them).

Any other pipeline (a ``Prepend``/``Metaspace`` that adds a space at the start of every piece of
text, NFKC, WordPiece, Unigram, another regex, ...) has no seams here: every question's prompt is
then tokenized whole, which is exact and slower.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer
from tokenizers.models import BPE

__all__ = ["Seams", "find_seams"]

# Pre-tokenizer patterns read for stage 3a. ``ByteLevel`` with ``use_regex`` splits on GPT-2's
#   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# (fixed in the tokenizers library); a ``Split`` must carry one of these exact strings:
SPLIT_PATTERNS = frozenset({
    # Qwen2 / Qwen2.5 / Qwen3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
})


@dataclass(frozen=True)
class Seams:
    """The seams of one tokenizer (build with :func:`find_seams`).

    ``replace`` maps a character to what a ``Replace`` normalizer makes of it; ``nfc`` says the
    normalizer is NFC instead; ``blocked`` holds the characters that some added token (or, for a
    pipeline without a regex pre-tokenizer, some vocabulary entry) puts after a newline.
    """

    replace: dict[str, str]
    nfc: bool
    blocked: frozenset[str]
    lone_newline: bool = False

    def is_seam(self, text: str, p: int) -> bool:
        """Whether char position ``p`` of ``text`` is a seam (``0 < p < len(text)``)."""
        if not 0 < p < len(text) or text[p - 1] != "\n":
            return False
        if self.lone_newline and p > 1 and not _no_space(text[p - 2]):
            return False
        c = text[p]
        n = unicodedata.normalize("NFC", c)[0] if self.nfc else self.replace.get(c, c)
        # A starter that is no kind of space, raw and normalized; added tokens may be matched
        # before or after normalizing, so neither form may follow a newline in one.
        return all(
            unicodedata.category(x)[0] in "LNPS" and not unicodedata.combining(x) and x not in self.blocked
            for x in (c, n)
        )

    def last(self, text: str, end: int) -> int | None:
        """The last seam ``p`` of ``text`` with ``p < end`` (so ``text[:p+1]`` lies in ``text[:end]``), or None."""
        i = text.rfind("\n", 0, max(end - 1, 0))
        while i >= 0:
            if self.is_seam(text, i + 1):
                return i + 1
            i = text.rfind("\n", 0, i)
        return None


def find_seams(tokenizer: Tokenizer) -> Seams | None:
    """Seams of a ``tokenizers.Tokenizer``, or None when its pipeline is not one the module
    docstring's argument covers."""
    model = tokenizer.model
    if not isinstance(model, BPE) or model.dropout not in (None, 0, 0.0):
        return None
    norm = _state(tokenizer.normalizer)
    nfc = norm is not None and norm.get("type") == "NFC"
    replace = {} if nfc else _char_replacements(norm)
    if replace is None:
        return None
    pre = _state(tokenizer.pre_tokenizer)
    regex_split = _is_known_regex(pre)
    if not regex_split and (nfc or not _is_char_split(pre)):
        return None  # NFC composes characters: we argue stage 4 for char-by-char normalizers only
    blocked: set[str] = set()
    for tok in tokenizer.get_added_tokens_decoder().values():
        if tok.lstrip or tok.rstrip or tok.single_word:
            return None
        blocked |= _after_newline(tok.content)
    if not regex_split:
        # Stage 4 in case 3b: merges must never join a newline to what follows it.
        if model.continuing_subword_prefix or model.end_of_word_suffix:
            return None
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        if "\n" not in vocab and not model.byte_fallback:
            return None  # an unknown newline could fuse with an unknown neighbour
        for entry in vocab:
            if "\n" in entry:
                blocked |= _after_newline(entry)
    gpt2 = pre is not None and pre.get("type") == "ByteLevel"
    return Seams(replace, nfc, frozenset(blocked), lone_newline=gpt2)


def _state(component: Any) -> dict[str, Any] | None:
    """A pipeline component as its tokenizer.json entry (None for no component)."""
    if component is None:
        return None
    state: dict[str, Any] = json.loads(component.__getstate__())
    return state


def _no_space(c: str) -> bool:
    """Surely not matched by a regex's ``\\s``, whatever its Unicode tables (no Z*, C* category)."""
    return unicodedata.category(c)[0] in "LNPSM" and not c.isspace()


def _after_newline(text: str) -> set[str]:
    return {text[i + 1] for i in range(len(text) - 1) if text[i] == "\n"}


def _char_replacements(norm: dict[str, Any] | None) -> dict[str, str] | None:
    """``{char: replacement}`` for a normalizer that maps characters one to one, else None."""
    if norm is None:
        return {}
    steps = norm["normalizers"] if norm.get("type") == "Sequence" else [norm]
    out: dict[str, str] = {}
    for step in steps:
        pattern = (step.get("pattern") or {}).get("String") if step.get("type") == "Replace" else None
        content = step.get("content")
        if pattern is None or len(pattern) != 1 or not isinstance(content, str) or len(content) != 1:
            return None
        if "\n" in (pattern, content):
            return None
        # compose with earlier steps
        out = {k: (content if v == pattern else v) for k, v in out.items()}
        out.setdefault(pattern, content)
    return out


def _is_known_regex(pre: dict[str, Any] | None) -> bool:
    if pre is None:
        return False
    if pre.get("type") == "ByteLevel":
        return bool(pre.get("use_regex", True)) and not pre.get("add_prefix_space")
    if pre.get("type") != "Sequence":
        return False
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return False
    split, byte_level = steps
    return (
        split.get("type") == "Split"
        and (split.get("pattern") or {}).get("Regex") in SPLIT_PATTERNS
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level.get("type") == "ByteLevel"
        and not byte_level.get("use_regex", True)
        and not byte_level.get("add_prefix_space")
    )


def _is_char_split(pre: dict[str, Any] | None) -> bool:
    if pre is None:
        return True
    if pre.get("type") != "Split" or pre.get("invert"):
        return False
    lit = (pre.get("pattern") or {}).get("String")
    return isinstance(lit, str) and len(lit) == 1 and lit.isspace() and lit != "\n"
