"""The Llama family, which every other family is stated against.

Llama 2/3, SmolLM/SmolLM2: the plain pre-norm decoder. Weight names follow transformers'
``LlamaForCausalLM``."""

from __future__ import annotations

from typing import Any

from .spec import LayerSpec, ModelSpec, layer_rope_params, rope_from_params


def head_dim_of(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def layer_windows(config: Any) -> list[int | None]:
    """Per-layer sliding window from ``layer_types`` (transformers ≥ 4.54) or a global
    ``sliding_window``; ``None`` = full attention."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * n


def spec_from_config(config: Any, *, family: str = "llama", **overrides: Any) -> ModelSpec:
    """A :class:`ModelSpec` for a Llama-shaped checkpoint; other families pass their
    differences as ``overrides`` (e.g. ``qkv_bias=True`` for Qwen2)."""
    hd = head_dim_of(config)
    windows = layer_windows(config)
    types = getattr(config, "layer_types", None) or [None] * config.num_hidden_layers
    layers = tuple(
        LayerSpec(rope=rope_from_params(config, layer_rope_params(config, t), hd, t), window=w)
        for t, w in zip(types, windows)
    )
    fields: dict[str, Any] = dict(
        family=family,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=hd,
        intermediate_size=config.intermediate_size,
        norm_eps=config.rms_norm_eps,
        activation=getattr(config, "hidden_act", "silu"),
        layers=layers,
        max_positions=config.max_position_embeddings,
        query_scale=hd**-0.5,
        qkv_bias=bool(getattr(config, "attention_bias", False)),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )
    fields.update(overrides)
    return ModelSpec(**fields)
