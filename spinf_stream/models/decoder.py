"""The decoder-only transformer every family runs: weights + a :class:`ModelSpec`, forward over
a :class:`PassLayout`, and the LM head only at the rows that are read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layout import PassLayout
from . import blocks
from .spec import ModelSpec

#: Read rows per LM-head chunk: bounds the ``[rows, vocab]`` logits held at once.
HEAD_CHUNK = 256


@dataclass
class LayerWeights:
    """One layer's tensors (transformers names in comments). ``qkv [(Hq+2Hkv)*D, hidden]``
    stacks q_proj/k_proj/v_proj; ``gate_up [2I, hidden]`` stacks gate_proj/up_proj."""

    input_norm: torch.Tensor  # input_layernorm
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # o_proj
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_attn_norm: torch.Tensor | None  # Gemma: post_attention_layernorm (sandwich)
    mlp_norm: torch.Tensor  # Llama: post_attention_layernorm; Gemma: pre_feedforward_layernorm
    post_mlp_norm: torch.Tensor | None  # Gemma: post_feedforward_layernorm
    gate_up: torch.Tensor
    down: torch.Tensor


PrefixKV = list[tuple[torch.Tensor, torch.Tensor]]


class Decoder:
    """A decoder-only LM for scoring.

    Args:
        spec: what to compute. embed: ``[vocab, hidden]``. layers: per-layer weights.
        final_norm: ``[hidden]``. lm_head: ``[vocab, hidden]`` (the embedding when tied).
    """

    def __init__(
        self, spec: ModelSpec, embed: torch.Tensor, layers: list[LayerWeights], final_norm: torch.Tensor,
        lm_head: torch.Tensor,
    ) -> None:
        self.spec = spec
        self.embed = embed
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return blocks.rms_norm(x, w, self.spec.norm_eps, self.spec.norm_offset)

    @torch.inference_mode()
    def forward(self, layout: PassLayout, prefix: PrefixKV | None = None, *, keep_kv: bool = False):
        """Run one packed pass.

        Args:
            layout: tokens, logical positions, attention structure, read rows.
            prefix: per layer the preamble's keys/values ``[P, Hkv, D]`` (from a ``keep_kv`` run).
            keep_kv: also return every layer's keys/values ``[T, Hkv, D]`` (for the preamble).
        Returns:
            ``(hidden [R, hidden] at layout.read_rows after the final norm, kv or None)``.
        """
        s = self.spec
        dev = self.device
        ids = layout.input_ids.to(dev)
        pos = layout.positions.to(dev)
        x = self.embed[ids]
        if s.embed_scale is not None:
            x = x * torch.tensor(s.embed_scale, dtype=x.dtype, device=dev)
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        kept: PrefixKV = []
        for li, (lw, ls) in enumerate(zip(self.layers, s.layers)):
            h = self._norm(x, lw.input_norm)
            qkv = blocks.linear(h, lw.qkv, lw.qkv_bias)
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            q = q.reshape(-1, hq, d)
            k = k.reshape(-1, hkv, d)
            v = v.reshape(-1, hkv, d)
            if s.qk_norm:
                q = self._norm(q, lw.q_norm)
                k = self._norm(k, lw.k_norm)
            q = blocks.rotary(q, pos, ls.rope.inv_freq, ls.rope.scaling)
            k = blocks.rotary(k, pos, ls.rope.inv_freq, ls.rope.scaling)
            if keep_kv:
                kept.append((k, v))
            a = blocks.tree_attention(
                q, k, v, layout, prefix[li] if prefix else None,
                scale=s.query_scale, window=ls.window, softcap=s.attn_softcap,
            )
            a = blocks.linear(a.reshape(-1, hq * d), lw.o)
            if s.sandwich_norms:
                a = self._norm(a, lw.post_attn_norm)
            x = x + a
            h = self._norm(x, lw.mlp_norm)
            h = blocks.gated_mlp(h, lw.gate_up, lw.down, s.activation)
            if s.sandwich_norms:
                h = self._norm(h, lw.post_mlp_norm)
            x = x + h
        read = x[layout.read_rows.to(dev)]
        return self._norm(read, self.final_norm), (kept if keep_kv else None)

    @torch.inference_mode()
    def token_logprobs(self, hidden: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary log-probabilities of chosen next tokens.

        Args:
            hidden: ``[R, hidden]`` final-normed states of the read rows.
            rows: ``[N]`` int64 indices into ``hidden``; tokens: ``[N]`` int64 token ids.
        Returns:
            ``[N]`` fp32: ``log_softmax(lm_head(hidden[rows]))[tokens]`` (natural log).
        """
        out = torch.empty(rows.shape[0], dtype=torch.float32)
        for c0 in range(0, hidden.shape[0], HEAD_CHUNK):
            c1 = min(c0 + HEAD_CHUNK, hidden.shape[0])
            sel = (rows >= c0) & (rows < c1)
            if not bool(sel.any()):
                continue
            logits = blocks.linear(hidden[c0:c1], self.lm_head).float()
            if self.spec.final_softcap is not None:
                logits = torch.tanh(logits / self.spec.final_softcap) * self.spec.final_softcap
            lp = torch.log_softmax(logits, dim=-1)
            out[sel] = lp[rows[sel] - c0, tokens[sel].to(lp.device)].cpu()
        return out
