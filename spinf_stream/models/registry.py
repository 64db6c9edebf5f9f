"""The model families, keyed by the checkpoint's ``model_type``.

Each family module states only how it differs from Llama (``spec_from_config``)."""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

from .spec import ModelSpec

#: ``model_type`` → module in this package defining ``spec_from_config(config)``.
FAMILIES: dict[str, str] = {
    "llama": ".llama",
    "mistral": ".mistral",
    "qwen2": ".qwen2",
    "qwen3": ".qwen3",
    "gemma3_text": ".gemma3",
    "gemma3": ".gemma3",
}
#: multimodal checkpoints whose ``text_config`` is one of the families (Idefics3 / SmolVLM: Llama)
MULTIMODAL = ("gemma3", "idefics3")


class UnsupportedModel(ValueError):
    """The checkpoint's family is not one we implement."""


def spec_for(config: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a transformers config (multimodal Gemma 3 and Idefics3: their text config).

    Raises:
        UnsupportedModel: unknown ``model_type``.
    """
    multimodal = getattr(config, "model_type", None) in MULTIMODAL and hasattr(config, "text_config")
    gemma = getattr(config, "model_type", None) == "gemma3"
    if multimodal:
        config = config.text_config
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        raise UnsupportedModel(f"model_type {mt!r} is not supported; supported: {sorted(FAMILIES)}")
    module = importlib.import_module(FAMILIES[mt], __package__)
    spec = module.spec_from_config(config)
    if multimodal and gemma:
        # transformers' Gemma3ForConditionalGeneration applies no final-logit soft cap (Gemma 3's
        # checkpoints set none; its text-only class applies one when set)
        spec = replace(spec, final_softcap=None)
    return spec
