"""Prompt packs: YAML file → validated :class:`Pack`; placeholder expansion; rendering.

A pack is a set of multiple-choice questions asked of every message. The file format is a fixed
contract (see ``docs/packs.md`` and the shipped ``packs/*.yaml``)::

    name: spam                                  # [a-z0-9_-]+
    version: 1.0.0
    description: one line
    preamble: "..."                             # optional; literal text, identical for every message
    prompt: "Text message: {text}\\n"            # content part; {field} = a field of the input message (any name, one or more)
    question: "Question: {question}\\nAnswer:"   # branch part; {question} = the question's text
    choices: [yes, no]                          # default choice labels
    answer_prefix: " "                          # optional; a choice's continuation = prefix + label
    special_tokens_in_fields: plain             # optional; plain (default) or parse, see below
    questions:
      - id: spam
        text: Is this text message spam or a scam?
      - id: asks_{action}                       # a grid: Cartesian product of the vars
        text: Does the message ask the reader to {action}?
        vars: {action: [call a number, reply, click a link]}
      - id: tone
        text: What is the tone of the message?
        choices: [friendly, neutral, hostile]   # per-question override

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

Every scalar in the file is read as a string (YAML's ``yes``/``no``/``on``/``off``/``1.0`` stay the
text written), because every value in the schema is a string or a list/mapping of strings.
"""

from __future__ import annotations

import itertools
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = ["ExpandedQuestion", "Pack", "PackError", "QuestionSpec", "load_pack", "packs_dirs"]

NAME_PATTERN = r"^[a-z0-9_-]+$"
# A grid of placeholders multiplies: refuse packs whose expansion is absurdly large.
MAX_QUESTIONS = 10_000
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Loc = tuple[str | int, ...]


# --------------------------------------------------------------------------------------- errors


class PackError(ValueError):
    """A pack could not be loaded: names the file, the key path and what is wrong.

    ``problems`` holds ``(key_path, line, message)`` triples (``line`` is 1-based or ``None``);
    ``str(err)`` is a human-readable summary of all of them.
    """

    def __init__(self, file: str | Path | None, problems: Sequence[tuple[str, int | None, str]]):
        self.file = str(file) if file is not None else "<pack>"
        self.problems = list(problems)
        lines = [_format_problem(*p) for p in self.problems]
        if len(lines) == 1:
            text = f"invalid pack {self.file}: {lines[0]}"
        else:
            text = f"invalid pack {self.file}: {len(lines)} problems\n" + "\n".join(f"  {ln}" for ln in lines)
        super().__init__(text)


def _format_problem(path: str, line: int | None, message: str) -> str:
    if not path:
        return f"line {line}: {message}" if line is not None else message
    return f"{path} (line {line}): {message}" if line is not None else f"{path}: {message}"


class _AtKey(ValueError):
    """Raised inside validators to point below the validated object (``loc`` is relative)."""

    def __init__(self, loc: Loc, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


def _key_path(loc: Loc) -> str:
    """``("questions", 2, "vars", "action")`` → ``"questions[2].vars.action"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


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


def _check_choices(labels: Sequence[str]) -> None:
    if len(labels) == 0:
        raise ValueError("empty list: give at least one choice label")
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        if label.strip() == "":
            raise _AtKey((i,), "empty choice label")
        if label in seen:
            raise _AtKey((i,), f"duplicate choice label {label!r} (also at index {seen[label]})")
        seen[label] = i


# --------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ExpandedQuestion:
    """One question after placeholder expansion: ``id`` is the key of ``scores``."""

    id: str
    text: str
    choices: tuple[str, ...]


class QuestionSpec(BaseModel):
    """One entry of ``questions``: a question, or a grid of them when it has ``vars``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(min_length=1)]
    text: Annotated[str, Field(min_length=1)]
    vars: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    choices: tuple[str, ...] | None = None

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

    def expand(self, default_choices: tuple[str, ...]) -> list[ExpandedQuestion]:
        """The grid, in ``itertools.product`` order over ``vars`` in their file order."""
        choices = self.choices if self.choices is not None else default_choices
        id_t, text_t = _parse_template(self.id), _parse_template(self.text)
        names = list(self.vars)
        out = []
        for combo in itertools.product(*(self.vars[n] for n in names)):
            values = dict(zip(names, combo))
            out.append(ExpandedQuestion(_render(id_t, values), _render(text_t, values), choices))
        return out


class Pack(BaseModel):
    """A validated prompt pack. Build with :func:`load_pack` (which sets ``source``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    version: Annotated[str, Field(min_length=1)]
    description: str
    preamble: str = ""
    prompt: str
    question: str
    choices: tuple[str, ...]
    answer_prefix: str = " "
    special_tokens_in_fields: Literal["plain", "parse"] = "plain"
    questions: Annotated[tuple[QuestionSpec, ...], Field(min_length=1)]

    _source: Path | None = PrivateAttr(default=None)
    _prompt_t: tuple[tuple[str, str | None], ...] = PrivateAttr(default=())
    _question_t: tuple[tuple[str, str | None], ...] = PrivateAttr(default=())
    _expanded: tuple[ExpandedQuestion, ...] = PrivateAttr(default=())

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
        names = _placeholders(v)
        if "question" not in names:
            raise ValueError("must contain the {question} placeholder (the question's text)")
        others = [n for n in names if n != "question"]
        if others:
            shown = ", ".join("{" + n + "}" for n in others)
            raise ValueError(f"may only use {{question}}, found {shown}; write {{{{ and }}}} for literal braces")
        return v

    @field_validator("choices")
    @classmethod
    def _choices_ok(cls, v: tuple[str, ...]) -> tuple[str, ...]:
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
            for q in spec.expand(self.choices):
                if q.id in first_seen:
                    j = first_seen[q.id]
                    where = "this same question" if j == i else f"questions[{j}]"
                    raise _AtKey(("questions", i, "id"), f"expanded id {q.id!r} is already used by {where}; ids must be unique")
                first_seen[q.id] = i
                expanded.append(q)
        self._prompt_t = _parse_template(self.prompt)
        self._question_t = _parse_template(self.question)
        self._expanded = tuple(expanded)
        return self

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

    def render_prompt(self, fields: Mapping[str, str]) -> str:
        """The content part for one message: ``prompt`` with each ``{field}`` replaced literally.

        Raises ``KeyError`` (naming the field) when ``fields`` lacks one the prompt uses.
        """
        return self.render_prompt_spans(fields)[0]

    def render_prompt_spans(self, fields: Mapping[str, str]) -> tuple[str, tuple[tuple[int, int], ...]]:
        """:meth:`render_prompt` and the ``[start, end)`` char span of each field value in it, in order.

        Raises ``KeyError`` (naming the field) when ``fields`` lacks one the prompt uses.
        """
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        at = 0
        for literal, field in self._prompt_t:
            out.append(literal)
            at += len(literal)
            if field is not None:
                value = fields[field]
                out.append(value)
                spans.append((at, at + len(value)))
                at += len(value)
        return "".join(out), tuple(spans)

    def render_question(self, q: ExpandedQuestion) -> str:
        """The branch part of one question: ``question`` with ``{question}`` = ``q.text``."""
        return _render(self._question_t, {"question": q.text})


# ------------------------------------------------------------------------------------- loading


class _StringLoader(yaml.SafeLoader):  # type: ignore[misc]  # no stubs for PyYAML
    """SafeLoader where every plain scalar is a string and duplicate keys are errors.

    Without implicit resolvers ``yes``/``no``/``on``/``off`` stay labels (not booleans), ``1.0``
    stays a version (not a float), ``~`` is the text ``~``. The schema has no other scalar types.
    """

    yaml_implicit_resolvers: dict[str | None, list[Any]] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _line_of(node: yaml.Node | None, loc: Loc) -> int | None:
    """1-based line of the deepest node along ``loc`` (the key's line for a mapping entry)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == part:
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {value!r}" if len(value) <= 40 else "a string"
    return type(value).__name__


def _problems(exc: ValidationError, root: yaml.Node | None) -> list[tuple[str, int | None, str]]:
    out = []
    for err in exc.errors():
        loc: Loc = tuple(err["loc"])
        kind = err["type"]
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, _AtKey):
            loc, msg = loc + inner.loc, inner.message
        elif kind == "value_error" and inner is not None:
            msg = str(inner)
        elif kind == "extra_forbidden":
            allowed = QuestionSpec.model_fields if loc[:1] == ("questions",) and len(loc) > 2 else Pack.model_fields
            msg = f"unknown key (allowed: {', '.join(allowed)})"
        elif kind == "missing":
            msg = "missing required key"
        elif kind == "string_pattern_mismatch" and loc == ("name",):
            msg = f"{err['input']!r} does not match {NAME_PATTERN} (lowercase letters, digits, '_', '-')"
        elif kind == "too_short" and loc == ("questions",):
            msg = "empty list: give at least one question"
        elif kind == "string_too_short":
            msg = "must not be empty"
        elif kind == "literal_error":
            msg = f"must be one of {err['ctx']['expected']} (got {_describe(err.get('input'))})"
        else:
            msg = f"{err['msg']} (got {_describe(err.get('input'))})"
        out.append((_key_path(loc), _line_of(root, loc), msg))
    return out


def parse_pack(text: str, source: str | Path | None = None) -> Pack:
    """Validate a pack from YAML text; ``source`` names it in errors. Raises :class:`PackError`."""
    loader = _StringLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        what = ", ".join(s for s in (e.context, e.problem) if s)
        if mark is not None:
            what += f" (column {mark.column + 1})"
        raise PackError(source, [("", line, f"invalid YAML: {what}")]) from None
    except yaml.YAMLError as e:
        raise PackError(source, [("", None, f"invalid YAML: {e}")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        got = "an empty file" if data is None else _describe(data)
        raise PackError(source, [("", 1, f"the top level must be a mapping of keys (name, prompt, ...), got {got}")])
    try:
        pack = Pack.model_validate(data)
    except ValidationError as e:
        raise PackError(source, _problems(e, root)) from None
    pack._source = Path(source) if source is not None else None
    return pack


def packs_dirs() -> list[Path]:
    """Where bare pack names are looked up: ``$SPINF_PACKS_DIR`` (if set), then the repo's ``packs/``."""
    dirs = []
    if os.environ.get("SPINF_PACKS_DIR"):
        dirs.append(Path(os.environ["SPINF_PACKS_DIR"]))
    dirs.append(Path(__file__).resolve().parents[1] / "packs")
    return dirs


def _resolve(ref: str | Path) -> Path:
    if isinstance(ref, Path):
        return ref
    looks_like_path = ref.endswith((".yaml", ".yml")) or "/" in ref or os.sep in ref
    if looks_like_path:
        return Path(ref)
    if not re.match(NAME_PATTERN, ref):
        raise PackError(ref, [("", None, f"not a pack file path, nor a pack name matching {NAME_PATTERN}")])
    tried = []
    for d in packs_dirs():
        for suffix in (".yaml", ".yml"):
            candidate = d / f"{ref}{suffix}"
            if candidate.is_file():
                return candidate
            tried.append(str(candidate))
    raise PackError(ref, [("", None, "no such pack; looked for " + ", ".join(tried))])


def load_pack(ref: str | Path) -> Pack:
    """Load and validate a pack.

    ``ref`` is a path to a ``.yaml`` file, or a bare name (``"spam"``) looked up as
    ``<dir>/<name>.yaml`` in :func:`packs_dirs`. Raises :class:`PackError` naming the file, the
    key path (``questions[2].vars.action``) and what is wrong; a missing or unreadable file, YAML
    syntax (with its line) and schema problems all raise it.
    """
    path = _resolve(ref)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PackError(path, [("", None, "file not found")]) from None
    except IsADirectoryError:
        raise PackError(path, [("", None, "is a directory, not a pack file")]) from None
    except UnicodeDecodeError as e:
        raise PackError(path, [("", None, f"not UTF-8 text ({e.reason} at byte {e.start})")]) from None
    except OSError as e:
        raise PackError(path, [("", None, f"cannot read: {e.strerror or e}")]) from None
    return parse_pack(text, path)
