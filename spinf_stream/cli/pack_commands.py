"""``spinf-stream packs list`` and ``spinf-stream packs show PACK``: what a pack asks, without
reading its YAML.

``list``: every pack of the packs folders (``$SPINF_PACKS_DIR``, then the shipped ``packs/``)
with its version, question count and calibrations per model. ``show``: a pack's expanded
questions (ids, texts, choices or kind), its prompt rendered for an example message, and with
``--model`` its token counts under that model's tokenizer (no weights load).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field
from pydantic_settings import BaseSettings, CliPositionalArg, CliSubCommand

from spinf_stream.config import plain, settings_config
from spinf_stream.errors import UsageError


def _calibrations(pack: Any) -> tuple[list[str], list[str]]:
    """The models with a shipped default calibration, and the named variants, of ``pack``."""
    from spinf_stream.calibration import shipped_variants

    src = Path(pack.source)
    where = src.parent / src.stem / "calibrations"
    models = sorted(p.stem for p in where.glob("*.json")) if where.is_dir() else []
    return models, shipped_variants(pack)


def _kind(q: Any) -> str:
    if q.extract is None:
        return "choice" + ("" if q.choice_scoring == "sum" else f" ({q.choice_scoring})")
    return "generate" if q.extract.kind == "generate" else f"extract {q.extract.kind}"


class PacksListCommand(BaseSettings):
    """List the packs: name, version, questions (choice / extraction), calibrations per model, file."""

    model_config = settings_config()

    def cli_cmd(self) -> None:
        from rich.console import Console
        from rich.table import Table

        from spinf_stream.packs import PackError, load_pack, packs_dirs

        t = Table(header_style="bold")
        for col in ("pack", "version", "questions", "calibrated for", "variants", "description"):
            t.add_column(col, overflow="fold")
        seen: set[str] = set()
        for d in packs_dirs():
            for f in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]) if d.is_dir() else []:
                if f.stem in seen:
                    continue  # an earlier folder's pack of that name is the one a bare name loads
                seen.add(f.stem)
                try:
                    pack = load_pack(f)
                except PackError as e:
                    t.add_row(f.stem, "", "", "", "", f"[red]invalid: {e.problems[0][2]}[/red]")
                    continue
                qs = pack.expand()
                n_x = sum(q.extract is not None for q in qs)
                models, variants = _calibrations(pack)
                counted = f"{len(qs)}" + (f" ({len(qs) - n_x} choice, {n_x} extraction)" if n_x else "")
                t.add_row(pack.name, pack.version, counted, ", ".join(models) or "-", ", ".join(variants) or "-",
                          pack.description)
        Console().print(t)


class PacksShowCommand(BaseSettings):
    """Show a pack: its expanded questions, its prompt rendered for an example message, and with
    --model the token counts under that model's tokenizer."""

    model_config = settings_config()

    pack: CliPositionalArg[str] = Field(description="A pack file or the name of a shipped pack.")
    model: str | None = Field(None, description="Count tokens with this model's tokenizer (no weights load).",
                              json_schema_extra=plain("NAME|PATH"))
    message: str | None = Field(
        None, description="The example message, a JSON object with the prompt's fields (default: a placeholder "
        "text per field).", json_schema_extra=plain("JSON"),
    )

    def cli_cmd(self) -> None:
        from rich.console import Console
        from rich.table import Table

        from spinf_stream.cli import preflight
        from spinf_stream.packs import load_pack

        pack = load_pack(self.pack)
        fields = self._example(pack)
        if self.model is not None:
            preflight.check_model_reference(self.model)
        console = Console()
        models, variants = _calibrations(pack)
        console.print(f"[bold]{pack.name}[/bold] {pack.version}: {pack.description}", highlight=False)
        console.print(f"file: {pack.source}; fields: {', '.join(pack.fields)}; choice_scoring: {pack.choice_scoring}; "
                      f"calibrated for: {', '.join(models) or 'none'}"
                      + (f"; variants: {', '.join(variants)}" if variants else ""), highlight=False, markup=False)
        counts = self._token_counts(pack, fields) if self.model is not None else None
        t = Table(header_style="bold")
        for col in ("id", "text", "answer", *(("branch tokens",) if counts else ())):
            t.add_column(col, overflow="fold")
        for q in pack.expand():
            answer = ", ".join(q.choices) if q.extract is None else _kind(q) + (f", none word {q.extract.none!r}"
                                                                                 if q.extract.none else "")
            row = [q.id, q.text, answer if q.extract is not None else f"{_kind(q)}: {answer}"]
            if counts:
                row.append(counts["questions"][q.id])
            t.add_row(*row)
        console.print(t)
        first = pack.expand()[0]
        prompt = pack.preamble + pack.render_prompt(fields) + pack.render_question(first)
        console.print(f"[bold]The prompt of question {first.id!r} for the example message[/bold] "
                      f"({orjson.dumps(fields).decode()}):", highlight=False)
        console.print(prompt, highlight=False, markup=False)
        if counts:
            console.print(f"tokens ({self.model}): preamble {counts['preamble']} (computed once per pack), the example's "
                          f"content {counts['content']} (its prompt and the question text all questions share, read "
                          f"once), question branches {counts['branches']} in all", highlight=False)

    def _example(self, pack: Any) -> dict[str, str]:
        if self.message is None:
            return {f: f"<{f}: the message's {f}>" for f in pack.fields}
        try:
            fields = orjson.loads(self.message)
        except orjson.JSONDecodeError as e:
            raise UsageError(f"--message: not JSON ({e})") from None
        if not isinstance(fields, dict):
            raise UsageError("--message: give a JSON object with the prompt's fields")
        missing = [f for f in pack.fields if not isinstance(fields.get(f), str)]
        if missing:
            raise UsageError(f"--message: pack {pack.name}'s prompt uses {', '.join('{' + f + '}' for f in missing)}, "
                             "which the message lacks (or has as a non-string)")
        return {f: fields[f] for f in pack.fields}

    def _token_counts(self, pack: Any, fields: dict[str, str]) -> dict[str, Any]:
        """Tokens of the preamble, of the example's content and of each question's branch (its
        text and template; choices: ``+n`` per label), as the engine tokenizes them."""
        from transformers import AutoTokenizer

        from spinf_stream.engine.segment import Segmenter
        from spinf_stream.models.resolve import resolve

        resolved = resolve(self.model)  # type: ignore[arg-type]
        tok = AutoTokenizer.from_pretrained(str(resolved.path))
        seg = Segmenter(tok, pack, max_positions=1 << 30)
        prepared = seg.prepare(0, "example", fields)
        questions: dict[str, str] = {}
        for b in prepared.branches:
            q = seg.questions[b.question]
            own = len(b.tokens) - (len(b.reads) - 1)
            extra = f" (+{' / '.join(str(len(c)) for c in b.choices)} for the choices)" if q.extract is None else \
                f" (+ up to {q.extract.max_tokens} written)"
            questions[q.id] = f"{own}{extra}"
        return {"preamble": len(seg.preamble_ids), "content": len(prepared.content),
                "branches": sum(len(b.tokens) for b in prepared.branches), "questions": questions}


class PacksCommand(BaseSettings):
    """See what the packs ask: `packs list`, `packs show PACK`."""

    model_config = settings_config()

    list: CliSubCommand[PacksListCommand] = Field(description="list the packs with versions, question counts and calibrations")
    show: CliSubCommand[PacksShowCommand] = Field(description="show a pack's questions, its prompt and token counts")

    def cli_cmd(self) -> None:
        from pydantic_settings import CliApp

        if self.list is None and self.show is None:
            raise UsageError("choose list or show (spinf-stream packs --help)")
        CliApp.run_subcommand(self)
        sys.stdout.flush()
