"""Qwen3: how it differs from Llama.

Llama plus a per-head RMSNorm on queries and keys before rotary (``q_norm``,
``k_norm``), no q/k/v bias unless ``attention_bias``."""

from __future__ import annotations

from typing import Any

from . import llama
from .spec import ModelSpec


def spec_from_config(config: Any) -> ModelSpec:
    return llama.spec_from_config(config, family="qwen3", qk_norm=True)
