"""What a decoder-only model is, as data.

The family files fill a :class:`ModelSpec` from a
checkpoint's ``config.json``; :mod:`spinf_stream.models.decoder` runs any spec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding of one layer: ``inv_freq`` ``[head_dim // 2]`` fp32 (radians per position)
    and the cos/sin ``scaling`` that some rope types apply (RoFormer, Su et al. 2021; the
    ``rope_type`` variants are transformers' ``ROPE_INIT_FUNCTIONS``)."""

    inv_freq: torch.Tensor
    scaling: float = 1.0


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its rotary embedding and sliding window (tokens; ``None`` = global).

    A key at logical position ``j`` is visible to a query at ``i`` iff ``i - window < j <= i``
    (transformers' ``sliding_window_overlay``)."""

    rope: RopeSpec
    window: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    """How one checkpoint computes, in the terms all families share.

    ``norm_offset`` is 1.0 where the RMSNorm scale is stored as ``w - 1`` (Gemma: ``x * (1 + w)``),
    0.0 elsewhere. ``sandwich_norms``: Gemma 2/3 also normalise the attention and MLP outputs
    before the residual add (``post_attention_layernorm``/``post_feedforward_layernorm``).
    ``query_scale`` multiplies ``q·k`` (``head_dim ** -0.5``, or Gemma's
    ``query_pre_attn_scalar ** -0.5``). Soft caps follow Gemma 2: ``cap * tanh(x / cap)``.
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    activation: str
    layers: tuple[LayerSpec, ...]
    max_positions: int
    query_scale: float
    norm_offset: float = 0.0
    qk_norm: bool = False
    qkv_bias: bool = False
    sandwich_norms: bool = False
    embed_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    tie_embeddings: bool = False


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """``1 / base ** (2i / dim)`` for ``i < dim / 2``: ``[dim // 2]`` fp32 (RoFormer, eq. 15)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rope_from_params(config: Any, params: dict[str, Any] | None, head_dim: int, layer_type: str | None) -> RopeSpec:
    """A :class:`RopeSpec` from transformers' ``rope_parameters`` (one layer type's dict).

    ``default`` is computed here; every other ``rope_type`` (linear, llama3, yarn, ...) is
    delegated to transformers' ``ROPE_INIT_FUNCTIONS`` so we match its numbers exactly.

    Raises:
        ValueError: no ``rope_theta`` and no known rope type.
    """
    params = dict(params or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", None))
        if base is None:
            raise ValueError("config has no rope_theta")
        return RopeSpec(default_inv_freq(float(base), head_dim), 1.0)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fn = ROPE_INIT_FUNCTIONS.get(rope_type)
    if fn is None:
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    try:
        inv_freq, scaling = fn(config, torch.device("cpu"), layer_type=layer_type)
    except TypeError:
        inv_freq, scaling = fn(config, torch.device("cpu"))
    return RopeSpec(inv_freq.float(), float(scaling))


def layer_rope_params(config: Any, layer_type: str | None) -> dict[str, Any] | None:
    """The rope parameters of one layer type, whichever shape the config stores them in
    (transformers 5: ``rope_parameters`` flat or keyed by layer type; 4.x: ``rope_theta`` +
    ``rope_scaling``)."""
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict) and layer_type is not None and layer_type in rp and isinstance(rp[layer_type], dict):
        return rp[layer_type]
    if isinstance(rp, dict) and ("rope_theta" in rp or "rope_type" in rp):
        return rp
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": getattr(config, "rope_theta", 10000.0)}
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params.update(scaling)
    return params
