"""Extraction and generation: greedy decode steps over every open extraction of a batch.

The first passes read each extraction question's answer cue like a choice question's; from
there a *decode step* is one forward pass over the newest tokens of all open extractions of the
batch (every message, every question). So a batch costs its longest extraction's token count in
extra passes, not one pass per question.
At each step the next token is the most probable of those the question's kind allows
(:mod:`spinf_stream.engine.grammar`; ties to the lowest token id), with its probability
renormalised over that set.

A decode step feeds one row per open extraction, its newest token, attending to the preamble
and to keys/values kept from the passes that computed them: the message's content, the
question's tokens and the tokens written before (nothing is recomputed). The row's attention is
a unit of its own (``TorchAttention._decode``) and its token-wise ops follow the per-row
rules, so a step's numbers are a function of the message alone and an extraction is as
batch-invariant as a choice (``docs/invariance.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from spinf_stream.engine.layout import Work
from spinf_stream.engine.segment import Branch, PreparedMessage

if TYPE_CHECKING:  # the engine's core runs without pydantic or interegular (bench/gpu_check.py)
    from spinf_stream.engine.grammar import TokenGrammar
    from spinf_stream.packs.pack import Extraction


@dataclass(frozen=True)
class ExtractionResult:
    """What one extraction question got for one message (see ``ExtractionScore``)."""

    kind: str
    answer: str | None
    value: float | str | None
    currency: str | None
    probability: float
    logprob: float
    none_probability: float | None
    tokens: int
    min_token_probability: float
    none_calibrated: float | None = None


#: a calibration's none decision: raw ``none_probability`` -> (calibrated probability of none,
#: whether to answer none)
NoneRule = Callable[[float], tuple[float, bool]]


class Writer(Protocol):
    """One branch being written by decode steps (an extraction, or a greedy completion):
    ``step`` takes the next token from a row's logits and sets ``done`` when it has ended."""

    slot: int
    question: int
    base: Branch
    written: list[int]
    done: bool

    def step(self, logits: torch.Tensor, lse: torch.Tensor, vocab: Sequence[bytes]) -> None: ...

    def result(self) -> Any: ...


class Writers(Protocol):
    """What a batch writes after its branches' last tokens: ``specs`` maps each written question
    index to its bounds (each has ``max_tokens``); ``open`` starts one message's (its ``slot``)
    writing of one question after its branch ``base``."""

    @property
    def specs(self) -> Mapping[int, Any]: ...

    @property
    def vocab(self) -> Sequence[bytes]: ...

    def open(self, slot: int, question: int, base: Branch) -> Writer: ...


@dataclass
class Grammars:
    """Each extraction question's grammar over one vocabulary; ``vocab[i]`` token i's bytes."""

    specs: dict[int, Extraction]  # question index -> its extraction
    grammars: dict[int, TokenGrammar]
    vocab: Sequence[bytes]
    #: question index -> the token ids that begin its none word (empty without one)
    none_starts: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: question index -> its calibration's none decision (questions without one: the greedy token)
    none_rules: dict[int, NoneRule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for q, x in self.specs.items():
            self.none_starts.setdefault(q, tuple(_none_starts(self.vocab, x.none)) if x.none is not None else ())

    def open(self, slot: int, question: int, base: Branch) -> OpenExtraction:
        """Question ``question``'s extraction for the message at ``slot``, after ``base``."""
        g = self.grammars[question]
        return OpenExtraction(slot, question, self.specs[question], g, base, g.start, self.none_starts[question],
                              none_rule=self.none_rules.get(question))


@dataclass
class OpenExtraction:
    """One (message, extraction question) being decoded: ``base`` its question's branch."""

    slot: int
    question: int
    spec: Extraction
    grammar: TokenGrammar
    base: Branch
    state: int
    none_starts: tuple[int, ...] = ()
    written: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    log_probability: float = 0.0  # sum of the renormalised step log-probabilities
    logprob: float = 0.0  # sum of the full-vocabulary ones
    min_p: float = 1.0
    none_probability: float | None = None
    none_rule: NoneRule | None = None
    none_calibrated: float | None = None
    decided_none: bool = False  # the calibration answered none (nothing written)
    done: bool = False
    stopped: bool = False  # ended by a stop token (not by max_tokens)

    def step(self, logits: torch.Tensor, lse: torch.Tensor, vocab: Sequence[bytes]) -> None:
        """Choose the next token from this step's ``logits [V]`` fp32 (``lse`` their logsumexp).

        number/money: greedy over the grammar's allowed ids, renormalised with ``math.fsum``
        (correctly rounded, so the sum's order does not matter). text/generate: every token is
        allowed, so the renormalised probability is the full-vocabulary one.
        """
        full = self.spec.kind in ("text", "generate")
        first = not self.written and self.spec.none is not None
        if full:
            if first:
                self.none_probability = _clamp(math.fsum(math.exp(float(logits[t] - lse)) for t in self.none_starts))
                if self._decide_none(math.log(max(self.none_probability, 1e-300))):
                    return
                if self.none_rule is not None and self.none_starts:  # a value: not the none word
                    logits = logits.clone()
                    logits[list(self.none_starts)] = -math.inf
            pick = int(torch.argmax(logits))  # the first maximum: the lowest id
            lp = float(logits[pick] - lse)
            p = math.exp(lp)
        else:
            allowed = self.grammar.allowed(self.state)
            if allowed.numel() == 0:  # nothing can follow (the grammar's tables keep no such state)
                self.done = True
                return
            values = logits[allowed].tolist()
            best = max(range(len(values)), key=values.__getitem__)  # first maximum: lowest id
            top = values[best]
            total = math.fsum(math.exp(v - top) for v in values)
            if first:
                starts = set(self.none_starts)
                ids = allowed.tolist()
                self.none_probability = _clamp(math.fsum(math.exp(v - top) for t, v in zip(ids, values) if t in starts) / total)
                if self.none_rule is not None:
                    full_mass = math.fsum(math.exp(float(logits[t] - lse)) for t in ids if t in starts)
                    if self._decide_none(math.log(max(full_mass, 1e-300))):
                        return
                    # a value: the best allowed token that does not begin the none word
                    rest = [j for j, t in enumerate(ids) if t not in starts]
                    if rest:
                        best = max(rest, key=values.__getitem__)
            pick = int(allowed[best])
            p = math.exp(values[best] - top) / total
            lp = float(logits[pick] - lse)
        self.log_probability += math.log(p) if p > 0 else -math.inf
        self.logprob += lp
        self.min_p = min(self.min_p, p)
        if self._is_stop(pick, vocab):
            self.done = self.stopped = True
            return
        if not full:
            self.state = self.grammar.advance(self.state, pick)
        self.written.append(pick)
        self.text += vocab[pick]
        stop = self.spec.stop.encode()
        if full and stop in self.text:
            del self.text[self.text.index(stop):]
            self.done = self.stopped = True
        elif len(self.written) >= self.spec.max_tokens:
            self.done = True

    def _decide_none(self, none_logprob: float) -> bool:
        """With a calibration's none rule, decide at the first step: ``True`` ends the extraction
        as none (nothing written; ``probability`` is the none path's renormalised mass, ``logprob``
        its full-vocabulary one, ``none_logprob``)."""
        if self.none_rule is None:
            return False
        assert self.none_probability is not None
        self.none_calibrated, none = self.none_rule(self.none_probability)
        if none:
            self.log_probability = math.log(self.none_probability) if self.none_probability > 0 else -math.inf
            self.logprob = none_logprob
            self.min_p = self.none_probability
            self.decided_none = self.done = True
        return none

    def _is_stop(self, token: int, vocab: Sequence[bytes]) -> bool:
        if self.spec.kind in ("text", "generate"):
            return vocab[token] == b"" or self.grammar.is_stop(token)
        return self.grammar.is_stop(token)

    def result(self) -> ExtractionResult:
        """What was written: a character cut short by ``max_tokens`` dropped; a number or an
        amount that ``max_tokens`` ended before its stop token has no ``value`` (the model was
        still writing it)."""
        text = _whole_characters(bytes(self.text))
        free = self.spec.kind in ("text", "generate")
        if self.decided_none:
            return ExtractionResult(
                kind=self.spec.kind, answer=None, value=None, currency=None,
                probability=_clamp(math.exp(self.log_probability)), logprob=min(self.logprob, 0.0),
                none_probability=self.none_probability, tokens=0, min_token_probability=_clamp(self.min_p),
                none_calibrated=self.none_calibrated,
            )
        got = self.grammar.finish(None if free else self.state, text)
        value, currency = got.value, got.currency
        if not free and not self.stopped:
            value = currency = None
        return ExtractionResult(
            kind=self.spec.kind, answer=got.answer, value=value,
            currency=currency if self.spec.kind == "money" else None,
            probability=_clamp(math.exp(self.log_probability)), logprob=min(self.logprob, 0.0),
            none_probability=self.none_probability, tokens=len(self.written), min_token_probability=_clamp(self.min_p),
            none_calibrated=self.none_calibrated,
        )


def _whole_characters(text: bytes) -> bytes:
    """``text`` without a UTF-8 character cut short at its end (``max_tokens`` fell inside it)."""
    for back in range(1, min(4, len(text)) + 1):
        b = text[-back]
        if b & 0xC0 != 0x80:  # the last character's lead byte
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return text if need <= back else text[:-back]
    return text


def _clamp(p: float) -> float:
    return min(max(p, 0.0), 1.0)


def _none_starts(vocab: Sequence[bytes], none: str) -> list[int]:
    """Token ids whose text, leading spaces dropped, is a non-empty prefix of the none word."""
    word = none.encode()
    out = []
    for t in range(len(vocab)):
        b = vocab[t].lstrip(b" ")
        if b and word.startswith(b):
            out.append(t)
    return out


def decode_work(message: PreparedMessage, o: Writer) -> Work:
    """The work of ``o``'s next decode step: its newest token as a one-token branch, after
    everything before it — the message's content, the question's tokens and the tokens written
    before — as carried content (the question's branch is a chain: its depths are ``0 .. n-1``).
    """
    b = o.base
    assert b.depths == tuple(range(len(b))) and o.written, "an open extraction's branch is a chain with a token written"
    before = message.content + b.tokens + tuple(o.written[:-1])
    tip = Branch(o.question, (o.written[-1],), (-1,), (0,), (0,), ())
    m = PreparedMessage(message.index, message.id, before, message.use_preamble, message.prefix_len, (tip,))
    return Work(m, (0,), o.slot, with_content=False, decode=True)
