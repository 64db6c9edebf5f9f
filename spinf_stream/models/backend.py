"""Which kernels run a forward pass: one class per back end, chosen once when the model loads.

- :class:`TorchBackend` (the CPU default): torch ops, every one with a single intra-op thread
  on one of the back end's workers (:class:`~spinf_stream.models.workers.ComputePool`), over
  units of work of fixed shapes: the token-wise ops in row chunks of :data:`ROW_CHUNK`, every
  linear layer in column tiles of :data:`COLUMN_TILE`, the attention per message
  (:mod:`spinf_stream.models.attention`), the LM head in tiles of :data:`HEAD_ROWS` x
  :data:`HEAD_COLUMNS`. So the BLAS sees the same shapes whatever the pass
  holds, and the bits do not depend on how many workers there are.
- :class:`TritonBackend` (CUDA, always): the batch-invariant Triton kernels of ``kernels/`` for
  every GEMM, RMSNorm, the packed tree attention (one launch per layer for the whole pass) and
  the LM head's log-sum-exp. On CPU tensors the same kernels run under Triton's interpreter when
  the environment sets ``SPINF_KERNELS=triton`` (and ``TRITON_INTERPRET=1`` before Triton is
  first imported): that is how CI runs the GPU code path without a GPU.
- :class:`CublasBackend`: the Triton back end with the library GEMM (cuBLAS) instead of ours —
  NOT batch-invariant; only for measuring what invariance costs (``bench/gpu_check.py --non-invariant``).

``docs/invariance.md`` lists the rule that makes each op invariant.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

import torch
import torch.nn.functional as F

from spinf_stream.engine.layout import PassLayout
from . import blocks
from .attention import KV, TorchAttention
from .workers import ComputePool

#: Environment variable that selects the Triton kernels on CPU tensors (a fixed contract).
KERNELS_ENV = "SPINF_KERNELS"
BACKENDS = ("torch", "triton", "cublas")

#: Rows of a pass whose token-wise ops (norms, projections, rotary, MLP) run together on the CPU:
#: every GEMM of a layer is ``[ROW_CHUNK, K] @ [K, tile]``, the last chunk padded with rows of
#: token 0. Chosen by measurement (bench/README.md, "Fixed shapes"): 128 and 256 give the same
#: throughput on full passes; 128 pads a short pass less.
ROW_CHUNK = 128
#: Output columns per GEMM of a linear layer (the last tile of a layer narrower, fixed per model):
#: a pass of few row chunks is split over the workers by (row chunk, tile) without changing a
#: GEMM's shape.
COLUMN_TILE = 512
#: Read rows per LM-head GEMM (the last group padded): small, since every pass pays its padding.
HEAD_ROWS = 32
#: Vocabulary columns per LM-head GEMM (the last tile of a vocabulary is narrower, fixed per model).
HEAD_COLUMNS = 8192
#: Read rows whose logits are held at once (bounds the ``[rows, vocab]`` fp32 buffer).
HEAD_GROUP = 256

T = TypeVar("T")
R = TypeVar("R")


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


Weight = torch.Tensor | QuantizedWeight


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


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class Backend:
    """The ops of a forward pass (see the module docstring); one subclass per back end.

    The decoder cuts a pass's rows with :meth:`row_chunks` and runs the token-wise ops of each
    chunk through :meth:`map`; every op of a chunk goes through :meth:`linear`,
    :meth:`rms_norm` and the shared blocks.
    """

    name: ClassVar[str]

    def row_chunks(self, n_rows: int) -> list[slice]:
        """How the token-wise ops cut ``n_rows`` rows: consecutive slices from 0; the last may end
        past ``n_rows`` (the caller pads its buffers to ``chunks[-1].stop`` rows)."""
        return [slice(0, n_rows)] if n_rows else []

    def column_tiles(self, n_out: int) -> list[slice]:
        """How a linear layer's ``n_out`` output columns are cut into GEMMs (consecutive slices)."""
        return [slice(0, n_out)]

    def tile_units(self, n_chunks: int) -> bool:
        """Whether a pass of ``n_chunks`` row chunks runs its linear layers as one unit per
        (row chunk, column tile) rather than one per row chunk (same ops, same bits)."""
        return False

    def map(self, fn: Callable[[T, blocks.Scratch | None], R], items: Sequence[T]) -> list[R]:
        """``[fn(item, scratch) for item in items]``: units of work that write disjoint rows."""
        return [fn(it, None) for it in items]

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight.T + bias``: ``x [M, K]``, ``weight [N, K]`` → ``[M, N]`` in ``x.dtype``.
        ``out``: a ``[M, N]`` buffer the back end may write into; use the returned tensor."""
        raise NotImplementedError

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        """RMSNorm over the last dim of ``x [..., H]`` (see :func:`blocks.rms_norm`)."""
        raise NotImplementedError

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        """The attention of ``layout`` for ``group`` query heads per KV head (its plan moved to
        ``device`` once, here)."""
        raise NotImplementedError

    def token_logprobs(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor, tokens: torch.Tensor,
    ) -> torch.Tensor:
        """``[N]`` fp32 on the CPU: ``logits[rows, tokens] - logsumexp(logits[rows])`` with
        ``logits = softcap(hidden @ lm_head.T)`` in fp32 (natural log). ``hidden [R, H]``,
        ``lm_head [V, H]``, ``rows``/``tokens`` ``[N]`` int64."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the back end's threads (if any)."""


def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else torch.tanh(logits / cap) * cap


class TorchBackend(Backend):
    """torch ops on the CPU, on ``threads`` single-threaded workers (created on first use).

    Args:
        threads: compute workers; default :func:`spinf_stream.cpus.compute_threads`.
    """

    name = "torch"

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads
        self._pool: ComputePool | None = None

    @property
    def threads(self) -> int:
        if self._threads is None:
            from ..cpus import compute_threads

            self._threads = compute_threads()
        return self._threads

    @property
    def pool(self) -> ComputePool:
        if self._pool is None:
            self._pool = ComputePool(self.threads)
        return self._pool

    def row_chunks(self, n_rows: int) -> list[slice]:
        return [slice(r, r + ROW_CHUNK) for r in range(0, n_rows, ROW_CHUNK)]

    def column_tiles(self, n_out: int) -> list[slice]:
        return [slice(c, min(c + COLUMN_TILE, n_out)) for c in range(0, n_out, COLUMN_TILE)]

    def tile_units(self, n_chunks: int) -> bool:
        return 1 < self.threads and n_chunks < 2 * self.threads

    def map(self, fn: Callable[[T, blocks.Scratch | None], R], items: Sequence[T]) -> list[R]:
        return self.pool.map(fn, items)

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            from kernels import matmul_fp8_ref

            y = matmul_fp8_ref(x, weight.data, weight.scale)
            return y if bias is None else y + bias
        return blocks.linear(x, weight, bias, out)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        return blocks.rms_norm(x, weight, eps, offset)

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        return TorchAttention(layout, device, self.pool)

    def token_logprobs(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor, tokens: torch.Tensor,
    ) -> torch.Tensor:
        from kernels import logsumexp_ref

        out = torch.empty(rows.shape[0], dtype=torch.float32)
        n_hidden, vocab = hidden.shape[0], lm_head.shape[0]
        if rows.numel() == 0:
            return out
        padded = hidden.new_zeros(_round_up(n_hidden, HEAD_ROWS), hidden.shape[1])
        padded[:n_hidden] = hidden
        columns = [slice(c, min(c + HEAD_COLUMNS, vocab)) for c in range(0, vocab, HEAD_COLUMNS)]
        for g0 in range(0, padded.shape[0], HEAD_GROUP):
            g1 = min(g0 + HEAD_GROUP, padded.shape[0])
            sel = (rows >= g0) & (rows < g1)
            if not bool(sel.any()):
                continue
            logits = torch.empty(g1 - g0, vocab, dtype=torch.float32, device=hidden.device)
            chunks = [slice(r, r + HEAD_ROWS) for r in range(g0, g1, HEAD_ROWS)]

            def tile(rc: tuple[slice, slice], scratch: blocks.Scratch | None) -> None:
                r, c = rc
                assert scratch is not None
                buf = scratch.get("head", (HEAD_ROWS, c.stop - c.start), padded)
                y = blocks.linear(padded[r], lm_head[c], out=buf)
                logits[r.start - g0 : r.stop - g0, c] = _softcap(y.float(), softcap)

            self.map(tile, [(r, c) for r in chunks for c in columns])
            lse = torch.cat(self.map(lambda r, _: logsumexp_ref(logits[r.start - g0 : r.stop - g0]), chunks))
            local = rows[sel] - g0
            out[sel] = (logits[local, tokens[sel]] - lse[local]).cpu()
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class TritonBackend(Backend):
    """The Triton kernels of ``kernels/`` (CUDA; CPU tensors under the interpreter)."""

    name = "triton"

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            from kernels import matmul_fp8_triton

            y = matmul_fp8_triton(x, weight.data, weight.scale)
        else:
            y = self._matmul(x, weight)
        return y if bias is None else y + bias

    def _matmul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        from kernels import matmul_triton

        return matmul_triton(x.contiguous(), weight)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        from kernels import rms_norm_triton

        shape = x.shape
        return rms_norm_triton(x.reshape(-1, shape[-1]), weight, eps, offset).view(shape)

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        return TritonAttention(layout, device, group)

    def token_logprobs(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor, tokens: torch.Tensor,
    ) -> torch.Tensor:
        from kernels import logsumexp_triton

        out = torch.empty(rows.shape[0], dtype=torch.float32)
        for c0 in range(0, hidden.shape[0], HEAD_GROUP):
            c1 = min(c0 + HEAD_GROUP, hidden.shape[0])
            sel = (rows >= c0) & (rows < c1)
            if not bool(sel.any()):
                continue
            logits = _softcap(self.linear(hidden[c0:c1], lm_head).float(), softcap)
            lse = logsumexp_triton(logits)
            r = (rows[sel] - c0).to(logits.device)
            out[sel] = (logits[r, tokens[sel].to(logits.device)] - lse[r]).cpu()
        return out


class CublasBackend(TritonBackend):
    """:class:`TritonBackend` with cuBLAS GEMMs (not batch-invariant; for measuring only)."""

    name = "cublas"

    def _matmul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


_CLASSES: dict[str, type[Backend]] = {"torch": TorchBackend, "triton": TritonBackend, "cublas": CublasBackend}


def make_backend(name: str, *, threads: int | None = None) -> Backend:
    """The back end called ``name`` (``threads``: the torch back end's compute workers).

    Raises:
        ValueError: an unknown name.
    """
    if name not in _CLASSES:
        raise ValueError(f"unknown kernel back end {name!r}; use one of {', '.join(BACKENDS)}")
    return TorchBackend(threads) if name == "torch" else _CLASSES[name]()


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
