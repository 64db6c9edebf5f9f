"""Constrained decoding by kind: which tokens may come next while a model writes a number, an
amount of money or a line of text after a question's answer cue, and the value it wrote.

Each kind is a regular language over UTF-8 *bytes* (an ``interegular`` FSM over latin-1
characters, one per byte), so a character split over several tokens (``€`` as two byte tokens)
is followed byte by byte. :meth:`TokenGrammar.build` walks every token of a vocabulary through
it once, breadth first from the start, and keeps per reachable state the sorted allowed ids and
the next state of each; decoding is then table look-ups.

The languages (leading spaces allowed in every kind, and never part of the answer):

- ``number``: ``[-+−]? N %?`` where ``N`` is digits with an optional decimal part (``.`` or
  ``,``), or thousands groups ``1-3 digits (S 3 digits)+`` with one separator ``S`` (``,`` ``.``
  thin space, narrow no-break space) and a decimal part with ``.`` (``,`` when ``S`` is ``.``).
  Three digits after one separator read as thousands (``1,000`` is 1000.0); a first group of
  ``0`` is no thousands group (``0.125`` is 0.125).
- ``money``: ``[-+−]?`` then a currency and ``N`` in either order, one optional space between;
  words (``dollars``, ``rupees``, ...) only after the amount. ``N`` may carry a scale: `` thousand``
  `` million`` `` billion`` `` trillion`` (after one space) or ``k`` ``m`` ``bn`` ``tn`` (right
  after the digits): ``£2.3bn`` is 2.3e9 GBP.
- ``text``: any tokens, ended by the stop string (also when it falls inside a token).
- the none word (``GrammarSpec.none``) as the whole answer, in every kind: no such value.
"""

from __future__ import annotations

import functools
import json
import re
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = ["KINDS", "Extracted", "GrammarSpec", "Kind", "TokenGrammar", "token_bytes"]

Kind = Literal["text", "number", "money"]
KINDS: tuple[str, ...] = ("text", "number", "money")

SIGNS = ("-", "+", "\u2212")
#: thousands separator -> the decimal mark that goes with it
THOUSANDS = {",": ".", ".": ",", "\u2009": ".", "\u202f": "."}
#: a money amount's scale -> its power of ten (long words after one space, short ones right after the digits)
SCALES = {" thousand": 3, " million": 6, " billion": 9, " trillion": 12, "k": 3, "m": 6, "bn": 9, "tn": 12}
from spinf_stream.currencies import CODES, SYMBOLS, WORDS  # noqa: E402  (shared with the pack check)


@dataclass(frozen=True)
class GrammarSpec:
    """What one extraction question's answer may be.

    Raises:
        ValueError: an unknown ``kind``, an empty ``stop`` or ``none``, a none word holding the
            stop string, or a ``currency_default`` that is not three capital letters.
    """

    kind: Kind
    none: str | None = "none"
    stop: str = "\n"
    currency_default: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if not self.stop:
            raise ValueError("the stop string must not be empty")
        if self.none is not None and (not self.none or self.stop in self.none):
            raise ValueError(f"none word {self.none!r} is empty or holds the stop string {self.stop!r}")
        if self.currency_default is not None and not re.fullmatch(r"[A-Z]{3}", self.currency_default):
            raise ValueError(f"currency_default {self.currency_default!r} is not an ISO 4217 code")


@dataclass(frozen=True)
class Extracted:
    """An answer as written (leading spaces stripped) and its value.

    ``answer`` and ``value`` are None for the none word; ``value`` is None also for a value that
    never completed. ``value``: float (number, money) or the text (text); ``currency``: an ISO
    4217 code, money only.
    """

    answer: str | None
    value: float | str | None
    currency: str | None = None


# --- token bytes -----------------------------------------------------------------------------


@functools.cache
def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character -> byte (``bytes_to_unicode``, openai/gpt-2 encoder.py)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _decoder_types(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        for value in node.values():
            found |= _decoder_types(value)
        return found
    if isinstance(node, list):
        return set().union(*map(_decoder_types, node)) if node else set()
    return set()


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any) -> list[bytes]:
    """Every token id's bytes (index = id, ``len(tokenizer)`` entries) of a fast HF tokenizer.

    Byte-level BPE (GPT-2 byte map: SmolLM2, Qwen) or SentencePiece-style pieces (``▁`` = space,
    ``<0xNN>`` byte-fallback tokens: Gemma 3). Special added tokens (and ids without a token)
    give ``b""``; other added tokens their text.

    Raises:
        ValueError: not a fast tokenizer, or a decoder of neither style.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{type(tokenizer).__name__} is no fast tokenizer (no backend_tokenizer)")
    decoder = backend.decoder
    types = _decoder_types(json.loads(decoder.__getstate__())) if decoder is not None else set()
    byte_level = "ByteLevel" in types
    if not byte_level and not types & {"Metaspace", "Replace", "ByteFallback"}:
        raise ValueError(f"token bytes of a tokenizer with decoder {sorted(types)} are not known")
    byte_fallback = "ByteFallback" in types
    gpt2 = _gpt2_byte_decoder()
    added = tokenizer.added_tokens_decoder
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        extra = added.get(i)
        if extra is not None:
            out.append(b"" if extra.special else extra.content.encode())
        elif piece is None:
            out.append(b"")
        elif byte_level:
            try:
                out.append(bytes(gpt2[c] for c in piece))
            except KeyError:
                raise ValueError(f"token {i} {piece!r} is not in the GPT-2 byte map") from None
        elif byte_fallback and (m := _BYTE_PIECE.fullmatch(piece)):
            out.append(bytes([int(m.group(1), 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


# --- the languages -----------------------------------------------------------------------------


def _lit(text: str) -> str:
    """``text`` as a byte-level pattern: each UTF-8 byte one escaped latin-1 character."""
    return "".join(f"\\x{b:02x}" for b in text.encode())


def _alt(options: Iterable[str]) -> str:
    return "(?:" + "|".join(_lit(o) for o in sorted(options, key=lambda o: (-len(o), o))) + ")"


def _amount() -> str:
    """``N`` (see the module docstring) as a byte-level pattern."""
    digits = "[0-9]"
    forms = [f"{digits}+(?:[.,]{digits}+)?"]
    for sep, mark in THOUSANDS.items():
        forms.append(f"[1-9]{digits}{{0,2}}(?:{_lit(sep)}{digits}{{3}})+(?:{_lit(mark)}{digits}+)?")
    return "(?:" + "|".join(forms) + ")"


def _pattern(spec: GrammarSpec) -> str:
    sign = _alt(SIGNS) + "?"
    if spec.kind == "number":
        value = f"{sign}{_amount()}%?"
    else:
        before = _alt([*SYMBOLS, *CODES])
        after = _alt([*SYMBOLS, *CODES, *WORDS])
        amount = f"{_amount()}{_alt(SCALES)}?"
        value = f"{sign}(?:{before} ?{amount}|{amount} ?{after})"
    if spec.none is not None:
        value = f"(?:{value}|{_lit(spec.none)})"
    return " *" + value


class _ByteDFA:
    """An FSM as dense tables: ``next[state][byte]`` (-1 = dead), states that can reach a final."""

    def __init__(self, pattern: str) -> None:
        import interegular  # here: text and generate grammars (bench/gpu_check.py) need no FSM

        fsm = interegular.parse_pattern(pattern).to_fsm()
        index = {s: i for i, s in enumerate(sorted(fsm.states))}
        table = [[-1] * 256 for _ in index]
        for s, moves in fsm.map.items():
            for b in range(256):
                key = fsm.alphabet[chr(b)]
                if key is not None and key in moves:
                    table[index[s]][b] = index[moves[key]]
        finals = {index[s] for s in fsm.finals}
        live = set(finals)  # states from which a final state can be reached
        grew = True
        while grew:
            grew = False
            for s, row in enumerate(table):
                if s not in live and any(t in live for t in row):
                    live.add(s)
                    grew = True
        self.next = [[t if t in live else -1 for t in row] for row in table]
        self.start = index[fsm.initial]
        self.finals = frozenset(finals)
        #: every byte some live transition reads
        self.alphabet = bytes(sorted({b for row in self.next for b in range(256) if row[b] >= 0}))

    def walk(self, state: int, data: bytes) -> int:
        for b in data:
            state = self.next[state][b]
            if state < 0:
                return -1
        return state


@functools.lru_cache(maxsize=16)
def _byte_dfa(pattern: str) -> _ByteDFA:
    return _ByteDFA(pattern)


# --- values ------------------------------------------------------------------------------------


def _amount_value(body: str, exponent: int = 0) -> float:
    """``N`` times ``10**exponent``, rounded once (``float("2.3e9")``, not ``2.3 * 1e9``)."""
    for sep, mark in THOUSANDS.items():
        if re.fullmatch(rf"[1-9][0-9]{{0,2}}(?:{re.escape(sep)}[0-9]{{3}})+(?:{re.escape(mark)}[0-9]+)?", body):
            return float(f"{body.replace(sep, '').replace(mark, '.')}e{exponent}")
    return float(f"{body.replace(',', '.')}e{exponent}")


def _value(spec: GrammarSpec, answer: str) -> tuple[float, str | None]:
    """Value and currency of an answer the grammar accepts."""
    sign = -1.0 if answer[0] in ("-", "\u2212") else 1.0
    body = answer[1:] if answer[0] in SIGNS else answer
    if spec.kind == "number":
        return sign * _amount_value(body.removesuffix("%")), None
    befores = {**SYMBOLS, **{c: c for c in CODES}}
    for cur in sorted(befores, key=len, reverse=True):
        if body.startswith(cur):
            code, body = befores[cur], body[len(cur) :].removeprefix(" ")
            break
    else:
        afters = {**befores, **WORDS}
        cur = next(c for c in sorted(afters, key=len, reverse=True) if body.endswith(c))
        code, body = afters[cur], body[: -len(cur)].removesuffix(" ")
    exponent = 0
    for scale in sorted(SCALES, key=len, reverse=True):
        if body.endswith(scale) and body[: -len(scale)][-1:].isdigit():
            exponent, body = SCALES[scale], body[: -len(scale)]
            break
    return sign * _amount_value(body, exponent), code or spec.currency_default or "USD"


# --- the token automaton -------------------------------------------------------------------------


class TokenGrammar:
    """One spec's automaton over one vocabulary, every table precomputed in :meth:`build`.

    States are ints from 0 (``start``). ``allowed(state)`` is a shared int64 tensor: do not
    modify it.
    """

    start: int = 0

    def __init__(
        self,
        spec: GrammarSpec,
        vocab: Sequence[bytes],
        stop_ids: frozenset[int],
        allowed: list[torch.Tensor],
        moves: list[dict[int, int]],
        default: list[int | None],
        complete: list[bool],
        dfa: _ByteDFA | None,
    ) -> None:
        self.spec = spec
        self.vocab = vocab
        self.stop_ids = stop_ids
        self._allowed = allowed
        self._moves = moves
        self._default = default
        self._complete = complete
        self._dfa = dfa

    @classmethod
    def build(cls, spec: GrammarSpec, vocab: Sequence[bytes], eos_ids: Collection[int]) -> TokenGrammar:
        """The automaton of ``spec`` over ``vocab`` (token id -> bytes, ``b""`` = never written).

        Stop tokens: ``eos_ids`` and every token whose bytes start with the stop string's.
        Built once per (spec, vocabulary, EOS ids) and cached.
        """
        return _build(spec, tuple(vocab), frozenset(int(i) for i in eos_ids))

    @property
    def num_states(self) -> int:
        return len(self._allowed)

    def allowed(self, state: int) -> torch.Tensor:
        """Token ids that may come next, sorted ascending, int64 ``[n]``; stop tokens included
        when the text so far is a complete value (or the none word)."""
        return self._allowed[state]

    def is_complete(self, state: int) -> bool:
        """Whether the text so far is a complete answer (a stop token may come)."""
        return self._complete[state]

    def is_stop(self, token_id: int) -> bool:
        return token_id in self.stop_ids

    def advance(self, state: int, token_id: int) -> int:
        """The state after ``token_id``.

        Raises:
            ValueError: ``token_id`` is a stop token or not allowed in ``state``.
        """
        if token_id in self.stop_ids:
            raise ValueError(f"token {token_id} is a stop token: the answer ends there")
        nxt = self._moves[state].get(token_id)
        if nxt is None and self._default[state] is not None and 0 <= token_id < len(self.vocab):
            nxt = self._default[state] if self.vocab[token_id] else None
        if nxt is None:
            raise ValueError(f"token {token_id} is not allowed in state {state} of a {self.spec.kind} grammar")
        return nxt

    def finish(self, state: int | None, text: bytes) -> Extracted:
        """The answer in ``text`` (the value tokens' bytes, no stop token).

        ``state`` is where decoding ended (None: found from ``text``). An incomplete value
        (max tokens hit) gives the text as written and value None.
        """
        spec = self.spec
        if spec.kind == "text":
            answer = text.split(spec.stop.encode(), 1)[0].decode(errors="replace").lstrip(" ")
            if spec.none is not None and answer.casefold() == spec.none.casefold():  # "None" means none too
                return Extracted(None, None)
            return Extracted(answer, answer)
        assert self._dfa is not None
        if state is None:
            end = self._dfa.walk(self._dfa.start, text)
            complete = end in self._dfa.finals
        else:
            complete = self._complete[state]
        answer = text.decode(errors="replace").lstrip(" ")
        if not complete:
            return Extracted(answer, None)
        if answer == spec.none:
            return Extracted(None, None)
        value, currency = _value(spec, answer)
        return Extracted(answer, value, currency)


def _tensor(ids: Iterable[int]) -> torch.Tensor:
    return torch.tensor(sorted(ids), dtype=torch.int64)


@functools.lru_cache(maxsize=16)
def _build(spec: GrammarSpec, vocab: tuple[bytes, ...], eos_ids: frozenset[int]) -> TokenGrammar:
    stop = spec.stop.encode()
    stop_ids = eos_ids | {i for i, t in enumerate(vocab) if t.startswith(stop)}
    if spec.kind == "text":
        return _build_text(spec, vocab, stop_ids, stop)

    dfa = _byte_dfa(_pattern(spec))
    # Tokens that may ever be written, grouped by first byte: the rest never pass the DFA.
    by_first: dict[int, list[int]] = {}
    for i, t in enumerate(vocab):
        if t and i not in stop_ids and not t.translate(None, dfa.alphabet):
            by_first.setdefault(t[0], []).append(i)

    ids = {dfa.start: 0}  # DFA state -> token-level state, in breadth-first order
    order = [dfa.start]
    moves: list[dict[int, int]] = []
    queue = deque([dfa.start])
    while queue:
        s = queue.popleft()
        row = dfa.next[s]
        out: dict[int, int] = {}
        for first, tokens in by_first.items():
            if row[first] < 0:
                continue
            for i in tokens:
                end = dfa.walk(s, vocab[i])
                if end >= 0:
                    if end not in ids:
                        ids[end] = len(order)
                        order.append(end)
                        queue.append(end)
                    out[i] = ids[end]
        moves.append(out)
    complete = [s in dfa.finals for s in order]
    allowed = [_tensor([*m, *(stop_ids if done else ())]) for m, done in zip(moves, complete, strict=True)]
    return TokenGrammar(spec, vocab, stop_ids, allowed, moves, [None] * len(order), complete, dfa)


def _build_text(spec: GrammarSpec, vocab: tuple[bytes, ...], stop_ids: frozenset[int], stop: bytes) -> TokenGrammar:
    """States ``k < len(stop)``: the text ends with ``stop[:k]`` (a KMP automaton over bytes);
    state ``len(stop)``: the stop string has been written inside a token, only stop tokens remain."""
    n = len(stop)
    fail = [0] * (n + 1)  # KMP failure function of the stop string
    for k in range(1, n):
        j = fail[k]
        while j and stop[k] != stop[j]:
            j = fail[j]
        fail[k + 1] = j + 1 if stop[k] == stop[j] else 0

    def walk(k: int, data: bytes) -> int:
        for b in data:
            while k and stop[k] != b:
                k = fail[k]
            k = k + 1 if stop[k] == b else 0
            if k == n:
                return n
        return k

    # Only tokens holding a byte of the stop string can move off state 0 or keep a partial match.
    special = [i for i, t in enumerate(vocab) if t and i not in stop_ids and len(t.translate(None, stop)) < len(t)]
    writable = _tensor({i for i, t in enumerate(vocab) if t} | stop_ids)
    moves = [{i: nk for i in special if (nk := walk(k, vocab[i])) != 0} for k in range(n)]
    return TokenGrammar(
        spec, vocab, stop_ids, [writable] * n + [_tensor(stop_ids)], [*moves, {}], [0] * n + [None],
        [True] * (n + 1), None,
    )  # fmt: skip
