"""Stand-ins for the engine in command-line tests, and a ``spinf-stream`` that uses them.

``python tests/fakes.py ARGS...`` runs ``spinf_stream.cli.main(ARGS)`` with the module
``spinf_stream.engine.scoring`` replaced (so torch is imported only where the command itself imports it)
by one whose ``Engine.load`` does what the ``FAKE_ENGINE`` environment variable says:

- ``trap`` (the default): loading a model writes ``MODEL LOADED`` to stderr and exits 99, so a
  test of a usage mistake can assert that the mistake was reported before any weight loaded;
- ``slow:<seconds>``: a :class:`SlowEngine` whose every forward pass takes that long.

Everything else (settings, checks, error reporting, file handling) is the real command.
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker import FakePrepared, FakeScorer  # noqa: E402

FAKES = Path(__file__).resolve()
TRAP_EXIT = 99


@dataclass
class SlowEngine(FakeScorer):
    """:class:`broker.FakeScorer` with ``run_iter``: ``pass_messages`` messages per forward pass,
    each pass ``delay_s`` long. ``lines_at_pass_start[k]``: lines in ``watch`` (the output file)
    when pass ``k`` started."""

    pass_messages: int = 10
    watch: Path | None = None
    lines_at_pass_start: list[int] = field(default_factory=list)
    pass_sizes: list[int] = field(default_factory=list)

    def run_iter(self, prepared: Sequence[FakePrepared]) -> Iterator[list[Any]]:
        for start in range(0, len(prepared), self.pass_messages):
            if self.watch is not None:
                self.lines_at_pass_start.append(len(self.watch.read_bytes().splitlines()) if self.watch.exists() else 0)
            group = prepared[start : start + self.pass_messages]
            self.pass_sizes.append(len(group))
            yield self.run(group)


def _patched_load(*args: Any, **kwargs: Any) -> Any:
    mode = os.environ.get("FAKE_ENGINE", "trap")
    if mode == "trap":
        print("MODEL LOADED", file=sys.stderr, flush=True)
        os._exit(TRAP_EXIT)
    if mode.startswith("slow:"):
        return SlowEngine(delay_s=float(mode.split(":", 1)[1]), pass_messages=int(os.environ.get("FAKE_PASS_MESSAGES", "10")))
    raise ValueError(f"FAKE_ENGINE={mode!r}")


@dataclass(frozen=True)
class _Message:
    id: str
    fields: Mapping[str, Any] = field(default_factory=dict)


class _Engine:
    load = staticmethod(_patched_load)


def main() -> None:
    started = time.monotonic()
    fake = types.ModuleType("spinf_stream.engine.scoring")
    fake.Engine, fake.Message = _Engine, _Message  # type: ignore[attr-defined]
    sys.modules["spinf_stream.engine.scoring"] = fake
    from spinf_stream.cli import main as cli_main

    try:
        cli_main(sys.argv[1:])
    finally:
        if os.environ.get("FAKE_TIMING"):
            print(f"FAKE_TIMING {time.monotonic() - started:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
