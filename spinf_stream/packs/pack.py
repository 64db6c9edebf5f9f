"""The pack file's schema: validated :class:`Pack` and its questions, placeholder expansion, rendering.

A pack is a set of multiple-choice questions asked of every message. The file format is a fixed
contract (see ``docs/packs.md`` and the shipped ``packs/*.yaml``)::

    name: spam                                  # [a-z0-9_-]+
    version: 1.0.0
    description: one line
    preamble: "..."                             # optional; literal text, identical for every message
    prompt: "Text message: {text}\\n"            # content part; {field} = a field of the input message (any name, one or more)
    question: "Question: {question}\\nAnswer:"   # branch part; {question} = the question's text
    choices: [yes, no]                          # default choice labels (optional when every question has its own)
    answer_prefix: " "                          # optional; a choice's continuation = prefix + label
    special_tokens_in_fields: plain             # optional; plain (default) or parse, see below
    normalize_fields: none                      # optional; none (default), nfkc or latin_lookalikes, see below
    escape_in_fields: {"</message>": "<\\/message>"}  # optional; what a field's text may not hold, see below
    choice_scoring: sum                         # optional; sum (default), mean or first_token, see below
    views: {field: text, prefixes: 3, suffixes: 3, questions: [spam]}  # optional, see below
    questions:
      - id: spam
        text: Is this text message spam or a scam?
      - id: asks_{action}                       # a grid: Cartesian product of the vars
        text: Does the message ask the reader to {action}?
        vars: {action: [call a number, reply, click a link]}
      - id: tone
        text: What is the tone of the message?
        choices: [friendly, neutral, hostile]   # per-question override
        question: "Question: {question}\\nAnswer:"   # optional: its own branch template (default: the pack's)
        choice_scoring: mean                    # optional: the pack's choice_scoring for this question
      - id: amount
        text: What amount of money does the message ask for?
        extract: money                          # instead of choices: text | number | money ({*} {n} {$})
        max_tokens: 12                          # optional (defaults: text 24, number and money 12; 1..256)
        stop: "\n"                              # optional, default newline
        none: none                              # optional: the word for "no such value"; null turns it off
        currency_default: USD                   # optional, money only: the currency of "$" and "dollars"
      - id: summary
        text: Summarise the message in one line.
        generate: {max_tokens: 40}              # free text, greedy; optional stop (default newline)

An extraction or generation question has no choices: its record gives the value the model wrote,
greedy over the tokens its kind allows, with that value's probability (``docs/packs.md``).

Templates (``prompt``, ``question``, a question's ``id`` and ``text``) use ``str.format`` syntax
for the template only: ``{name}`` is a placeholder, ``{{``/``}}`` are literal braces, and no
conversions (``!r``), format specs (``:>5``), indexing or attribute access are allowed. Values are
substituted literally: braces inside a message's field or a var's value are just text. The
``preamble`` is not a template; it is used verbatim.

``special_tokens_in_fields`` says what special-token text (``<|im_end|>``, ``<end_of_turn>``, ...)
inside a message's fields is: ``plain`` (default) tokenizes it as ordinary text, so a message
cannot forge control tokens; ``parse`` gives it the tokenizer's default meaning (control tokens).
Special tokens written in the pack itself are control tokens either way
(:mod:`spinf_stream.engine.tokenizer`).

``normalize_fields`` says how a field's text is read before it is rendered
(:mod:`spinf_stream.packs.normalize`): ``none`` (default) as written; ``nfkc`` (Unicode NFKC);
``latin_lookalikes`` (NFKC, invisible format characters removed, and letters of other scripts drawn
like Latin ones made Latin where they stand among Latin text: ``FRΕΕ`` with Greek ``Ε`` reads ``FREE``).
Escaping (below) comes after it.

``escape_in_fields`` maps each delimiter of the prompt that a message must not be able to write
(the fence that closes its fields) to what it becomes inside a field's value: every occurrence is
replaced, leftmost first, in one pass. At load each delimiter must be in the text the pack writes
around fields (the prompt's, the question template's or the preamble's: ``Question:`` is a turn
marker a message can forge), and no
replacement may let a delimiter reappear: not inside it, nor across its edge with the text beside
it (a replacement's first or last characters must not continue or end a delimiter), so a rendered
prompt holds each delimiter exactly where the prompt writes it.

``choice_scoring`` says how a choice's tokens make its logprob: ``sum`` (the log-probability of
the whole label), ``mean`` (that divided by its number of tokens: SGLang's token-length
normalisation, for labels of unequal lengths) or ``first_token`` (the first token's alone, for
labels whose first tokens differ).

``views`` makes the named binary questions hold against text a message adds to argue with them
(:mod:`spinf_stream.engine.views`): the ``field`` is also read cut at its sentence boundaries, its
prefixes before the last ``prefixes`` boundaries and its suffixes from the first ``suffixes``
(0-8 each), and each question answers from the read whose first choice leads most. A record's
question then names the read that decided it (``view``). Each view costs a read of its own.

Every scalar in the file is read as a string (YAML's ``yes``/``no``/``on``/``off``/``1.0`` stay the
text written), because every value in the schema is a string or a list/mapping of strings.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from spinf_stream.packs.normalize import NormalizeFields, normalize

from spinf_stream.currencies import CODES, WORDS

NAME_PATTERN = r"^[a-z0-9_-]+$"
# A grid of placeholders multiplies: refuse packs whose expansion is absurdly large.
MAX_QUESTIONS = 10_000
#: a semantic version (semver.org 2.0.0): MAJOR.MINOR.PATCH, optional -pre-release and +build
SEMVER = r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
#: how a choice's tokens make its score (``choice_scoring``): their summed logprob, that sum
#: divided by their number (SGLang's token-length normalisation), or the first token's alone
ChoiceScoring = Literal["sum", "mean", "first_token"]
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Loc = tuple[str | int, ...]


class _AtKey(ValueError):
    """Raised inside validators to point below the validated object (``loc`` is relative)."""

    def __init__(self, loc: Loc, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


# ------------------------------------------------------------------------------------ templates


def _parse_template(template: str) -> tuple[tuple[str, str | None], ...]:
    """Split a template into ``(literal, placeholder or None)`` segments.

    Raises ``ValueError`` for unbalanced braces, empty/positional placeholders, conversions,
    format specs, indexing or attribute access.
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:  # "Single '}' encountered in format string", ...
        raise ValueError(f"bad template ({e}); write {{{{ and }}}} for literal braces") from None
    segments: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if field is None:
            segments.append((literal, None))
            continue
        shown = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if field == "":
            raise ValueError(f"empty placeholder {shown}: name it, e.g. {{text}}")
        if not _IDENTIFIER.match(field):
            raise ValueError(f"placeholder {shown} must be a plain name (no index, attribute or number)")
        if conversion or spec:
            raise ValueError(f"placeholder {shown} may not have a conversion or format spec")
        segments.append((literal, field))
    return tuple(segments)


def _placeholders(template: str) -> tuple[str, ...]:
    """Distinct placeholder names of a valid template, in order of first appearance."""
    return tuple(dict.fromkeys(f for _, f in _parse_template(template) if f is not None))


def _render(segments: tuple[tuple[str, str | None], ...], values: Mapping[str, str]) -> str:
    # Literal substitution: a value is never parsed as a template.
    out: list[str] = []
    for literal, field in segments:
        out.append(literal)
        if field is not None:
            out.append(values[field])
    return "".join(out)


def grid_id(rendered: str) -> str:
    """A grid question's id with its vars' values in it, reduced to ``[a-z0-9_]``: lower case,
    each run of other characters one ``_``, none at the ends (``asks_Call a number!`` ->
    ``asks_call_a_number``)."""
    return re.sub(r"[^a-z0-9_]+", "_", rendered.lower()).strip("_")


def _check_choices(labels: Sequence[str]) -> None:
    if len(labels) == 0:
        raise ValueError("empty list: give at least two choice labels")
    if len(labels) == 1:
        raise ValueError(f"one choice ({labels[0]!r}) always gets probability 1: give at least two choice labels")
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        if label.strip() == "":
            raise _AtKey((i,), "empty choice label")
        if label in seen:
            raise _AtKey((i,), f"duplicate choice label {label!r} (also at index {seen[label]})")
        seen[label] = i


# --------------------------------------------------------------------------------------- models


#: the kinds of value a question may ask the model to write, and their shorthands
EXTRACT_KINDS = {"text": "text", "number": "number", "money": "money", "{*}": "text", "{n}": "number", "{$}": "money"}
#: ``max_tokens`` when a question does not set it
DEFAULT_MAX_TOKENS = {"text": 24, "number": 12, "money": 12}
MAX_TOKENS_LIMIT = 256
#: what ``none:`` reads as "no none word" (every YAML scalar reaches the schema as a string)
_NULLS = ("null", "~", "Null", "NULL")


@dataclass(frozen=True)
class Extraction:
    """What an extraction (``kind`` text, number, money) or generation (``kind`` generate)
    question asks the model to write: at most ``max_tokens`` tokens, ending at ``stop`` or EOS;
    ``none`` the word meaning "no such value" (``None``: that path is off; always ``None`` for
    generate); ``currency_default`` the ISO code of ``$``/dollars (money only)."""

    kind: Literal["text", "number", "money", "generate"]
    max_tokens: int
    stop: str = "\n"
    none: str | None = "none"
    currency_default: str | None = None


@dataclass(frozen=True)
class ExpandedQuestion:
    """One question after placeholder expansion: ``id`` is the key of ``scores``. A choice
    question has ``choices`` and ``extract is None``; an extraction or generation question has
    ``choices == ()`` and its :class:`Extraction`."""

    id: str
    text: str
    choices: tuple[str, ...]
    extract: Extraction | None = None
    #: the question's own branch template (``None``: the pack's ``question``)
    template: str | None = None
    #: how its choices' tokens are scored (choice questions): ``sum``, ``mean`` or ``first_token``
    choice_scoring: ChoiceScoring = "sum"


def _whole_number(v: object) -> object:
    """A token count as YAML writes it: digits only (``10.0``, `` 5`` and ``1_0`` are refused)."""
    if isinstance(v, str) and not re.fullmatch(r"[0-9]+", v):
        raise ValueError(f"must be a whole number of tokens, got {v!r}")
    return v


class GenerateSpec(BaseModel):
    """A question's ``generate:`` mapping: free text, greedy, at most ``max_tokens`` tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int
    stop: Annotated[str, Field(min_length=1)] | None = None

    _whole = field_validator("max_tokens", mode="before")(lambda v: _whole_number(v))

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens_ok(cls, v: int) -> int:
        if not 1 <= v <= MAX_TOKENS_LIMIT:
            raise ValueError(f"must be 1 to {MAX_TOKENS_LIMIT} tokens, got {v}")
        return v


def _check_question_template(v: str) -> str:
    """A branch template: ``{question}`` and literal text only."""
    names = _placeholders(v)
    if "question" not in names:
        raise ValueError("must contain the {question} placeholder (the question's text)")
    others = [n for n in names if n != "question"]
    if others:
        shown = ", ".join("{" + n + "}" for n in others)
        raise ValueError(f"may only use {{question}}, found {shown}; write {{{{ and }}}} for literal braces")
    return v


class QuestionSpec(BaseModel):
    """One entry of ``questions``: a question, or a grid of them when it has ``vars``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(min_length=1)]
    text: Annotated[str, Field(min_length=1)]
    vars: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    choices: tuple[str, ...] | None = None
    extract: str | None = None
    generate: GenerateSpec | None = None
    max_tokens: int | None = None
    stop: Annotated[str, Field(min_length=1)] | None = None
    none: str | None = None
    currency_default: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] | None = None
    question: str | None = None
    choice_scoring: ChoiceScoring | None = None

    @field_validator("question")
    @classmethod
    def _own_question_ok(cls, v: str | None) -> str | None:
        return None if v is None else _check_question_template(v)

    @field_validator("extract")
    @classmethod
    def _extract_ok(cls, v: str | None) -> str | None:
        if v is not None and v not in EXTRACT_KINDS:
            raise ValueError(f"unknown kind {v!r}: use one of text, number, money (or {{*}}, {{n}}, {{$}})")
        return v

    _whole = field_validator("max_tokens", mode="before")(lambda v: _whole_number(v))

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens_ok(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_TOKENS_LIMIT:
            raise ValueError(f"must be 1 to {MAX_TOKENS_LIMIT} tokens, got {v}")
        return v

    @field_validator("none")
    @classmethod
    def _none_ok(cls, v: str | None) -> str | None:
        if v is not None and v not in _NULLS and v.strip() == "":
            raise ValueError("must be a word (or null to turn the no-value path off)")
        if v is not None and v != v.strip():
            raise ValueError(f"the none word {v!r} must not begin or end with a space: answers are read with "
                             "their leading spaces dropped")
        return v

    @model_validator(mode="after")
    def _one_kind_of_answer(self) -> QuestionSpec:
        kinds = [k for k in ("choices", "extract", "generate") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise _AtKey((kinds[1],), f"a question has one of choices, extract or generate, not {' and '.join(kinds)}")
        extract_only = {"max_tokens": self.max_tokens, "stop": self.stop, "none": self.none,
                        "currency_default": self.currency_default}
        for key, value in extract_only.items():
            if value is not None and self.extract is None:
                hint = f" (for generate, inside it: generate: {{{key}: ...}})" if self.generate and key in ("max_tokens", "stop") else ""
                raise _AtKey((key,), f"{key} is for extraction questions (with extract: text, number or money){hint}")
        if self.choice_scoring is not None and (self.extract is not None or self.generate is not None):
            raise _AtKey(("choice_scoring",), "choice_scoring is for choice questions, not extract or generate")
        if self.currency_default is not None and EXTRACT_KINDS.get(self.extract or "") != "money":
            raise _AtKey(("currency_default",), "currency_default is for extract: money questions")
        if self.currency_default is not None and self.currency_default not in CODES:
            raise _AtKey(("currency_default",), f"{self.currency_default!r} is not one of the ISO codes money "
                                                f"extraction knows ({', '.join(CODES)})")
        none = self.none
        word = "none" if none is None else none
        if self.extract is not None and word not in _NULLS and (self.stop or "\n") in word:
            key = "none" if none is not None else "stop"
            raise _AtKey((key,), f"the none word {word!r} holds the stop string {self.stop or chr(10)!r}: "
                                 "it could never be written whole")
        if (none is not None and EXTRACT_KINDS.get(self.extract or "") == "money"
                and (none.upper() in CODES or none.lower() in WORDS)):
            raise _AtKey(("none",), f"the none word {none!r} is a currency: an amount could begin or end with it")
        if none is not None and none not in _NULLS and EXTRACT_KINDS.get(self.extract or "") in ("number", "money"):
            if any(c.isdigit() for c in none) or not any(c.isalpha() for c in none):
                raise _AtKey(("none",), f"the none word {none!r} must be a word (letters, no digits): "
                                        "a value could be written the same way")
        return self

    def extraction(self) -> Extraction | None:
        """The question's :class:`Extraction` (``None`` for a choice question)."""
        if self.generate is not None:
            return Extraction("generate", self.generate.max_tokens, self.generate.stop or "\n", None)
        if self.extract is None:
            return None
        kind = EXTRACT_KINDS[self.extract]
        none = "none" if self.none is None else (None if self.none in _NULLS else self.none)
        return Extraction(kind, self.max_tokens or DEFAULT_MAX_TOKENS[kind], self.stop or "\n", none,  # type: ignore[arg-type]
                          self.currency_default)

    @field_validator("id", "text")
    @classmethod
    def _template_ok(cls, v: str) -> str:
        if v.strip() == "":
            raise ValueError("must not be blank")
        _parse_template(v)
        return v

    @field_validator("choices")
    @classmethod
    def _choices_ok(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None:
            _check_choices(v)
        return v

    @model_validator(mode="after")
    def _vars_match_placeholders(self) -> QuestionSpec:
        for name, values in self.vars.items():
            if not _IDENTIFIER.match(name):
                raise _AtKey(("vars", name), f"var name {name!r} must be a plain name ([A-Za-z_][A-Za-z0-9_]*)")
            if len(values) == 0:
                raise _AtKey(("vars", name), "empty list: a var needs at least one value")
        for key in ("id", "text"):
            for p in _placeholders(getattr(self, key)):
                if p not in self.vars:
                    declared = ", ".join(self.vars) or "none"
                    raise _AtKey((key,), f"placeholder {{{p}}} is not one of this question's vars ({declared})")
        used = set(_placeholders(self.text))
        for name in self.vars:
            if name not in used:
                raise _AtKey(("vars", name), f"var {name!r} is not used in the question text")
        return self

    def n_expanded(self) -> int:
        n = 1
        for values in self.vars.values():
            n *= len(values)
        return n

    def expand(self, default_choices: tuple[str, ...], default_scoring: ChoiceScoring = "sum") -> list[ExpandedQuestion]:
        """The grid, in ``itertools.product`` order over ``vars`` in their file order."""
        extraction = self.extraction()
        scoring = self.choice_scoring or default_scoring
        choices = () if extraction else self.choices if self.choices is not None else default_choices
        id_t, text_t = _parse_template(self.id), _parse_template(self.text)
        names = list(self.vars)
        out = []
        for combo in itertools.product(*(self.vars[n] for n in names)):
            values = dict(zip(names, combo))
            qid = grid_id(_render(id_t, values)) if names else _render(id_t, values)
            out.append(ExpandedQuestion(qid, _render(text_t, values), choices, extraction, self.question, scoring))
        return out


def _escape_problems(escape: Mapping[str, str], prompt_text: str) -> dict[str, str]:
    """Why each delimiter of ``escape_in_fields`` would not hold (see the module docstring): a
    delimiter may reappear in an escaped field only inside a replacement or across its edge."""
    out: dict[str, str] = {}
    for key, replacement in escape.items():
        if not key:
            out[key] = "an empty delimiter: write the text a message must not hold"
        elif key not in prompt_text:
            out[key] = (f"{key!r} is not in the prompt's, question's or preamble's text: "
                        "escape the delimiters the pack writes")
    for key in escape:
        for other, r in escape.items():
            if not key or key in out:
                continue
            if key in r or (r and r in key):
                out[key] = f"the replacement of {other!r}, {r!r}, and {key!r} hold one another: the delimiter could reappear"
            elif any(r.endswith(key[:i]) for i in range(1, len(key))) or any(r.startswith(key[-i:]) for i in range(1, len(key))):
                out[key] = (f"the replacement of {other!r}, {r!r}, begins or ends like part of {key!r}: "
                            "with the text beside it the delimiter could reappear")
    return out


class ViewsSpec(BaseModel):
    """``views``: which field is also read cut at sentence boundaries, how many cuts each way, and
    the binary questions answered from the read whose first choice leads most."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: Annotated[str, Field(min_length=1)]
    prefixes: Annotated[int, Field(ge=0, le=8)] = 0
    suffixes: Annotated[int, Field(ge=0, le=8)] = 0
    questions: Annotated[tuple[str, ...], Field(min_length=1)]


class Pack(BaseModel):
    """A validated prompt pack. Build with :func:`load_pack` (which sets ``source``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    version: str
    description: str
    preamble: str = ""
    prompt: str
    question: str
    choices: tuple[str, ...] | None = None
    answer_prefix: str = " "
    special_tokens_in_fields: Literal["plain", "parse"] = "plain"
    normalize_fields: NormalizeFields = "none"
    escape_in_fields: dict[str, str] = Field(default_factory=dict)
    choice_scoring: ChoiceScoring = "sum"
    views: ViewsSpec | None = None
    questions: Annotated[tuple[QuestionSpec, ...], Field(min_length=1)]

    _source: Path | None = PrivateAttr(default=None)
    _prompt_t: tuple[tuple[str, str | None], ...] = PrivateAttr(default=())
    _question_t: tuple[tuple[str, str | None], ...] = PrivateAttr(default=())
    _expanded: tuple[ExpandedQuestion, ...] = PrivateAttr(default=())
    _escape_re: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("version")
    @classmethod
    def _version_ok(cls, v: str) -> str:
        if not re.match(SEMVER, v):
            raise ValueError(f"{v!r} is not a semantic version: write MAJOR.MINOR.PATCH, e.g. 1.0.0 (semver.org)")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt_ok(cls, v: str) -> str:
        # Any field names: a message must carry each one the prompt uses (the engine checks).
        if not _placeholders(v):
            raise ValueError("must use at least one {field} of the input message, e.g. {text} or {title}")
        return v

    @field_validator("question")
    @classmethod
    def _question_ok(cls, v: str) -> str:
        return _check_question_template(v)

    @field_validator("choices")
    @classmethod
    def _choices_ok(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None:
            _check_choices(v)
        return v

    @model_validator(mode="after")
    def _expand_and_check_ids(self) -> Pack:
        total = sum(q.n_expanded() for q in self.questions)
        if total > MAX_QUESTIONS:
            raise _AtKey(("questions",), f"expands to {total} questions, more than {MAX_QUESTIONS}")
        expanded: list[ExpandedQuestion] = []
        first_seen: dict[str, int] = {}
        for i, spec in enumerate(self.questions):
            if self.choices is None and spec.choices is None and spec.extraction() is None:
                raise _AtKey(("questions", i), "no choices: give this question choices, extract or generate, "
                                                "or the pack top-level choices")
            for q in spec.expand(self.choices or (), self.choice_scoring):
                if q.id == "":
                    raise _AtKey(("questions", i, "id"), "a grid id reduced to [a-z0-9_] is empty: put letters or digits in it")
                if q.id in first_seen:
                    j = first_seen[q.id]
                    where = "this same question" if j == i else f"questions[{j}]"
                    reduced = " (grid ids are reduced to [a-z0-9_])" if spec.vars else ""
                    raise _AtKey(("questions", i, "id"), f"expanded id {q.id!r} is already used by {where}{reduced}; "
                                                         "ids must be unique")
                first_seen[q.id] = i
                expanded.append(q)
        self._prompt_t = _parse_template(self.prompt)
        self._question_t = _parse_template(self.question)
        self._expanded = tuple(expanded)
        literal = "\n".join(("".join(text for text, _ in self._prompt_t),
                             "".join(text for text, _ in self._question_t), self.preamble))
        for key, problem in _escape_problems(self.escape_in_fields, literal).items():
            raise _AtKey(("escape_in_fields", key), problem)
        if self.escape_in_fields:
            self._escape_re = re.compile("|".join(map(re.escape, sorted(self.escape_in_fields, key=len, reverse=True))))
        if self.views is not None:
            self._check_views(self.views)
        return self

    def _check_views(self, v: ViewsSpec) -> None:
        if v.field not in self.fields:
            raise _AtKey(("views", "field"), f"{v.field!r} is not a field of the prompt ({', '.join(self.fields)})")
        if v.prefixes + v.suffixes == 0:
            raise _AtKey(("views", "prefixes"), "prefixes and suffixes are both 0: give at least one view")
        by_id = {q.id: q for q in self._expanded}
        for i, qid in enumerate(v.questions):
            q = by_id.get(qid)
            if q is None:
                raise _AtKey(("views", "questions", i), f"{qid!r} is not a question of the pack")
            if q.extract is not None or len(q.choices) != 2:
                raise _AtKey(("views", "questions", i), f"{qid!r} is not a question of two choices: views decide "
                                                         "by how far the first choice leads the second")

    @property
    def source(self) -> Path | None:
        """The file this pack was loaded from (``None`` when built in memory)."""
        return self._source

    def expand(self) -> list[ExpandedQuestion]:
        """All questions after placeholder expansion: file order, each grid in product order."""
        return list(self._expanded)

    @property
    def fields(self) -> tuple[str, ...]:
        """Message fields the prompt uses, in order of first appearance (at least one)."""
        return tuple(dict.fromkeys(f for _, f in self._prompt_t if f is not None))

    @property
    def field_occurrences(self) -> tuple[str, ...]:
        """The prompt's ``{field}`` places in order, a field once per place."""
        return tuple(f for _, f in self._prompt_t if f is not None)

    def render_prompt(self, fields: Mapping[str, str]) -> str:
        """The content part for one message: ``prompt`` with each ``{field}`` replaced literally.

        Raises ``KeyError`` (naming the field) when ``fields`` lacks one the prompt uses.
        """
        return self.render_prompt_spans(fields)[0]

    def render_prompt_spans(
        self, fields: Mapping[str, str], verbatim: Mapping[str, str] | None = None,
    ) -> tuple[str, tuple[tuple[int, int], ...]]:
        """:meth:`render_prompt` and the ``[start, end)`` char span of each field value in it, in order.

        ``verbatim``: fields whose text the engine writes (an image's markers): inserted as
        given, neither normalised nor escaped, and read as the pack's own text (no span).

        Raises ``KeyError`` (naming the field) when ``fields`` lacks one the prompt uses.
        """
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        at = 0
        for literal, field in self._prompt_t:
            out.append(literal)
            at += len(literal)
            if field is not None and verbatim and field in verbatim:
                out.append(verbatim[field])
                at += len(verbatim[field])
            elif field is not None:
                value = self.escape_field(normalize(fields[field], self.normalize_fields))
                out.append(value)
                spans.append((at, at + len(value)))
                at += len(value)
        return "".join(out), tuple(spans)

    def escape_field(self, value: str) -> str:
        """``value`` with every delimiter of ``escape_in_fields`` replaced (one pass, leftmost and
        longest first); unchanged when the pack escapes nothing."""
        if self._escape_re is None:
            return value
        return self._escape_re.sub(lambda m: self.escape_in_fields[m.group()], value)

    def render_question(self, q: ExpandedQuestion) -> str:
        """The branch part of one question: its template (the question's own ``question``, else the
        pack's) with ``{question}`` = ``q.text``."""
        template = self._question_t if q.template is None else _parse_template(q.template)
        return _render(template, {"question": q.text})
