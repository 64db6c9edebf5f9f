"""Plain words for the command line: each option's ``--help`` line, and one-line usage errors.

Both are derived from the pydantic fields of the commands, so a flag added to any command gets
them for free:

- ``--help`` shows, per option, a placeholder in words (``N``, ``FILE``, ``{json,text}``; a field
  may set its own with ``json_schema_extra={"metavar": ..., "allowed": ...}``, see
  :func:`spinf_stream.config.plain`), what values are allowed, the default and the ``SPINF_*``
  variable;
- :func:`explain` turns a pydantic ``ValidationError`` or a pydantic-settings ``SettingsError``
  into one line that names the flag (or the variable the value came from), the bad value and what
  is allowed.
"""

from __future__ import annotations

import difflib
import re
import shlex
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

__all__ = ["Option", "argument_adder", "explain", "options", "subcommands"]

_SUPPRESS = "==SUPPRESS=="


# ------------------------------------------------------------------------------ describing fields


def subcommands(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """``{name: command model}`` of the root's subcommand fields (``CliSubCommand[Model]``)."""
    out = {}
    for name, info in root.model_fields.items():
        for arg in get_args(info.annotation) or (info.annotation,):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out[name] = arg
    return out


def _bare(annotation: Any) -> tuple[Any, bool]:
    """``(annotation without None, optional?)``; ``Annotated`` metadata dropped."""
    if getattr(annotation, "__metadata__", None) is not None:  # Annotated[T, ...]
        return _bare(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _bare(args[0])[0], True
    return annotation, False


def _extra(info: FieldInfo) -> Mapping[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _bounds(info: FieldInfo) -> str:
    words = []
    for m in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(m, attr, None)  # annotated_types.Ge(ge=0), ...
            if value is not None:
                words.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return " " + " and ".join(words) if words else ""


class Option:
    """One option of one command: its flag, ``SPINF_*`` variable, and plain words for it."""

    def __init__(self, model: type[BaseModel], name: str, info: FieldInfo) -> None:
        self.model, self.name, self.info = model, name, info
        #: a positional argument (``CliPositionalArg``) is written as its name, not a flag
        self.positional = any(getattr(x, "__name__", type(x).__name__) == "_CliPositionalArg" for x in info.metadata)
        self.flag = name.upper() if self.positional else "--" + name.replace("_", "-")
        # Our commands read SPINF_* variables; a model without a prefix (the root) reads none.
        prefix = model.model_config.get("env_prefix", "") if issubclass(model, BaseSettings) else ""
        self.env: str | None = f"{prefix}{name}".upper() if prefix and not self.positional else None
        self.type, _ = _bare(info.annotation)

    @property
    def secret(self) -> bool:
        return self.type is SecretStr

    @property
    def is_flag(self) -> bool:
        return self.type is bool

    def metavar(self) -> str:
        """The value's placeholder in ``--help`` (``N``, ``FILE``, ``{json,text}``)."""
        if "metavar" in _extra(self.info):
            return str(_extra(self.info)["metavar"])
        t = self.type
        if get_origin(t) is Literal:
            return "{" + ",".join(str(a) for a in get_args(t)) + "}"
        if get_origin(t) in (list, tuple, set):
            return "VALUE[,VALUE...]"
        return {int: "N", float: "NUMBER", Path: "PATH", SecretStr: "SECRET"}.get(t, "TEXT")

    def allowed(self) -> str:
        """What values are allowed, in words (``a whole number ≥ 0``, ``one of json, text``)."""
        if "allowed" in _extra(self.info):
            return str(_extra(self.info)["allowed"])
        t = self.type
        if get_origin(t) is Literal:
            return "one of " + ", ".join(str(a) for a in get_args(t))
        if t is bool:
            return "true or false"
        if t is int:
            return "a whole number" + _bounds(self.info)
        if t is float:
            return "a number" + _bounds(self.info)
        if t is Path:
            return "a file path"
        if get_origin(t) in (list, tuple, set):
            return "values, comma-separated (or the flag repeated)"
        return "any text"

    def default(self) -> str:
        """The default in words (``none``, ``on``/``off`` for flags), or ``required``."""
        if self.info.is_required():
            return "required"
        value = self.info.get_default(call_default_factory=True)
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, (list, tuple)):
            return ",".join(map(str, value))
        if isinstance(value, SecretStr):
            return "(hidden)"
        return str(value)

    def help(self) -> str:
        """The ``--help`` text: the description, then allowed values, default and variable."""
        allowed = self.allowed()
        notes = [] if self.is_flag or allowed == "any text" else [allowed]
        default = self.default()
        notes.append(default if default == "required" else f"default: {default}")
        if self.env:
            notes.append(f"env: {self.env}" + ("=true|false" if self.is_flag else ""))
        text = f"{(self.info.description or '').strip()} [{'; '.join(notes)}]".strip()
        return text.replace("%", "%%")  # argparse formats help with %


def options(root: type[BaseModel], prefix: str = "") -> dict[str, Option]:
    """Every option of the root and its subcommands (theirs too), by argparse ``dest``
    (``run.window_ms``, ``packs.show.model``)."""
    subs = subcommands(root)
    out = {prefix + name: Option(root, name, info) for name, info in root.model_fields.items() if name not in subs}
    for cmd, model in subs.items():
        out.update(options(model, f"{prefix}{cmd}."))
    return out


def argument_adder(root: type[BaseModel]) -> Callable[..., Any]:
    """An ``add_argument_method`` for pydantic-settings' ``CliSettingsSource`` that writes each
    option's help and placeholder in plain words (see :class:`Option`)."""
    by_dest = options(root)

    def add_argument(parser: Any, *args: Any, **kwargs: Any) -> Any:
        opt = by_dest.get(str(kwargs.get("dest")))
        if opt is not None and kwargs.get("help") not in (None, _SUPPRESS):
            kwargs["help"] = opt.help()
            if "metavar" in kwargs:
                kwargs["metavar"] = opt.metavar()
        return parser.add_argument(*args, **kwargs)

    return add_argument


# ------------------------------------------------------------------------------------ the errors


def _given_as_flag(opt: Option, argv: Sequence[str]) -> bool:
    names = {opt.flag, "--no-" + opt.flag[2:]} if opt.is_flag else {opt.flag}
    return any(a in names or a.startswith(opt.flag + "=") for a in argv)


def _shown(opt: Option, value: Any) -> str:
    if opt.secret:
        return "(hidden)"
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return shlex.quote(str(value))


def _field_error(opt: Option, err: Mapping[str, Any], argv: Sequence[str], environ: Mapping[str, str]) -> str:
    if err["type"] == "missing":
        return f"{opt.flag} {opt.metavar()} is required" + (f" (or set {opt.env})" if opt.env else "")
    value = err.get("input")
    if _given_as_flag(opt, argv) or not opt.env or opt.env not in environ:
        where = f"{opt.flag} {_shown(opt, value)}"
        other = f" (env: {opt.env})" if opt.env else ""
    else:
        where = f"{opt.env}={_shown(opt, environ[opt.env])} (from the environment)"
        other = f" (flag: {opt.flag})"
    return f"{where} is not allowed: use {opt.allowed()}{other}"


def _model_error(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", ""))
    return re.sub(r"^(Value error|Assertion failed), ", "", msg)


def explain(
    exc: BaseException, root: type[BaseModel], argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> str:
    """One line saying what is wrong with the command line (or its ``SPINF_*`` environment).

    ``exc``: a pydantic ``ValidationError`` of ``root`` (locations ``(command, field, ...)``) or a
    pydantic-settings ``SettingsError`` (argparse's complaint); anything else: ``str(exc)``
    flattened to one line.
    """
    import os

    env = os.environ if environ is None else environ
    subs = subcommands(root)
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            loc = list(err["loc"])
            model: type[BaseModel] = root
            if loc and loc[0] in subs:
                model = subs[str(loc.pop(0))]
            if loc and isinstance(loc[0], str) and loc[0] in model.model_fields:
                parts.append(_field_error(Option(model, loc[0], model.model_fields[loc[0]]), err, argv, env))
            else:
                parts.append(_model_error(err))
        return "; ".join(dict.fromkeys(parts))
    text = one_line(str(exc))
    text = re.sub(r"^error parsing CLI: ", "", text)
    m = re.match(r"unrecognized arguments: (.*)", text)
    if m:
        tokens = m.group(1).split()
        unknown = [a for a in tokens if a.startswith("-")]
        if not unknown:
            return (
                f"unexpected argument {tokens[0]!r}: values follow their flag (--name VALUE) and on/off flags "
                "take none (--strict, --no-strict)"
            )
        command = next((a for a in argv if a in subs), None)
        known = [o.flag for o in options(root).values() if command is None or o.model is subs.get(command)]
        hint = difflib.get_close_matches(unknown[0].split("=", 1)[0], known, n=1)
        listing = f"spinf-stream {command} --help" if command else "spinf-stream --help"
        return f"unknown option {unknown[0]}" + (f" (did you mean {hint[0]}?)" if hint else "") + f"; {listing} lists the options"
    m = re.match(r"argument (--[\w-]+): expected one argument", text)
    if m:
        return f"{m.group(1)} needs a value"
    m = re.match(r"argument \{[^}]*\}: invalid choice: '([^']*)'", text)
    if m:
        return f"unknown command {m.group(1)!r}: use one of {', '.join(subs)}"
    return text


def one_line(text: str) -> str:
    """A multi-line message as one line: the first line, then the others joined by ``; ``."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} {'; '.join(lines[1:])}"
