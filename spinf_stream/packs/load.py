"""Loading a pack: YAML text, a file or a bare name → :class:`Pack`, or a :class:`PackError`.

A :class:`PackError` names the file, the key path and the line of each problem. Bare names are
looked up in :func:`packs_dirs`. The YAML is read with every scalar a string and duplicate keys
refused (the schema: :mod:`spinf_stream.packs.pack`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from spinf_stream.packs.pack import NAME_PATTERN, GenerateSpec, Loc, Pack, QuestionSpec, _AtKey


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


def _key_path(loc: Loc) -> str:
    """``("questions", 2, "vars", "action")`` → ``"questions[2].vars.action"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


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
    errors = exc.errors()
    # pydantic also reports a list whose items all failed as too short: the items' errors say it
    bad_items = any(tuple(e["loc"])[:1] == ("questions",) and len(e["loc"]) > 1 for e in errors)
    for err in errors:
        loc: Loc = tuple(err["loc"])
        kind = err["type"]
        if bad_items and kind == "too_short" and loc == ("questions",):
            continue
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, _AtKey):
            loc, msg = loc + inner.loc, inner.message
        elif kind == "value_error" and inner is not None:
            msg = str(inner)
        elif kind == "extra_forbidden":
            allowed = (GenerateSpec.model_fields if loc[:1] == ("questions",) and loc[2:3] == ("generate",) and len(loc) > 3
                       else QuestionSpec.model_fields if loc[:1] == ("questions",) and len(loc) > 2 else Pack.model_fields)
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
    try:  # the reader checks the characters at once: a control character is a YAMLError here
        loader = _StringLoader(text)
    except yaml.YAMLError as e:
        raise PackError(source, [("", None, f"invalid YAML: {e}")]) from None
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
    dirs.append(Path(__file__).resolve().parents[2] / "packs")
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
    shipped = sorted({f.stem for d in packs_dirs() if d.is_dir() for f in d.glob("*.y*ml")})
    raise PackError(ref, [("", None, "no such pack; looked for " + ", ".join(tried)
                           + (f"; the packs there: {', '.join(shipped)}" if shipped else ""))])


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
