"""The score's tokenization of a prompt, and whose text each character of it is.

A prompt is one string, tokenized whole (README, "The meaning of a score"). Its characters come
from the pack (preamble, templates, question texts, answer prefix and choices) or from the
message's fields, and ``special_tokens_in_fields`` says what special-token text in the fields is:

- ``plain`` (the default): text. A field holding ``<|im_end|>`` or ``<end_of_turn>`` gets the
  ordinary tokens of those characters, exactly as the tokenizer gives them with
  ``split_special_tokens=True`` (its special added tokens are not matched; its other added tokens
  still are), so a message's author cannot forge a turn of the prompt. Special tokens written
  in the pack's own text keep their meaning: the prompt is cut at them, each piece in between is
  tokenized with ``split_special_tokens=True``, and the pieces are joined by the special tokens'
  ids (this is how the tokenizer itself treats added tokens: it cuts the text at them first).
- ``parse``: the tokenizer's default everywhere: special-token text in a field becomes the
  control token (``transformers``' ``tokenizer(prompt)``).

With no special-token text in the fields the two modes give the same tokens.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenizers import Tokenizer

from spinf_stream.engine.seams import Seams, find_seams

__all__ = ["SPECIAL_TOKENS_IN_FIELDS", "Prompt", "PromptTokenizer", "SpecialTokensInFields"]

SpecialTokensInFields = Literal["plain", "parse"]
SPECIAL_TOKENS_IN_FIELDS: tuple[str, ...] = ("plain", "parse")

#: (start, end, token id) of a control token in a prompt
Control = tuple[int, int, int]

#: The private copy made of each ``transformers`` tokenizer, per mode and vocabulary size: later
#: :class:`PromptTokenizer` s of the same tokenizer and mode share it (seconds for Gemma's 262k
#: vocabulary, once per engine, route and pack otherwise).
_COPIES: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], PromptTokenizer]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Prompt:
    """A prompt's text and the ``[start, end)`` char spans in it that came from message fields."""

    text: str
    fields: tuple[tuple[int, int], ...] = ()

    def __add__(self, pack_text: str) -> Prompt:
        """This prompt followed by text of the pack's own."""
        return Prompt(self.text + pack_text, self.fields)

    def tail(self, start: int) -> Prompt:
        """The prompt from char ``start`` on."""
        spans = tuple((max(a - start, 0), b - start) for a, b in self.fields if b > start)
        return Prompt(self.text[start:], spans)


class PromptTokenizer:
    """Tokenizes prompts by the score's definition, on a private copy of a fast tokenizer.

    Args:
        tokenizer: a ``transformers`` fast tokenizer, whose ``backend_tokenizer`` is copied (a
            second or so for a large vocabulary; once per tokenizer, mode and vocabulary size,
            then shared) so that no one else's use of it changes ours
            (``transformers`` switches the shared backend's ``encode_special_tokens`` on every
            call that passes ``split_special_tokens``); or another :class:`PromptTokenizer`, whose
            copy is shared (cheap; two sharers in different modes must not encode from two threads at once).
        special_tokens_in_fields: ``"plain"`` or ``"parse"`` (module docstring).

    Attributes:
        prefix_ids: the tokens ``add_special_tokens=True`` puts before the text (e.g. ``<bos>``).
        special_ids: ids of the tokenizer's special (control) tokens.
        seams: where its output provably splits (:mod:`spinf_stream.engine.seams`), or None.

    Raises:
        ValueError: an unknown ``special_tokens_in_fields``, or a tokenizer that adds tokens after
            the text (a choice's tokens must extend its prompt's).
    """

    def __init__(self, tokenizer: Any, special_tokens_in_fields: SpecialTokensInFields = "plain") -> None:
        if special_tokens_in_fields not in SPECIAL_TOKENS_IN_FIELDS:
            raise ValueError(
                f"special_tokens_in_fields must be one of {', '.join(SPECIAL_TOKENS_IN_FIELDS)}, "
                f"got {special_tokens_in_fields!r}"
            )
        self.mode: SpecialTokensInFields = special_tokens_in_fields
        if not isinstance(tokenizer, PromptTokenizer):
            try:
                copies = _COPIES.setdefault(tokenizer, {})
            except TypeError:  # not weakly referenceable: a copy of its own
                copies = {}
            key = (special_tokens_in_fields, len(tokenizer))
            if key not in copies:
                copies[key] = PromptTokenizer._copy(tokenizer, special_tokens_in_fields)
            tokenizer = copies[key]
        self._backend = tokenizer._backend
        self.special_ids = tokenizer.special_ids
        self._specials = tokenizer._specials
        self._special_re = tokenizer._special_re
        self._controls = tokenizer._controls
        self.prefix_ids = tokenizer.prefix_ids
        self.seams = tokenizer.seams

    @classmethod
    def _copy(cls, tokenizer: Any, mode: SpecialTokensInFields) -> PromptTokenizer:
        """A :class:`PromptTokenizer` on a fresh copy of ``tokenizer``'s backend."""
        self = cls.__new__(cls)
        self.mode = mode
        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = self.mode == "plain"
        self._backend = backend
        added = backend.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self._specials = {t.content: i for i, t in added.items() if t.special and t.content}
        # leftmost-longest, like the tokenizer's own matching of added tokens
        alternatives = sorted(self._specials, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        self._controls: dict[str, tuple[Control, ...]] = {}
        self.prefix_ids = self._prefix()
        self.seams: Seams | None = find_seams(backend)
        return self

    def _prefix(self) -> tuple[int, ...]:
        prefixes = set()
        for probe in ("a", "Hello\nworld"):
            bare = self._backend.encode(probe, add_special_tokens=False).ids
            full = self._backend.encode(probe, add_special_tokens=True).ids
            if full[len(full) - len(bare) :] != bare:
                raise ValueError(
                    "the tokenizer adds tokens after the text (e.g. an end-of-sequence token); a choice's "
                    "tokens would not extend its prompt's, so logprobs are undefined"
                )
            prefixes.add(tuple(full[: len(full) - len(bare)]))
        if len(prefixes) != 1:
            raise ValueError("the tokenizer's special tokens before the text depend on the text")
        return prefixes.pop()

    # -- control tokens --------------------------------------------------------------------

    def controls(self, prompt: Prompt) -> tuple[Control, ...]:
        """Special tokens in the pack's own text of ``prompt`` (plain mode): ``(start, end, id)``.

        Matched leftmost-longest within each stretch of pack text; an occurrence that runs into
        a field's text is plain text.
        """
        if self._special_re is None:
            return ()
        out: list[Control] = []
        start = 0
        for a, b in (*sorted(prompt.fields), (len(prompt.text), len(prompt.text))):
            if a > start:
                run = prompt.text[start:a]
                out.extend((start + s, start + e, i) for s, e, i in self._run_controls(run))
            start = max(start, b)
        return tuple(out)

    def _run_controls(self, run: str) -> tuple[Control, ...]:
        # pack text repeats across messages: remember it (bounded; it is a cache, not state)
        hit = self._controls.get(run)
        if hit is None:
            assert self._special_re is not None
            hit = tuple((m.start(), m.end(), self._specials[m.group()]) for m in self._special_re.finditer(run))
            if len(self._controls) > 4096:
                self._controls.clear()
            self._controls[run] = hit
        return hit

    # -- encoding --------------------------------------------------------------------------

    def encode(self, prompts: Sequence[Prompt], *, add_special_tokens: bool) -> list[list[int]]:
        """Token ids of each prompt (a list of int lists, same order)."""
        if not prompts:
            return []
        return [ids for ids, _ in self._encode(prompts, add_special_tokens, offsets=False)]

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token can stand for: the longest vocabulary entry (an upper
        bound: a byte-level or byte-fallback entry is at least as long as its text)."""
        return max((len(t) for t in self._backend.get_vocab(with_added_tokens=True)), default=1)

    def prefix_chars(self, text: str, n_tokens: int) -> int:
        """Characters of ``text`` that its first ``n_tokens`` tokens cover, ``text`` tokenized alone
        as plain text (``len(text)`` when it has fewer). Reads at most ``n_tokens`` x
        :attr:`max_token_chars` characters of it: the time does not grow with the rest."""
        head = text[: n_tokens * self.max_token_chars + 1]
        e = self._backend.encode(head, add_special_tokens=False)
        if len(e.ids) <= n_tokens:
            return len(text) if len(head) == len(text) else len(head)
        return e.offsets[n_tokens][0]

    def encode_with_offsets(self, prompt: Prompt, *, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``prompt`` and each token's ``[start, end)`` chars (``(0, 0)`` for added
        special tokens such as ``<bos>``)."""
        ((ids, offs),) = self._encode([prompt], add_special_tokens, offsets=True)
        return ids, offs

    def _encode(
        self, prompts: Sequence[Prompt], add_special_tokens: bool, offsets: bool
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        controls = [self.controls(p) if self.mode == "plain" else () for p in prompts]
        whole = [p.text for p, c in zip(prompts, controls) if not c]
        done = iter(self._batch(whole, add_special_tokens, offsets))
        out = []
        for p, c in zip(prompts, controls):
            out.append(next(done) if not c else self._assemble(p.text, c, add_special_tokens, offsets))
        return out

    def _batch(self, texts: list[str], add_special_tokens: bool, offsets: bool) -> list[tuple[list[int], list[tuple[int, int]]]]:
        if not texts:
            return []
        plain = self.mode == "plain"
        if self._backend.encode_special_tokens != plain:  # a write while another thread encodes would fail
            self._backend.encode_special_tokens = plain
        if len(texts) == 1:  # no thread pool for one text
            e = self._backend.encode(texts[0], add_special_tokens=add_special_tokens)
            return [(e.ids, e.offsets if offsets else [])]
        if offsets:
            return [(e.ids, e.offsets) for e in self._backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        fast = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [(e.ids, []) for e in fast(texts, add_special_tokens=add_special_tokens)]

    def _assemble(
        self, text: str, controls: Sequence[Control], add_special_tokens: bool, offsets: bool
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Cut ``text`` at the pack's control tokens; tokenize the pieces between as plain text."""
        pieces: list[tuple[int, str]] = []
        start = 0
        for a, b, _ in controls:
            pieces.append((start, text[start:a]))
            start = b
        pieces.append((start, text[start:]))
        encoded = self._batch([t for _, t in pieces if t], False, offsets)
        ids: list[int] = list(self.prefix_ids) if add_special_tokens else []
        offs: list[tuple[int, int]] = [(0, 0)] * len(ids)
        parts = iter(encoded)
        for n, (at, piece) in enumerate(pieces):
            if piece:
                p_ids, p_offs = next(parts)
                ids.extend(p_ids)
                offs.extend((at + s, at + e) for s, e in p_offs)
            if n < len(controls):
                a, b, cid = controls[n]
                ids.append(cid)
                offs.append((a, b))
        return ids, offs if offsets else []
