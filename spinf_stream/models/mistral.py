"""Mistral: how it differs from Llama.

Llama plus a sliding window on every layer where the config sets one
(Mistral 7B v0.1: 4,096; later versions: none)."""

from __future__ import annotations

from typing import Any

from . import llama
from .spec import ModelSpec


def spec_from_config(config: Any) -> ModelSpec:
    return llama.spec_from_config(config, family="mistral")
