"""Checks of packs, models and files that run before any weights load.

Each takes milliseconds: the pack, the model
reference, the input file, the output file. Each raises a one-line error naming the flag, its
``SPINF_*`` variable, the bad value and what to do; the Kafka checks of ``run`` are in
:mod:`spinf_stream.stream.topic_checks`.
"""

from __future__ import annotations

from pathlib import Path

from spinf_stream.errors import UsageError
from spinf_stream.messages import InputFormat, StreamInputFormat, text_field
from spinf_stream.packs import Pack, load_pack

__all__ = ["check_calibration", "check_fields", "check_input_file", "check_model_reference", "check_output_file", "check_pack"]


def check_pack(ref: str, input_format: StreamInputFormat = "json") -> Pack:
    """Load the pack (``--pack``); with ``--input-format text`` it must use exactly one field.

    Raises:
        spinf_stream.packs.PackError: the pack cannot be loaded (names the file and key).
        UsageError: ``text`` input with a pack whose prompt uses several fields.
    """
    pack = load_pack(ref)
    if input_format == "text":
        text_field(pack.fields, f"pack {pack.name}")
    return pack


def check_fields(pack: Pack, path: str | Path, input_format: InputFormat = "json") -> None:
    """The first line of a JSON Lines input carries every field the pack's prompt uses (a typo
    such as ``{txt}`` is found before the model loads). A first line that cannot be read, stdin
    and text input are not checked (those lines get their error records as usual).

    Raises:
        UsageError: the first line is a JSON object that lacks one of the prompt's fields.
    """
    if str(path) == "-" or input_format != "json":
        return
    from spinf_stream.messages import Decoded, decode

    with open(path, "rb") as f:
        first = next((line.rstrip(b"\r\n") for line in f if line.strip()), None)
    got = decode(first) if first is not None else None
    if not isinstance(got, Decoded):
        return
    missing = [name for name in pack.fields if name not in got.fields]
    if missing:
        uses = ", ".join("{" + n + "}" for n in missing)
        has = ", ".join(sorted(got.fields)) or "none"
        raise UsageError(f"pack {pack.name}'s prompt uses {uses}, which the first line of {path} does not have "
                         f"(its fields: {has}): fix the pack's prompt or the input")


def check_model_reference(ref: str) -> None:
    """``--model`` names an installed model or an existing model path (no weights are read).

    Raises:
        spinf_stream.models.resolve.ModelNotInstalled, ModelLoadError.
    """
    from spinf_stream.models.resolve import check_reference

    check_reference(ref)


def check_input_file(path: str | Path, flag: str, env: str) -> None:
    """``path`` (``-`` = stdin) is a readable file.

    Raises:
        UsageError: it does not exist, is a directory, or cannot be opened for reading.
    """
    if str(path) == "-":
        return
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{flag} {path} ({env}): no such file")
    if p.is_dir():
        raise UsageError(f"{flag} {path} ({env}): is a directory, not a file")
    try:
        with open(p, "rb"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path} ({env}): cannot be read: {e.strerror or e}") from None


def check_output_file(path: str | Path, flag: str, env: str, *, input_path: str | Path | None = None) -> None:
    """``path`` (``-`` = stdout) can be written: an existing writable file, or a new file in a
    writable directory (created here if missing), and not the input file.

    Raises:
        UsageError: it is a directory, the input file, or not writable.
    """
    if str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path} ({env}): is a directory; give a file name")
    if p.exists() and input_path is not None and str(input_path) != "-" and Path(input_path).exists():
        if p.samefile(input_path):
            raise UsageError(f"{flag} {path} ({env}) is the input file: writing it would destroy the input")
    existed = p.exists()
    parent = p.parent
    if not existed:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{flag} {path} ({env}): cannot create its directory {parent}: {e.strerror or e}") from None
    try:  # the only test that also holds for root, read-only file systems and ACLs: open it
        with open(p, "ab"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path} ({env}): cannot be written: {e.strerror or e}") from None
    if not existed:
        p.unlink(missing_ok=True)  # leave no empty file behind if a later check fails


def check_calibration(ref: str, pack: Pack, flag: str = "--calibration", env: str = "SPINF_CALIBRATION") -> None:
    """``--calibration``: ``auto``, ``none``, a shipped variant's name (``recall95``), or a readable
    calibration file made for this pack file
    (whether it was made for the model's weights is checked when the model resolves).

    Raises:
        UsageError: the file does not exist or is a directory.
        spinf_stream.calibration.CalibrationError: not a calibration file, or one for another pack.
    """
    if ref in ("auto", "none"):
        return
    from spinf_stream import calibration

    if calibration.variant_of(ref, pack) is not None:
        return
    if not Path(ref).exists() and calibration.VARIANT_NAME.match(ref):
        shipped = calibration.shipped_variants(pack)
        raise UsageError(
            f"{flag} {ref} ({env}): no such file, and pack {pack.name} ships no calibration of that name"
            f" (shipped: {', '.join(['auto', *shipped])})"
        )
    check_input_file(ref, flag, env)
    calibration.check(calibration.load(ref), calibration.pack_identity(pack), None)
