"""Decoder-only language models for scoring: re-exports of the names the project uses.

- :mod:`.registry`: the families by ``model_type`` (:func:`spec_for`);
- :mod:`.loader`: a checkpoint as a :class:`Decoder` (:func:`load_decoder`, :func:`build_decoder`,
  :func:`quantize_fp8`, :func:`quantize_int8`);
- :mod:`.resolve`: model references (short names, directories, GGUF files) → directories;
- :mod:`.backend`: the kernel back ends (:mod:`.ops` their interface).
"""

from __future__ import annotations

from .decoder import Decoder
from .loader import QUANTIZED, build_decoder, load_decoder, quantize_fp8, quantize_int8
from .registry import FAMILIES, UnsupportedModel, spec_for
from .spec import ModelSpec

__all__ = [
    "Decoder", "ModelSpec", "UnsupportedModel", "build_decoder", "load_decoder", "quantize_fp8", "quantize_int8",
    "QUANTIZED", "spec_for", "FAMILIES",
]
