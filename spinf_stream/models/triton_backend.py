"""The Triton back ends (and the cuBLAS variant for measuring).

The batch-invariant kernels of ``spinf_stream/kernels/``, and the same with cuBLAS
GEMMs for measuring what invariance costs.

- :class:`TritonBackend` (CUDA, always): the Triton kernels for every GEMM, RMSNorm, the packed
  tree attention (one launch per layer for the whole pass) and the LM head's log-sum-exp. On CPU
  tensors the same kernels run under Triton's interpreter when the environment sets
  ``SPINF_KERNELS=triton`` (and ``TRITON_INTERPRET=1`` before Triton is first imported): that is
  how CI runs the GPU code path without a GPU.
- :class:`CublasBackend`: the Triton back end with the library GEMM (cuBLAS) instead of ours —
  NOT batch-invariant; only for measuring (``bench/gpu_check.py --non-invariant``).
"""

from __future__ import annotations

from collections.abc import Iterator

import os

import torch
import torch.nn.functional as F

from spinf_stream.engine.layout import PassLayout
from .attention import KV, carried_pieces
from .libraries import cpu_isa, installed_version
from .ops import (
    HEAD_GROUP, Activation, Backend, Numerics, PassAttention, QuantizedRows, QuantizedWeight, Weight, apply_softcap,
)


def interpreter_on() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to interpret kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "on", "yes"}


class TritonBackend(Backend):
    """The Triton kernels of ``spinf_stream/kernels/`` (CUDA; CPU tensors under the interpreter)."""

    name = "triton"
    invariant_by_construction = True
    fused_epilogues = True

    @classmethod
    def check(cls, device: torch.device, dtype: torch.dtype | str | None) -> None:
        """On the CPU: refuses to run without ``TRITON_INTERPRET=1``, or in a dtype other than
        float32 (the interpreter computes a bfloat16 ``tl.dot`` on the raw 16-bit integers: its
        scores would be garbage)."""
        if device.type != "cuda" and not interpreter_on():
            raise ValueError(
                "SPINF_KERNELS=triton on the CPU runs the kernels in Triton's interpreter: also set "
                "TRITON_INTERPRET=1 (before anything imports triton)"
            )
        if device.type != "cuda" and dtype not in (None, "float32", torch.float32):
            raise ValueError(
                f"SPINF_KERNELS=triton on the CPU runs in float32 only (Triton's interpreter computes a {dtype} "
                "matmul wrong); use --dtype float32, or unset SPINF_KERNELS"
            )

    @classmethod
    def numerics(cls, device: torch.device, dtype: torch.dtype) -> Numerics:
        from spinf_stream.kernels._triton import FP_FUSION
        from spinf_stream.kernels.logsumexp import BLOCK_V
        from spinf_stream.kernels.matmul import tile_config, tuned_tiles
        from spinf_stream.kernels.tree_attention import keys_per_step

        narrow, wide = tile_config(device, dtype, 1), tile_config(device, dtype, 1 << 20)
        gemm = f"gemm {narrow.block_m}x{narrow.block_n}x{narrow.block_k}"
        if wide != narrow:
            from spinf_stream.kernels.matmul import INTERPRETER_BLOCK_N

            gemm += f" ({wide.block_m}x{wide.block_n}x{wide.block_k} for N >= {4 * INTERPRETER_BLOCK_N})"
        measured = tuned_tiles(device, dtype)
        if measured:
            gemm += f", {measured}"
        keys = "/".join(str(keys_per_step(device, d)) for d in (64, 128, 256))
        tiles = f"{gemm}, attention keys {keys} at head dim 64/128/256, lse {BLOCK_V}"
        bits_probe = "not_needed" if cls.invariant_by_construction else "not_run"
        triton = installed_version("triton")
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            fusion = "on" if FP_FUSION else "off"
            return Numerics(isa=f"sm_{major}{minor}", library=f"triton {triton} (FMA contraction {fusion}), torch {torch.__version__}",
                            tiles=tiles, bits_probe=bits_probe)
        return Numerics(isa=cpu_isa(), library=f"triton {triton} (interpreter), torch {torch.__version__}",
                        tiles=tiles, bits_probe=bits_probe)

    def linear(
        self, x: Activation, weight: Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        y = self._linear(x, weight)
        return y if bias is None else y + bias

    def _linear(self, x: Activation, weight: Weight, add_to: torch.Tensor | None = None) -> torch.Tensor:
        from spinf_stream.kernels import matmul_fp8_triton, matmul_int8_triton, matmul_triton

        if isinstance(x, QuantizedRows):  # normed and quantized for this float8 layer
            return matmul_fp8_triton((x.data, x.scale), weight.data, weight.scale, out_dtype=x.dtype, add_to=add_to)
        if isinstance(weight, QuantizedWeight):
            if weight.data.dtype == torch.int8:
                return matmul_int8_triton(x, weight.data, weight.scale, add_to=add_to)
            return matmul_fp8_triton(x, weight.data, weight.scale, add_to=add_to)
        if add_to is not None:
            return matmul_triton(x.contiguous(), weight, add_to=add_to)
        return self._matmul(x, weight)

    def add_linear(self, residual: torch.Tensor, x: Activation, weight: Weight) -> None:
        self._linear(x, weight, add_to=residual)

    def add_norm(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> None:
        from spinf_stream.kernels import rms_norm_add_triton

        rms_norm_add_triton(x, weight, eps, offset, residual)

    def norm_into(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, into: Weight) -> Activation:
        """For a float8 layer, the norm writes its rows quantized (one kernel, no bf16 round trip)."""
        if isinstance(into, QuantizedWeight) and into.data.dtype == torch.float8_e4m3fn:
            from spinf_stream.kernels import rms_norm_fp8_triton

            x8, sx = rms_norm_fp8_triton(x, weight, eps, offset)
            return QuantizedRows(x8, sx, x.dtype)
        return self.rms_norm(x, weight, eps, offset)

    def gated_linear(self, x: Activation, weight: Weight, activation: str) -> torch.Tensor:
        from spinf_stream.kernels import gated_matmul_fp8_triton, gated_matmul_int8_triton, gated_matmul_triton

        if isinstance(x, QuantizedRows):
            return gated_matmul_fp8_triton((x.data, x.scale), weight.data, weight.scale, activation, out_dtype=x.dtype)
        if isinstance(weight, QuantizedWeight):
            if weight.data.dtype == torch.int8:
                return gated_matmul_int8_triton(x, weight.data, weight.scale, activation)
            return gated_matmul_fp8_triton(x, weight.data, weight.scale, activation)
        return gated_matmul_triton(x.contiguous(), weight, activation)

    def _matmul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        from spinf_stream.kernels import matmul_triton

        return matmul_triton(x.contiguous(), weight)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        from spinf_stream.kernels import rms_norm_triton

        shape = x.shape
        return rms_norm_triton(x.reshape(-1, shape[-1]), weight, eps, offset).view(shape)

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        return TritonAttention(layout, device, group)

    def token_logprobs(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor, tokens: torch.Tensor,
    ) -> torch.Tensor:
        out = torch.empty(rows.shape[0], dtype=torch.float32)
        for sel, r, logits, lse in self._head_groups(hidden, lm_head, softcap, rows):
            out[sel] = (logits[r, tokens[sel].to(logits.device)] - lse[r]).cpu()
        return out

    def read_logits(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits_out = torch.empty(rows.shape[0], lm_head.shape[0], dtype=torch.float32)
        lse_out = torch.empty(rows.shape[0], dtype=torch.float32)
        for sel, r, logits, lse in self._head_groups(hidden, lm_head, softcap, rows):
            logits_out[sel], lse_out[sel] = logits[r].cpu(), lse[r].cpu()
        return logits_out, lse_out

    def _head_groups(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per group of HEAD_GROUP hidden rows that ``rows`` reads: ``(sel [N] bool, local rows
        on the device, logits [g, V] fp32, lse [g])``."""
        from spinf_stream.kernels import logsumexp_triton

        for c0 in range(0, hidden.shape[0], HEAD_GROUP):
            c1 = min(c0 + HEAD_GROUP, hidden.shape[0])
            sel = (rows >= c0) & (rows < c1)
            if not bool(sel.any()):
                continue
            logits = apply_softcap(self.linear(hidden[c0:c1], lm_head).float(), softcap)
            yield sel, (rows[sel] - c0).to(logits.device), logits, logsumexp_triton(logits)


class CublasBackend(TritonBackend):
    """:class:`TritonBackend` with cuBLAS GEMMs (not batch-invariant; for measuring only)."""

    name = "cublas"
    invariant_by_construction = False
    fused_epilogues = False  # cuBLAS GEMMs, the activation and adds in torch (the measured baseline)

    @classmethod
    def check(cls, device: torch.device, dtype: torch.dtype | str | None) -> None:
        if device.type != "cuda":
            raise ValueError("the cublas back end needs a CUDA device")

    def _matmul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


class TritonAttention:
    """One ``spinf_stream.kernels.tree_attention_triton`` launch per layer over the whole pass.

    The pass's segments become per-row key ranges (``kernels.TreeMask``) once, on the host, and
    are copied to the device once; per layer the keys are ``[preamble | carried | pass rows]``.
    """

    def __init__(self, layout: PassLayout, device: torch.device, group: int) -> None:
        from spinf_stream.kernels import TreeMask, rows_per_block

        q0 = layout.query_start
        self.preamble_len = layout.preamble_len
        self.mask = TreeMask.from_segments(
            layout.segments, range(q0, q0 + layout.n_tokens), block_rows=rows_per_block(group), blocks=layout.blocks,
        ).to(device)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
        *, scale: float, window: int | None, softcap: float | None,
    ) -> torch.Tensor:
        from spinf_stream.kernels import tree_attention_triton

        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        if self.preamble_len:
            assert prefix is not None, "the pass attends to a preamble that was not passed"
            keys.append(prefix[0][: self.preamble_len])
            values.append(prefix[1][: self.preamble_len])
        for c in carried:
            for ck, cv in carried_pieces(c):
                keys.append(ck)
                values.append(cv)
        if keys:
            k = torch.cat([*keys, k])
            v = torch.cat([*values, v])
        return tree_attention_triton(q, k, v, self.mask, scale=scale, window=window, softcap=softcap)
