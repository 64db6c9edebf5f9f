"""Model files: checked, and GGUF converted to a Hugging Face directory.

What makes a Hugging Face directory or a GGUF file usable, and a GGUF file
converted once into a cached Hugging Face directory (dequantized to float32)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from .cache import publish, source_key

logger = logging.getLogger(__name__)

_GGUF_MAGIC = b"GGUF"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


class ModelLoadError(RuntimeError):
    """A reference that is no usable model: the message names the path and what is wrong with it."""


def check_hf_dir(path: Path) -> None:
    """Raise ModelLoadError unless ``path`` holds config, safetensors weights and a tokenizer, and
    any ``quantization_config`` is one :mod:`spinf_stream.models.int4_checkpoints` reads."""
    problems = []
    if not (path / "config.json").is_file():
        problems.append("no config.json")
    if not any(path.glob("*.safetensors")):
        other = sorted(p.name for p in path.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".gguf"})
        hint = f" (found {', '.join(other)}; only safetensors weights are read)" if other else ""
        problems.append(f"no *.safetensors weights{hint}")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        problems.append(f"no tokenizer files (one of {', '.join(_TOKENIZER_FILES)})")
    if problems:
        raise ModelLoadError(f"{path} is not a Hugging Face model directory: {'; '.join(problems)}")
    from .int4_checkpoints import int4_format

    try:
        int4_format(path / "config.json")  # a quantization_config we cannot read: refused now, naming the key
    except ValueError as exc:  # json.JSONDecodeError
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {exc}") from None


def check_gguf_file(path: Path) -> Path:
    """Return ``path`` if it is a readable GGUF file, else raise ModelLoadError saying why."""
    if path.suffix.lower() != ".gguf":
        hint = (
            f"; pass its directory {path.parent} instead"
            if path.suffix == ".safetensors" or path.name == "config.json"
            else ""
        )
        raise ModelLoadError(
            f"{path} is not a supported model file: expected a .gguf file or a Hugging Face directory{hint}"
        )
    try:
        with path.open("rb") as f:
            magic = f.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file: it starts with {magic!r}, not {_GGUF_MAGIC!r}")
    return path


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` to float32 and ``save_pretrained`` its model and tokenizer into ``out``.

    Raises ModelLoadError if transformers cannot read the file.
    """
    # Imported here: a cache hit must not pay for importing torch and transformers.
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, object] = {}
    gguf_config = getattr(transformers, "GgufConfig", None)
    if gguf_config is not None:
        # transformers 5 keeps a GGUF quantizer on the model that refuses save_pretrained;
        # asking for a dequantized load drops it, so the dense float32 weights can be saved.
        kwargs["quantization_config"] = gguf_config(dequantize=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **kwargs
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except MemoryError:
        raise
    except Exception as exc:  # transformers raises many kinds for files it cannot read
        raise ModelLoadError(f"transformers cannot convert GGUF file {gguf}: {exc}") from exc
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def converted(gguf: Path, root: Path, convert: Callable[[Path, Path], None] = convert_gguf) -> Path:
    """The HF directory converted from ``gguf`` in cache ``root``, converting it first if absent
    (``convert(gguf, out)`` fills ``out``; default :func:`convert_gguf`).

    Raises:
        ModelLoadError: the conversion failed, or its output is no HF directory.
    """
    final = root / "models" / f"{gguf.stem}-{source_key([gguf])}"
    if final.is_dir():
        return final

    def build(tmp: Path) -> None:
        logger.info(
            "converting %s to a Hugging Face directory in %s (dequantizing to float32; once, about a minute)",
            gguf,
            final,
        )
        start = time.perf_counter()
        convert(gguf, tmp)
        check_hf_dir(tmp)
        logger.info("converted %s in %.1f s", gguf.name, time.perf_counter() - start)

    return publish(final, build)
