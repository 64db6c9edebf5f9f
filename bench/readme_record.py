"""Regenerate the sample score record in README.md from a real run, so it cannot go stale.

    python bench/readme_record.py [--check]

Scores ``examples/messages.jsonl`` with the spam pack, the default model and its shipped
calibration (``spinf-stream score``'s defaults), and writes the record of ``ex-02`` into the
README's ```json block after "Output: one line per input line": numbers to 3 decimals, hashes
cut short. ``--check`` exits 1 when the README's block differs, leaving the ``numerics`` line and
the digest out of the comparison (they belong to this kind of machine).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
README = REPO / "README.md"
ANCHOR = "one line per input line, in order, written and flushed as each forward pass finishes:\n\n```json\n"
EXAMPLE = "ex-02"


def _j(value: object) -> str:
    import orjson

    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_j(k)}: {_j(v)}" for k, v in value.items()) + "}"
    return orjson.dumps(value).decode().replace(",", ", ").replace(":", ": ") if not isinstance(value, str) else orjson.dumps(value).decode()


def render(record: dict) -> str:
    """The record as the README shows it (one key of the top level per line)."""
    m = dict(record["model"])
    m["sha256"] = (m["sha256"] or "")[:7] + "..."
    numerics = m.pop("numerics")
    head = ", ".join(f'"{k}": {_j(v)}' for k, v in m.items())
    lines = [
        f'{{"id": {_j(record["id"])}, "pack": {_j(record["pack"])},',
        f' "model": {{{head},',
        f'           "numerics": {_j(numerics)}}},',
    ]
    scores = record["scores"]
    parts = []
    for qid, s in scores.items():
        rest = {k: v for k, v in s.items() if k not in ("answer", "choices")}
        choices = ",\n".join(f'{" " * 52}{_j(c)}: {_j(v)}' for c, v in s["choices"].items()).lstrip()
        extra = "".join(f", {_j(k)}: {_j(v)}" for k, v in rest.items())
        parts.append(f'{_j(qid)}: {{"answer": {_j(s["answer"])}, "choices": {{{choices}}}{extra}}}')
    lines.append(' "scores": {' + ", ".join(parts) + "},")
    tail = [f'"calibration": {_j(record["calibration"])}'] if "calibration" in record else []
    tail.append(f'"digest": "{record["digest"][:15]}..."')
    lines.append(" " + ", ".join(tail) + "}")
    return "\n".join(lines) + "\n"


def _without_numerics(block: str) -> str:
    """The block less what names this kind of machine: the numerics line and the digest (whose
    bits are those of this CPU's kernels)."""
    block = re.sub(r'\n +"numerics": .*\n', "\n", block)
    return re.sub(r'"digest": "sha256:[0-9a-f]+\.\.\."', '"digest": "sha256:..."', block)


def main(argv: list[str] | None = None) -> int:
    from spinf_stream.config import DEFAULT_MODEL
    from spinf_stream.engine import Engine, Message
    import orjson

    check = "--check" in (argv if argv is not None else sys.argv[1:])
    rows = [orjson.loads(x) for x in (REPO / "examples" / "messages.jsonl").read_bytes().splitlines() if x.strip()]
    row = next(r for r in rows if r["id"] == EXAMPLE)
    engine = Engine.load(DEFAULT_MODEL, "spam")
    record = engine.score([Message(row["id"], row)])[0].model_dump(mode="json")
    new = render(record)
    text = README.read_text(encoding="utf-8")
    start = text.index(ANCHOR) + len(ANCHOR)
    end = text.index("```\n", start)
    if check:
        same = _without_numerics(text[start:end]) == _without_numerics(new)
        if not same:
            print(f"README.md's sample record is stale; python bench/readme_record.py writes:\n{new}", file=sys.stderr)
        return 0 if same else 1
    README.write_text(text[:start] + new + text[end:], encoding="utf-8")
    print(new, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
