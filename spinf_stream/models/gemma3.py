"""Gemma 3 (text): how it differs from Llama.

Llama plus
- RMSNorm scales stored as ``w - 1`` (``x * (1 + w)``), q/k norms per head,
- sandwich norms (attention and MLP outputs normalised before the residual add),
- embeddings scaled by ``sqrt(hidden_size)``, GELU (tanh) in the MLP,
- ``query_pre_attn_scalar ** -0.5`` as the attention scale,
- local layers with a sliding window and their own rope base (``rope_local_base_freq``), one
  global layer in six (``layer_types``), Gemma 2's final-logit soft cap when set.
Source: Gemma 3 technical report (2025) and transformers' ``Gemma3ForCausalLM``."""

from __future__ import annotations

from typing import Any

from . import llama
from .spec import LayerSpec, ModelSpec, layer_rope_params, rope_from_params


def spec_from_config(config: Any) -> ModelSpec:
    hd = llama.head_dim_of(config)
    types = list(getattr(config, "layer_types", None) or [])
    if not types:
        pattern = getattr(config, "sliding_window_pattern", 6)
        types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(config.num_hidden_layers)
        ]
    layers = []
    for t in types:
        params = layer_rope_params(config, t)
        if t == "sliding_attention" and not isinstance(getattr(config, "rope_parameters", None), dict):
            # transformers 4.x keeps the local base in its own field
            rope = rope_from_params(config, {"rope_type": "default", "rope_theta": config.rope_local_base_freq}, hd, t)
        else:
            rope = rope_from_params(config, params, hd, t)
        layers.append(LayerSpec(rope=rope, window=config.sliding_window if t == "sliding_attention" else None))
    return llama.spec_from_config(
        config,
        family="gemma3",
        activation=getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh",
        layers=tuple(layers),
        query_scale=float(config.query_pre_attn_scalar) ** -0.5,
        norm_offset=1.0,
        qk_norm=True,
        sandwich_norms=True,
        embed_scale=float(config.hidden_size) ** 0.5,
        # Gemma 3 replaced Gemma 2's attention soft-capping with QK-norm (tech report, §2);
        # transformers ignores ``attn_logit_softcapping`` for Gemma 3, and so do we.
        attn_softcap=None,
        final_softcap=getattr(config, "final_logit_softcapping", None),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
    )
