"""The ``spinf-stream`` console script and its exit codes.

One subcommand per module, parsed by pydantic-settings
(flags in kebab case; every command also reads its ``SPINF_*`` environment variables).

Exit codes: 0 ok; 1 a failure at run time (``score``: no line could be scored, or ``--strict``
saw a bad one; ``run``: the service stopped on an error); 2 a usage mistake, reported as one line
on stderr before any weight loads (a bad flag or ``SPINF_*`` value, an unknown pack field, a
missing input file, an unwritable output, an unreachable broker, a missing topic, a device or
dtype this machine cannot run); 130 interrupted. No traceback unless ``--log-level DEBUG``.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence

from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    CliApp,
    CliSettingsSource,
    CliSubCommand,
    CliToggleFlag,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.exceptions import SettingsError

from spinf_stream.errors import UsageError
from spinf_stream.cli.labelled_commands import CalibrateCommand, EvaluateCommand, LabelsCommand
from spinf_stream.cli.offline import ScoreCommand
from spinf_stream.cli.pack_commands import PacksCommand
from spinf_stream.cli.stream_commands import ConsumeCommand, DevCommand, ProduceCommand, RunCommand, ServeCommand
from spinf_stream.cli.usage import argument_adder, explain, one_line, subcommands

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

#: (module, class) of the errors that mean "fix the command line, the pack or the model": exit 2.
#: Looked up in sys.modules only, so reporting them never imports torch.
USAGE_ERRORS = (
    ("spinf_stream.packs", "PackError"),
    ("spinf_stream.models.resolve", "ModelNotInstalled"),
    ("spinf_stream.models.convert", "ModelLoadError"),
    ("spinf_stream.models.registry", "UnsupportedModel"),
    ("spinf_stream.engine.segment", "LayoutError"),
    ("spinf_stream.stream.broker", "BrokerError"),
    ("spinf_stream.calibration", "CalibrationError"),
    ("spinf_stream.labelled", "LabelledInputError"),
    ("spinf_stream.label_sets", "LabelSetError"),
    ("spinf_stream.models.numerics", "UnstableBits"),
)


class SpinfStream(BaseSettings):
    """Score every message of a stream against a prompt pack with a language model."""

    model_config = SettingsConfigDict(
        cli_prog_name="spinf-stream", cli_kebab_case=True, cli_implicit_flags=True, cli_exit_on_error=False
    )

    version: CliToggleFlag[bool] = Field(
        False, description="Print the version, the torch and triton versions and the GPUs torch sees, then exit."
    )
    score: CliSubCommand[ScoreCommand] = Field(description="score a JSON Lines file offline")
    evaluate: CliSubCommand[EvaluateCommand] = Field(description="measure a pack on labelled rows (AUC, accuracy, ECE, ...)")
    calibrate: CliSubCommand[CalibrateCommand] = Field(description="fit a pack's calibration on labelled rows")
    labels: CliSubCommand[LabelsCommand] = Field(description="write a pack's labelled rows from its data sets")
    run: CliSubCommand[RunCommand] = Field(description="score Kafka topics (the service)")
    dev: CliSubCommand[DevCommand] = Field(description="run the scorer on an embedded broker (Tansu)")
    serve: CliSubCommand[ServeCommand] = Field(description="serve the HTTP API alone (no Kafka): /v1/score, /v1/completions")
    produce: CliSubCommand[ProduceCommand] = Field(description="publish a JSON Lines file to a topic")
    consume: CliSubCommand[ConsumeCommand] = Field(description="print a topic's records as JSON lines")
    packs: CliSubCommand[PacksCommand] = Field(description="list the packs, or show one's questions, prompt and tokens")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The root reads only the command line: an unrelated VERSION variable must not print versions.
        return (init_settings,)

    def cli_cmd(self) -> None:
        if self.version:
            from spinf_stream.device import describe_runtime

            print("\n".join(describe_runtime()))
            return
        if all(getattr(self, name) is None for name in subcommands(type(self))):
            raise UsageError(f"choose a command: {', '.join(subcommands(type(self)))} (spinf-stream --help)")
        CliApp.run_subcommand(self)


def _is_usage_error(exc: BaseException) -> bool:
    if isinstance(exc, (UsageError, ValidationError, SettingsError)):
        return True
    for module, name in USAGE_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def _wants_traceback(args: Sequence[str]) -> bool:
    for i, a in enumerate(args):
        if a == "--log-level=DEBUG" or (a == "--log-level" and args[i + 1 : i + 2] == ["DEBUG"]):
            return True
    return os.environ.get("SPINF_LOG_LEVEL", "").upper() == "DEBUG"


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point; ends the process with the exit code (see the module docstring)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args if a in subcommands(SpinfStream)), None)
    prog = "spinf-stream" + (f" {command}" if command else "")
    try:
        source: CliSettingsSource[SpinfStream] = CliSettingsSource(
            SpinfStream, add_argument_method=argument_adder(SpinfStream)
        )
        CliApp.run(SpinfStream, cli_args=args, cli_settings_source=source)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Exception as exc:
        debug = _wants_traceback(args)
        if debug:
            traceback.print_exc()
        if _is_usage_error(exc):
            print(f"{prog}: error: {explain(exc, SpinfStream, args)}", file=sys.stderr)
            raise SystemExit(EXIT_USAGE) from None
        hint = "" if debug else " (--log-level DEBUG shows the traceback)"
        print(f"{prog}: error: {type(exc).__name__}: {one_line(str(exc))}{hint}", file=sys.stderr)
        raise SystemExit(EXIT_FAILED) from None


if __name__ == "__main__":
    main()
