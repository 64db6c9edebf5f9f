"""The routes file of ``run --routes`` / ``dev --routes`` (``SPINF_ROUTES``): which packs, with
which models, score the records of which topics, and where their records go.

```yaml
dead_letter_topic: scores.dlq
routes:
  - topics: [messages]
    packs:
      - {pack: spam, model: qwen2.5-coder-0.5b}
      - {pack: moderation, model: qwen2.5-coder-0.5b, token_budget: 16384}
    output_topic: "scores.{pack}"
  - topics: [reviews]
    header: {spinf-source: shop}        # optional: only records with this header
    packs: [{pack: sentiment, model: smollm2-135m, calibration: auto}]
    output_topic: review-scores
```

A record belongs to the first route (in file order) whose topics hold it and whose ``header``
entries it carries (each with that exact UTF-8 value). ``output_topic`` may use ``{pack}`` (the
pack's name) and ``{model}`` (the model reference as written). Without ``--routes`` the flags
(``--pack``, ``--model``, ``--input-topic``, ...) make the one route (:func:`single_route`).

The file is checked in full before any weight loads (:func:`load_routes`, :func:`check_routes`):
a mistake is a :class:`~spinf_stream.errors.UsageError` naming the file and the key.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spinf_stream.config import DEFAULT_MODEL
from spinf_stream.engine import DEFAULT_TOKEN_BUDGET
from spinf_stream.errors import UsageError

__all__ = ["PackRoute", "Route", "RoutesFile", "check_routes", "load_routes", "single_route"]

#: placeholders an ``output_topic`` may use
TOPIC_PLACEHOLDERS = ("pack", "model")


class PackRoute(BaseModel):
    """One pack of a route, the model that scores it, its token budget and calibration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pack: str = Field(min_length=1, description="A shipped pack's name, or a pack file's path.")
    model: str = Field(DEFAULT_MODEL, min_length=1, description="A model alias, Hugging Face directory or GGUF file.")
    token_budget: int = Field(DEFAULT_TOKEN_BUDGET, ge=64, description="Tokens per forward pass of this pack's batches.")
    calibration: str = Field("auto", min_length=1, description="auto, none, a shipped variant or a calibration file.")

    @property
    def lane(self) -> str:
        """The key of this (pack, model) lane: packs with equal keys share their queue and engine."""
        return f"{self.pack}|{self.model}|{self.token_budget}|{self.calibration}"


def _pack_entry(v: Any) -> Any:
    return {"pack": v} if isinstance(v, str) else v


class Route(BaseModel):
    """Input topics (and an optional header match) → packs → an output topic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topics: Annotated[list[str], Field(min_length=1)]
    header: dict[str, str] | None = None
    packs: Annotated[list[PackRoute], Field(min_length=1)]
    output_topic: str = Field("scores", min_length=1)

    @field_validator("packs", mode="before")
    @classmethod
    def _packs(cls, v: Any) -> Any:
        return [_pack_entry(p) for p in v] if isinstance(v, list) else v

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        if any(not t.strip() for t in v):
            raise ValueError("a topic name is empty")
        return v

    @field_validator("output_topic")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(v) if name is not None]
        except ValueError as e:
            raise ValueError(f"{v!r} is not a topic template: {e}") from None
        unknown = [n for n in names if n not in TOPIC_PLACEHOLDERS]
        if unknown:
            raise ValueError(f"{v!r} uses {{{unknown[0]}}}; a template may use {{pack}} and {{model}}")
        return v

    def output_for(self, pack_name: str, p: PackRoute) -> str:
        """The output topic of ``p``'s records (``pack_name``: the loaded pack's name)."""
        return self.output_topic.format(pack=pack_name, model=p.model)


class RoutesFile(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dead_letter_topic: str = Field("scores.dlq", min_length=1)
    routes: Annotated[list[Route], Field(min_length=1)]

    @property
    def input_topics(self) -> list[str]:
        """Every route's topics, in file order, each once."""
        return list(dict.fromkeys(t for r in self.routes for t in r.topics))

    def lanes(self) -> dict[str, PackRoute]:
        """Each (pack, model, token budget, calibration) once, in file order, by its key."""
        return {p.lane: p for r in self.routes for p in r.packs}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_routes(path: str | Path) -> RoutesFile:
    """Read and validate a routes file (no pack, model or broker is touched: :func:`check_routes`).

    Raises:
        UsageError: missing or unreadable file, bad YAML, unknown or missing key, bad value
            (one line naming the file and the key, e.g. ``routes.yaml: routes[1].packs[0].model``).
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"routes file {p} does not exist (--routes, SPINF_ROUTES)")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: cannot be read: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{p}: must be a mapping with a 'routes' list, got {type(raw).__name__}")
    try:
        return RoutesFile.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise UsageError(f"{p}: {_loc(tuple(err['loc']))}: {err['msg']}") from None


def single_route(
    *, input_topics: list[str], output_topic: str, dlq_topic: str, pack: str, model: str, token_budget: int,
    calibration: str,
) -> RoutesFile:
    """The one route the flags make (``--input-topic``, ``--output-topic``, ``--pack``, ...)."""
    return RoutesFile(
        dead_letter_topic=dlq_topic,
        routes=[Route(
            topics=list(input_topics),
            packs=[PackRoute(pack=pack, model=model, token_budget=token_budget, calibration=calibration)],
            output_topic=output_topic.replace("{", "{{").replace("}", "}}"),
        )],
    )


def check_routes(routes: RoutesFile, path: str | Path, *, input_format: str = "json", models: bool = True) -> dict[str, Any]:
    """Load every pack of ``routes`` and check its calibration and (with ``models``) its model
    reference, as ``--pack``/``--calibration``/``--model`` are checked (no weights are read).

    Returns ``{lane key: Pack}``.

    Raises:
        UsageError: naming the file, the key and what is wrong (an unknown pack, a missing model,
            a calibration of another pack, ...).
    """
    from spinf_stream.calibration import CalibrationError
    from spinf_stream.cli.preflight import check_calibration, check_model_reference, check_pack
    from spinf_stream.models.convert import ModelLoadError
    from spinf_stream.models.resolve import ModelNotInstalled
    from spinf_stream.packs import PackError

    packs: dict[str, Any] = {}
    for i, route in enumerate(routes.routes):
        for j, p in enumerate(route.packs):
            at = f"{path}: routes[{i}].packs[{j}]"
            try:
                if p.lane not in packs:
                    packs[p.lane] = check_pack(p.pack, input_format)  # type: ignore[arg-type]
            except (PackError, UsageError) as e:
                raise UsageError(f"{at}.pack: {e}") from None
            try:
                check_calibration(p.calibration, packs[p.lane], flag="calibration", env="the routes file")
            except (CalibrationError, UsageError) as e:
                raise UsageError(f"{at}.calibration: {e}") from None
            if models:
                try:
                    check_model_reference(p.model)
                except (ModelNotInstalled, ModelLoadError) as e:
                    raise UsageError(f"{at}.model: {e}") from None
    return packs
