"""The decoder-only transformer every family runs: weights + a :class:`ModelSpec`, forward over
a :class:`PassLayout`, and the LM head only at the rows that are read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layout import PassLayout
from . import blocks
from .attention import KV
from .backend import Backend, QuantizedWeight
from .spec import ModelSpec

#: Read rows per LM-head chunk: bounds the ``[rows, vocab]`` logits held at once.
HEAD_CHUNK = 256
#: Rows of a pass whose token-wise ops (norms, projections, MLP) run together on the CPU. A whole
#: 16k-token pass makes ``[rows, intermediate]`` temporaries of ~100 MB; glibc maps each one
#: fresh and every page faults on first touch, which cost a quarter of the pass (engine_bench:
#: 52% of the matmul peak with whole passes, 69% with 1-2k-row ones). Every op here computes each
#: row on its own (GEMM rows padded to >= 16, see blocks.linear), so chunking changes no bit.
CPU_ROW_CHUNK = 1024

Weight = torch.Tensor | QuantizedWeight


@dataclass
class LayerWeights:
    """One layer's tensors (transformers names in comments). ``qkv [(Hq+2Hkv)*D, hidden]``
    stacks q_proj/k_proj/v_proj; ``gate_up [2I, hidden]`` stacks gate_proj/up_proj."""

    input_norm: torch.Tensor  # input_layernorm
    qkv: Weight
    qkv_bias: torch.Tensor | None
    o: Weight  # o_proj
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_attn_norm: torch.Tensor | None  # Gemma: post_attention_layernorm (sandwich)
    mlp_norm: torch.Tensor  # Llama: post_attention_layernorm; Gemma: pre_feedforward_layernorm
    post_mlp_norm: torch.Tensor | None  # Gemma: post_feedforward_layernorm
    gate_up: Weight
    down: Weight


#: Per layer, a cached run of keys/values: ``(k, v)`` each ``[n, Hkv, D]``.
LayerKV = list[KV]


class Decoder:
    """A decoder-only LM for scoring.

    Args:
        spec: what to compute. embed: ``[vocab, hidden]``. layers: per-layer weights.
        final_norm: ``[hidden]``. lm_head: ``[vocab, hidden]`` (the embedding when tied).
        backend: the kernels that run the pass (:class:`~spinf_stream.models.backend.Backend`;
            default torch).
    """

    def __init__(
        self, spec: ModelSpec, embed: torch.Tensor, layers: list[LayerWeights], final_norm: torch.Tensor,
        lm_head: torch.Tensor, backend: Backend | None = None,
    ) -> None:
        self.spec = spec
        self.embed = embed
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.backend = backend or Backend("torch")

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding's)."""
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, w, self.spec.norm_eps, self.spec.norm_offset)

    @torch.inference_mode()
    def forward(
        self, layout: PassLayout, prefix: LayerKV | None = None, carried: list[LayerKV] | tuple[()] = (),
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Run one packed pass.

        Args:
            layout: tokens, logical positions, attention plan, read rows.
            prefix: per layer the preamble's keys/values ``[P, Hkv, D]`` (from a preamble pass).
            carried: per carried content of the pass (``layout.carried_lens`` order), per layer its
                keys/values ``[L, Hkv, D]``, as returned by the pass that computed it.
        Returns:
            ``hidden [R, hidden]`` at ``layout.read_rows`` after the final norm, and for every
            message plan with ``keep_kv`` (in order) its content's per-layer keys/values.
        """
        s = self.spec
        dev = self.device
        ids = layout.input_ids.to(dev)
        pos = layout.positions.to(dev)
        attend = self.backend.attention(layout, dev, s.num_heads // s.num_kv_heads)
        keep = [(m.content_start, m.content_len) for m in layout.messages if m.keep_kv and m.content_start is not None]
        kept: list[LayerKV] = [[] for _ in keep]
        x = self.embed[ids]
        if s.embed_scale is not None:
            x = x * torch.tensor(s.embed_scale, dtype=x.dtype, device=dev)
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        n_rows = x.shape[0]
        chunk = CPU_ROW_CHUNK if dev.type == "cpu" and self.backend.name == "torch" else max(n_rows, 1)
        row_chunks = [slice(r0, min(r0 + chunk, n_rows)) for r0 in range(0, n_rows, chunk)]
        tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rope tables, once per pass
        # q, k, v of every row, written chunk by chunk; one buffer for all layers (the kept
        # content keys/values are copies)
        qkv = x.new_empty(n_rows, hq + 2 * hkv, d)
        q, k, v = qkv.split([hq, hkv, hkv], dim=1)
        scratch = blocks.Scratch() if self.backend.name == "torch" else None
        for li, (lw, ls) in enumerate(zip(self.layers, s.layers)):
            rope = tables.get(id(ls.rope))
            if rope is None:
                rope = tables[id(ls.rope)] = blocks.rotary_tables(pos, ls.rope.inv_freq, ls.rope.scaling, x.dtype)
            for r in row_chunks:
                self._qkv(x[r], lw, rope[0][r], rope[1][r], qkv[r])
            for j, (c0, n) in enumerate(keep):
                kept[j].append((k[c0 : c0 + n].clone(), v[c0 : c0 + n].clone()))
            a = attend(
                q, k, v, prefix[li] if prefix else None, [c[li] for c in carried],
                scale=s.query_scale, window=ls.window, softcap=s.attn_softcap,
            )
            a = a.reshape(-1, hq * d)
            for r in row_chunks:  # in place: a chunk reads only its own rows
                x[r] = self._attn_out_and_mlp(x[r], a[r], lw, scratch)
        read = x[layout.read_rows.to(dev)]
        return self._norm(read, self.final_norm), kept

    def _qkv(self, x: torch.Tensor, lw: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
        """Rows ``x [n, hidden]`` → ``out [n, Hq+2Hkv, D]``: q and k normed (Qwen3, Gemma 3) and
        rotated, v as projected."""
        s = self.spec
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        qkv = self.backend.linear(self._norm(x, lw.input_norm), lw.qkv, lw.qkv_bias)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q = q.reshape(-1, hq, d)
        k = k.reshape(-1, hkv, d)
        if s.qk_norm:
            q = self._norm(q, lw.q_norm)
            k = self._norm(k, lw.k_norm)
        out[:, :hq] = blocks.rotary(q, cos, sin)
        out[:, hq : hq + hkv] = blocks.rotary(k, cos, sin)
        out[:, hq + hkv :] = v.reshape(-1, hkv, d)

    def _attn_out_and_mlp(
        self, x: torch.Tensor, a: torch.Tensor, lw: LayerWeights, scratch: blocks.Scratch | None = None,
    ) -> torch.Tensor:
        """Rows ``x [n, hidden]`` after the attention output ``a [n, Hq*D]`` and the MLP, with
        their residuals (and Gemma's sandwich norms); ``scratch``: reused MLP temporaries."""
        o = self.backend.linear(a, lw.o)
        if self.spec.sandwich_norms:
            o = self._norm(o, lw.post_attn_norm)
        x = x + o
        h = blocks.gated_mlp(
            self._norm(x, lw.mlp_norm), lw.gate_up, lw.down, self.spec.activation, self.backend.linear, scratch,
        )
        if self.spec.sandwich_norms:
            h = self._norm(h, lw.post_mlp_norm)
        return x + h

    @torch.inference_mode()
    def token_logprobs(self, hidden: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary log-probabilities of chosen next tokens.

        Args:
            hidden: ``[R, hidden]`` final-normed states of the read rows.
            rows: ``[N]`` int64 indices into ``hidden``; tokens: ``[N]`` int64 token ids.
        Returns:
            ``[N]`` fp32 on the CPU: ``logits[rows, tokens] - logsumexp(logits[rows])`` with
            ``logits = softcap(lm_head(hidden))`` (natural log).
        """
        out = torch.empty(rows.shape[0], dtype=torch.float32)
        for c0 in range(0, hidden.shape[0], HEAD_CHUNK):
            c1 = min(c0 + HEAD_CHUNK, hidden.shape[0])
            sel = (rows >= c0) & (rows < c1)
            if not bool(sel.any()):
                continue
            logits = self.backend.linear(hidden[c0:c1], self.lm_head).float()
            if self.spec.final_softcap is not None:
                logits = torch.tanh(logits / self.spec.final_softcap) * self.spec.final_softcap
            lse = self.backend.logsumexp(logits)
            r = (rows[sel] - c0).to(logits.device)
            out[sel] = (logits[r, tokens[sel].to(logits.device)] - lse[r]).cpu()
        return out
