"""Which kernels run a forward pass.

- ``torch`` (the CPU default): torch ops; GEMM rows stay batch-invariant by the shape rule of
  :mod:`spinf_stream.models.blocks` and :mod:`spinf_stream.models.attention`.
- ``triton`` (CUDA, always): the batch-invariant Triton kernels of ``kernels/`` for every GEMM,
  RMSNorm, the packed tree attention (one launch per layer for the whole pass) and the LM head's
  log-sum-exp. On CPU tensors the same kernels run under Triton's interpreter when the
  environment sets ``SPINF_KERNELS=triton`` (and ``TRITON_INTERPRET=1`` before Triton is first
  imported): that is how CI runs the GPU code path without a GPU.
- ``cublas``: ``triton`` with the library GEMM (cuBLAS) instead of ours — NOT batch-invariant;
  only for measuring what invariance costs (``bench/gpu_check.py --non-invariant``).

``docs/invariance.md`` lists the rule that makes each op invariant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from ..layout import PassLayout
from . import blocks
from .attention import KV, TorchAttention

#: Environment variable that selects the Triton kernels on CPU tensors (a fixed contract).
KERNELS_ENV = "SPINF_KERNELS"
BACKENDS = ("torch", "triton", "cublas")


class PassAttention(Protocol):
    """The attention of one pass; called once per layer (see :class:`TorchAttention`)."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
        *, scale: float, window: int | None, softcap: float | None,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear layer's weight in float8 (e4m3) with one fp32 scale per output channel:
    ``weight ≈ data.float() * scale[:, None]``. ``data [N, K]`` float8_e4m3fn, ``scale [N]`` fp32."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def interpreter_on() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to interpret kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "on", "yes"}


def choose(device: torch.device | str, requested: str | None = None, dtype: torch.dtype | str | None = None) -> str:
    """The back end for ``device``: ``requested`` if given, else ``triton`` on CUDA, else
    ``triton`` when ``SPINF_KERNELS=triton``, else ``torch``. ``dtype``: the activations' dtype
    (``None``: not checked).

    Raises:
        ValueError: an unknown name, ``torch``/``cublas`` asked for where they cannot run,
            ``triton`` on the CPU without ``TRITON_INTERPRET=1``, or ``triton`` on the CPU in a
            dtype other than float32 (the interpreter computes a bfloat16 ``tl.dot`` on the raw
            16-bit integers: its scores would be garbage).
    """
    dev = torch.device(device)
    env = os.environ.get(KERNELS_ENV, "").strip().lower() or None
    name = requested or env or ("triton" if dev.type == "cuda" else "torch")
    if name not in BACKENDS:
        raise ValueError(f"{KERNELS_ENV}={name!r} is not a kernel back end; use one of {', '.join(BACKENDS)}")
    if dev.type == "cuda" and name == "torch":
        raise ValueError("the torch back end is for the CPU; on CUDA the Triton kernels run (unset SPINF_KERNELS)")
    if dev.type != "cuda" and name == "cublas":
        raise ValueError("the cublas back end needs a CUDA device")
    if dev.type != "cuda" and name == "triton" and not interpreter_on():
        raise ValueError(
            "SPINF_KERNELS=triton on the CPU runs the kernels in Triton's interpreter: also set "
            "TRITON_INTERPRET=1 (before anything imports triton)"
        )
    if dev.type != "cuda" and name == "triton" and dtype not in (None, "float32", torch.float32):
        raise ValueError(
            f"SPINF_KERNELS=triton on the CPU runs in float32 only (Triton's interpreter computes a {dtype} "
            "matmul wrong); use --dtype float32, or unset SPINF_KERNELS"
        )
    return name


class Backend:
    """The ops of a forward pass for one back end (see the module docstring)."""

    def __init__(self, name: str) -> None:
        if name not in BACKENDS:
            raise ValueError(f"unknown kernel back end {name!r}")
        self.name = name

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight.T + bias``: ``x [M, K]``, ``weight [N, K]`` → ``[M, N]`` in ``x.dtype``.
        ``out``: a ``[M, N]`` buffer the torch back end may write into (others ignore it); use
        the returned tensor."""
        if isinstance(weight, QuantizedWeight):
            from kernels import matmul_fp8_ref, matmul_fp8_triton

            fp8 = matmul_fp8_ref if self.name == "torch" else matmul_fp8_triton
            y = fp8(x, weight.data, weight.scale)
        elif self.name == "torch":
            return blocks.linear(x, weight, bias, out)
        elif self.name == "cublas":
            return F.linear(x, weight, bias)
        else:
            from kernels import matmul_triton

            y = matmul_triton(x.contiguous(), weight)
        return y if bias is None else y + bias

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        """RMSNorm over the last dim of ``x [..., H]`` (see :func:`blocks.rms_norm`)."""
        if self.name == "torch":
            return blocks.rms_norm(x, weight, eps, offset)
        from kernels import rms_norm_triton

        shape = x.shape
        return rms_norm_triton(x.reshape(-1, shape[-1]), weight, eps, offset).view(shape)

    def logsumexp(self, logits: torch.Tensor) -> torch.Tensor:
        """``[R, V]`` → ``[R]`` fp32 row log-sum-exp."""
        if self.name == "torch":
            from kernels import logsumexp_ref

            return logsumexp_ref(logits)
        from kernels import logsumexp_triton

        return logsumexp_triton(logits)

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        """The attention of ``layout`` for ``group`` query heads per KV head (its plan moved to
        ``device`` once, here)."""
        if self.name == "torch":
            return TorchAttention(layout, device)
        return TritonAttention(layout, device, group)


class TritonAttention:
    """One ``kernels.tree_attention_triton`` launch per layer over the whole pass.

    The pass's segments become per-row key ranges (``kernels.TreeMask``) once, on the host, and
    are copied to the device once; per layer the keys are ``[preamble | carried | pass rows]``.
    """

    def __init__(self, layout: PassLayout, device: torch.device, group: int) -> None:
        from kernels import TreeMask, rows_per_block

        q0 = layout.query_start
        self.preamble_len = layout.preamble_len
        self.mask = TreeMask.from_segments(
            layout.segments, range(q0, q0 + layout.n_tokens), block_rows=rows_per_block(group)
        ).to(device)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
        *, scale: float, window: int | None, softcap: float | None,
    ) -> torch.Tensor:
        from kernels import tree_attention_triton

        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        if self.preamble_len:
            assert prefix is not None, "the pass attends to a preamble that was not passed"
            keys.append(prefix[0][: self.preamble_len])
            values.append(prefix[1][: self.preamble_len])
        for ck, cv in carried:
            keys.append(ck)
            values.append(cv)
        if keys:
            k = torch.cat([*keys, k])
            v = torch.cat([*values, v])
        return tree_attention_triton(q, k, v, self.mask, scale=scale, window=window, softcap=softcap)

