"""The decoder-only transformer every family runs.

Weights + a :class:`ModelSpec`, forward over
a :class:`PassLayout`, and the LM head only at the rows that are read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spinf_stream.engine.layout import PassLayout
from . import blocks
from .attention import KV
from .ops import Activation, Backend, Weight, weight_rows
from .spec import ModelSpec
from .torch_backend import TorchBackend
from .vision import ImageReader


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
        backend: the kernels that run the pass (:class:`~spinf_stream.models.ops.Backend`;
            default :class:`~spinf_stream.models.torch_backend.TorchBackend`).
        vision: a multimodal checkpoint's image reader (:class:`~spinf_stream.models.vision.ImageReader`),
            or ``None``.
    """

    def __init__(
        self, spec: ModelSpec, embed: torch.Tensor, layers: list[LayerWeights], final_norm: torch.Tensor,
        lm_head: torch.Tensor, backend: Backend | None = None, vision: ImageReader | None = None,
    ) -> None:
        self.vision = vision
        self.spec = spec
        self.embed = embed
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.backend = backend or TorchBackend()

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding's)."""
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, w, self.spec.norm_eps, self.spec.norm_offset)

    def _norm_into(self, x: torch.Tensor, w: torch.Tensor, into: Weight) -> Activation:
        """The norm of ``x`` as the linear layer ``into`` takes it (see :meth:`Backend.norm_into`)."""
        return self.backend.norm_into(x, w, self.spec.norm_eps, self.spec.norm_offset, into)

    @torch.inference_mode()
    def forward(
        self, layout: PassLayout, prefix: LayerKV | None = None, carried: Sequence[Sequence[KV]] = (),
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Run one packed pass.

        The token-wise ops run over the back end's row chunks (:meth:`Backend.row_chunks`; on the
        CPU fixed-size chunks, the last one padded with token 0 at position 0, whose rows are
        computed and never read), each chunk one unit of :meth:`Backend.map`.

        Args:
            layout: tokens, logical positions, attention plan, read rows.
            prefix: per layer the preamble's keys/values ``[P, Hkv, D]`` (from a preamble pass).
            carried: per carried content of the pass (``layout.carried_lens`` order), per layer its
                keys/values ``[L, Hkv, D]``, as returned by the pass that computed it (indexed
                by layer; a sequence read one layer at a time).
        Returns:
            ``hidden [R, hidden]`` at ``layout.read_rows`` after the final norm, and the kept
            per-layer keys/values: for every message plan with ``keep_kv`` (in order) its
            content's, then those of each of ``layout.kept_rows``.
        """
        s = self.spec
        b = self.backend
        dev = self.device
        n_rows = layout.n_tokens
        chunks = b.row_chunks(n_rows, layout.decode)
        n_pad = chunks[-1].stop if chunks else 0
        ids = torch.zeros(n_pad, dtype=torch.int64)
        ids[:n_rows] = layout.input_ids
        pictures = self._soft_tokens(layout)
        for row, soft in pictures:  # the placeholder's id may lie past the vocabulary: read token 0
            ids[row : row + soft.shape[0]] = 0
        pos = torch.zeros(n_pad, dtype=torch.int64)
        pos[:n_rows] = layout.positions
        ids, pos = ids.to(dev), pos.to(dev)
        attend = b.attention(layout, dev, s.num_heads // s.num_kv_heads)
        keep = [(m.content_start, m.content_len) for m in layout.messages if m.keep_kv and m.content_start is not None]
        keep += layout.kept_rows
        kept: list[LayerKV] = [[] for _ in keep]
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        x = self.embed[ids]  # [n_pad, hidden]: a gather, exact
        scale = None if s.embed_scale is None else torch.tensor(s.embed_scale, dtype=x.dtype, device=dev)
        # rope tables (cos, sin [n_pad, 1, D]) once per pass and rope, shared by the layers
        ropes = list({id(ls.rope): ls.rope for ls in s.layers}.items())
        tables = {key: (x.new_empty(n_pad, 1, d), x.new_empty(n_pad, 1, d)) for key, _ in ropes}

        def embed_rows(r: slice, _: blocks.Scratch | None) -> None:
            if scale is not None:
                x[r] *= scale
            for key, rope in ropes:
                cos, sin = blocks.rotary_tables(pos[r], rope.inv_freq, rope.scaling, x.dtype)
                tables[key][0][r], tables[key][1][r] = cos, sin

        b.map(embed_rows, chunks)
        for row, soft in pictures:  # after the embedding scale: the soft tokens are not scaled
            x[row : row + soft.shape[0]] = soft.to(device=dev, dtype=x.dtype)
        # q, k, v of every row, written chunk by chunk; one buffer for all layers (the kept
        # content keys/values are copies)
        qkv = x.new_empty(n_pad, hq + 2 * hkv, d)
        q, k, v = qkv.split([hq, hkv, hkv], dim=1)
        tiled = b.tile_units(len(chunks))
        for li, (lw, ls) in enumerate(zip(self.layers, s.layers)):
            cos, sin = tables[id(ls.rope)]
            if tiled:
                self._attention_in_tiled(x, lw, cos, sin, qkv, chunks)
            else:
                b.map(lambda r, sc: self._attention_in(x[r], lw, cos[r], sin[r], qkv[r], sc), chunks)
            for j, (c0, n) in enumerate(keep):
                kept[j].append((k[c0 : c0 + n].clone(), v[c0 : c0 + n].clone()))
            a = attend(
                q, k, v, prefix[li] if prefix else None, [c[li] for c in carried],
                scale=s.query_scale, window=ls.window, softcap=s.attn_softcap,
            )
            a = a.reshape(-1, hq * d)
            if tiled:
                self._attention_out_and_mlp_tiled(x, a, lw, chunks)
            else:
                b.map(lambda r, sc: self._attention_out_and_mlp(x[r], a[r], lw, sc), chunks)
        n_read = layout.read_rows.shape[0]
        read_chunks = b.row_chunks(n_read)
        read = x.new_zeros(read_chunks[-1].stop if read_chunks else 0, x.shape[1])
        read[:n_read] = x[layout.read_rows.to(dev)]
        b.map(lambda r, _: read.__setitem__(r, self._norm(read[r], self.final_norm)), read_chunks)
        return read[:n_read], kept

    def _soft_tokens(self, layout: PassLayout) -> list[tuple[int, torch.Tensor]]:
        """``(row, [n, hidden] fp32)`` of each picture the pass feeds, each read alone on one of
        the back end's workers (one image per call: its bits are its own).

        Raises:
            ValueError: pictures for a model without an image reader.
        """
        if not layout.images:
            return []
        if self.vision is None:
            raise ValueError("the pass holds pictures; this model has no image reader")
        reader = self.vision
        soft = self.backend.map(lambda item, _: reader.soft_tokens(item[1].image), list(layout.images))
        return [(row, t) for (row, _), t in zip(layout.images, soft)]

    # -- token-wise ops -------------------------------------------------------------------
    #
    # Every linear layer is computed in the back end's column tiles (``Backend.column_tiles``),
    # each tile ``[rows, K] @ [K, tile]`` into its own buffer. A layer's rows run either as one
    # unit per row chunk (all of its tiles, one after the other) or, when a pass has too few row
    # chunks to keep the workers busy, as one unit per (row chunk, tile) between barriers
    # (``*_tiled``). Both run the same ops on the same shapes for every row: the same bits.

    def _tile(self, h: torch.Tensor, w: Weight, bias: torch.Tensor | None, t: slice, dst: torch.Tensor,
              scratch: blocks.Scratch | None) -> None:
        """``dst[:, t] = h @ w[t].T + bias[t]``: ``h [n, K]``, ``w [N, K]``, ``dst [n, N]``."""
        buf = None if scratch is None else scratch.get("tile", (h.shape[0], t.stop - t.start), h)
        dst[:, t] = self.backend.linear(h, weight_rows(w, t), None if bias is None else bias[t], out=buf)

    def _project(self, h: Activation, w: Weight, bias: torch.Tensor | None, dst: torch.Tensor,
                 scratch: blocks.Scratch | None) -> torch.Tensor:
        """``h @ w.T + bias`` tile by tile into ``dst [n, N]`` (returned; with a single tile the
        GEMM writes there itself)."""
        tiles = self.backend.column_tiles(w.shape[0])
        if len(tiles) == 1:
            return self.backend.linear(h, w, bias, out=dst)
        for t in tiles:
            self._tile(h, w, bias, t, dst, scratch)
        return dst

    def _gate_up_tile(self, h: torch.Tensor, lw: LayerWeights, t: slice, dst: torch.Tensor,
                      scratch: blocks.Scratch | None) -> None:
        """``dst[:, t] = act(h @ gate[t].T) * (h @ up[t].T)`` (Shazeer 2020, GLU variants)."""
        n, width, inter = h.shape[0], t.stop - t.start, lw.gate_up.shape[0] // 2
        gate = None if scratch is None else scratch.get("mlp.gate", (n, width), h)
        up = None if scratch is None else scratch.get("mlp.up", (n, width), h)
        gate = self.backend.linear(h, weight_rows(lw.gate_up, t), out=gate)
        up = self.backend.linear(h, weight_rows(lw.gate_up, slice(inter + t.start, inter + t.stop)), out=up)
        act = None if scratch is None else scratch.get("mlp.act", (n, width), h)
        dst[:, t] = blocks.activation(gate, self.spec.activation, out=act).mul_(up)

    def _new(self, scratch: blocks.Scratch | None, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return like.new_empty(shape) if scratch is None else scratch.get(name, shape, like)

    def _qkv_out(self, proj: torch.Tensor, lw: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
        """Projected rows ``proj [n, (Hq+2Hkv)*D]`` → ``out [n, Hq+2Hkv, D]``: q and k normed
        (Qwen3, Gemma 3) and rotated, v as projected."""
        s = self.spec
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        q, k, v = proj.split([hq * d, hkv * d, hkv * d], dim=-1)
        q = q.reshape(-1, hq, d)
        k = k.reshape(-1, hkv, d)
        if s.qk_norm:
            q = self._norm(q, lw.q_norm)
            k = self._norm(k, lw.k_norm)
        out[:, :hq] = blocks.rotary(q, cos, sin)
        out[:, hq : hq + hkv] = blocks.rotary(k, cos, sin)
        out[:, hq + hkv :] = v.reshape(-1, hkv, d)

    def _residual_attention(self, x: torch.Tensor, o: torch.Tensor, lw: LayerWeights) -> Activation:
        """``x += o`` (Gemma: its post-attention norm first) in place; returns the MLP's input."""
        x += self._norm(o, lw.post_attn_norm) if self.spec.sandwich_norms else o
        return self._norm_into(x, lw.mlp_norm, lw.gate_up)

    def _residual_mlp(self, x: torch.Tensor, down: torch.Tensor, lw: LayerWeights) -> None:
        x += self._norm(down, lw.post_mlp_norm) if self.spec.sandwich_norms else down

    def _attention_in(self, x: torch.Tensor, lw: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor,
                      scratch: blocks.Scratch | None) -> None:
        """Rows ``x [n, hidden]`` → ``out [n, Hq+2Hkv, D]`` (see :meth:`_qkv_out`)."""
        proj = self._new(scratch, "qkv", (x.shape[0], lw.qkv.shape[0]), x)
        self._qkv_out(self._project(self._norm_into(x, lw.input_norm, lw.qkv), lw.qkv, lw.qkv_bias, proj, scratch),
                      lw, cos, sin, out)

    def _attention_out_and_mlp(self, x: torch.Tensor, a: torch.Tensor, lw: LayerWeights,
                               scratch: blocks.Scratch | None) -> None:
        """Rows ``x [n, hidden]``, in place: the attention output ``a [n, Hq*D]`` projected and
        added, then the gated MLP added (with Gemma's sandwich norms)."""
        if self.backend.fused_epilogues:
            self._attention_out_and_mlp_fused(x, a, lw)
            return
        n, hidden, inter = x.shape[0], x.shape[1], lw.gate_up.shape[0] // 2
        o = self._project(a, lw.o, None, self._new(scratch, "o", (n, hidden), x), scratch)
        h = self._residual_attention(x, o, lw)
        m = self._new(scratch, "mlp", (n, inter), x)
        for t in self.backend.column_tiles(inter):
            self._gate_up_tile(h, lw, t, m, scratch)
        self._residual_mlp(x, self._project(m, lw.down, None, self._new(scratch, "down", (n, hidden), x), scratch), lw)

    def _attention_out_and_mlp_fused(self, x: torch.Tensor, a: torch.Tensor, lw: LayerWeights) -> None:
        """:meth:`_attention_out_and_mlp` with the back end's fused epilogues: each residual add
        in the op that produces it (the o and down GEMMs; Gemma's post-norms), the activation in
        the gate/up GEMM, the MLP's input written as its GEMM takes it."""
        b, s = self.backend, self.spec
        if s.sandwich_norms:
            b.add_norm(x, b.linear(a, lw.o), lw.post_attn_norm, s.norm_eps, s.norm_offset)
        else:
            b.add_linear(x, a, lw.o)
        m = b.gated_linear(self._norm_into(x, lw.mlp_norm, lw.gate_up), lw.gate_up, s.activation)
        if s.sandwich_norms:
            b.add_norm(x, b.linear(m, lw.down), lw.post_mlp_norm, s.norm_eps, s.norm_offset)
        else:
            b.add_linear(x, m, lw.down)

    def _attention_in_tiled(self, x: torch.Tensor, lw: LayerWeights, cos: torch.Tensor, sin: torch.Tensor,
                            qkv: torch.Tensor, chunks: list[slice]) -> None:
        """:meth:`_attention_in` over the pass, one unit per (row chunk, column tile)."""
        b = self.backend
        h = b.map(lambda r, _: self._norm(x[r], lw.input_norm), chunks)
        proj = x.new_empty(x.shape[0], lw.qkv.shape[0])
        units = [(i, t) for i in range(len(chunks)) for t in b.column_tiles(lw.qkv.shape[0])]
        b.map(lambda u, sc: self._tile(h[u[0]], lw.qkv, lw.qkv_bias, u[1], proj[chunks[u[0]]], sc), units)
        b.map(lambda r, _: self._qkv_out(proj[r], lw, cos[r], sin[r], qkv[r]), chunks)

    def _attention_out_and_mlp_tiled(self, x: torch.Tensor, a: torch.Tensor, lw: LayerWeights,
                                     chunks: list[slice]) -> None:
        """:meth:`_attention_out_and_mlp` over the pass, one unit per (row chunk, column tile)."""
        b = self.backend
        n, hidden, inter = x.shape[0], x.shape[1], lw.gate_up.shape[0] // 2
        idx = range(len(chunks))
        o, m, down = x.new_empty(n, hidden), x.new_empty(n, inter), x.new_empty(n, hidden)
        b.map(lambda u, sc: self._tile(a[chunks[u[0]]], lw.o, None, u[1], o[chunks[u[0]]], sc),
              [(i, t) for i in idx for t in b.column_tiles(hidden)])
        h = b.map(lambda r, _: self._residual_attention(x[r], o[r], lw), chunks)
        b.map(lambda u, sc: self._gate_up_tile(h[u[0]], lw, u[1], m[chunks[u[0]]], sc),
              [(i, t) for i in idx for t in b.column_tiles(inter)])
        b.map(lambda u, sc: self._tile(m[chunks[u[0]]], lw.down, None, u[1], down[chunks[u[0]]], sc),
              [(i, t) for i in idx for t in b.column_tiles(hidden)])
        b.map(lambda r, _: self._residual_mlp(x[r], down[r], lw), chunks)

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
        return self.backend.token_logprobs(hidden, self.lm_head, self.spec.final_softcap, rows, tokens)

    @torch.inference_mode()
    def read_logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-vocabulary logits ``[N, V]`` and their logsumexp ``[N]`` (fp32, CPU) at
        ``hidden[rows]`` (``rows [N]`` int64): ``logits - lse`` are the log-probabilities
        :meth:`token_logprobs` reads, bit for bit."""
        return self.backend.read_logits(hidden, self.lm_head, self.spec.final_softcap, rows)
