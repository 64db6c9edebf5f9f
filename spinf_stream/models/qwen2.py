"""Qwen2 and Qwen2.5: how they differ from Llama.

Llama plus biases on the q, k and v projections (and, when
``use_sliding_window`` is set, sliding windows on the layers ``layer_types`` names)."""

from __future__ import annotations

from typing import Any

from . import llama
from .spec import ModelSpec


def spec_from_config(config: Any) -> ModelSpec:
    return llama.spec_from_config(config, family="qwen2", qkv_bias=True)
