"""The ``spinf-stream`` commands: argument parsing, usage errors, and each command's code.

- ``main``: the command line (pydantic-settings subcommands), exit codes
- ``usage``: one-line usage errors and ``--help`` text
- ``preflight``: checks of packs, calibrations, model references and input files before any
  weights load
- ``offline``: ``score`` (a JSONL file through the engine)
- ``labelled_commands``, ``evaluation``: ``evaluate`` and ``calibrate`` on labelled data
- ``stream_commands``: ``run``, ``dev``, ``produce``, ``consume`` (their work is in
  :mod:`spinf_stream.stream`)
"""

from spinf_stream.cli.main import SpinfStream, main

__all__ = ["SpinfStream", "main"]
