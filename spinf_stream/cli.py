"""The ``spinf-stream`` console script: one subcommand per module, parsed by pydantic-settings
(flags in kebab case; the service's settings also read ``SPINF_*`` environment variables)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from pydantic import Field
from pydantic_settings import BaseSettings, CliApp, CliSubCommand, SettingsConfigDict

from .evaluation import CalibrateCommand, EvaluateCommand
from .offline import ScoreCommand
from .stream.commands import ConsumeCommand, DevCommand, ProduceCommand, RunCommand


class SpinfStream(BaseSettings):
    """Score every message of a stream against a prompt pack with a language model."""

    model_config = SettingsConfigDict(
        cli_prog_name="spinf-stream", cli_kebab_case=True, cli_implicit_flags=True, cli_exit_on_error=True
    )

    score: CliSubCommand[ScoreCommand] = Field(description="score a JSON Lines file offline")
    evaluate: CliSubCommand[EvaluateCommand] = Field(description="measure a pack on labelled rows (AUC, accuracy, ECE, ...)")
    calibrate: CliSubCommand[CalibrateCommand] = Field(description="fit a pack's calibration on labelled rows")
    run: CliSubCommand[RunCommand] = Field(description="score Kafka topics (the service)")
    dev: CliSubCommand[DevCommand] = Field(description="run the scorer on an embedded broker (Tansu)")
    produce: CliSubCommand[ProduceCommand] = Field(description="publish a JSON Lines file to a topic")
    consume: CliSubCommand[ConsumeCommand] = Field(description="print a topic's records as JSON lines")

    def cli_cmd(self) -> None:
        CliApp.run_subcommand(self)


def _friendly_errors() -> tuple[type[BaseException], ...]:
    from .calibration import CalibrationError
    from .labelled import LabelledInputError
    from .segment import LayoutError
    from .models import UnsupportedModel
    from .models.weights import ModelLoadError, ModelNotInstalled
    from .packs import PackError

    return (PackError, CalibrationError, LabelledInputError, ModelNotInstalled, ModelLoadError, UnsupportedModel, LayoutError, FileNotFoundError)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point. Exit codes: 0 ok, 1 ``--strict`` saw bad lines, 2 bad usage, pack or model."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        CliApp.run(SpinfStream, cli_args=args)
    except _friendly_errors() as e:
        print(f"spinf-stream: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
