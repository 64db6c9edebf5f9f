"""The CPU back end (torch, fixed shapes, one thread per op).

Torch ops, each with a single intra-op thread on one of the back end's
workers, over units of work of fixed shapes.

:class:`TorchBackend` runs every op on one of its workers
(:class:`~spinf_stream.models.workers.ComputePool`): the token-wise ops in row chunks of
:data:`ROW_CHUNK`, every linear layer in column tiles of :data:`COLUMN_TILE`, the attention per
message (:mod:`spinf_stream.models.attention`), the LM head in tiles of :data:`HEAD_ROWS` x
:data:`HEAD_COLUMNS`. So the BLAS sees the same shapes whatever the pass holds, and the bits do
not depend on how many workers there are. ``docs/invariance.md`` lists the rule that makes each
op invariant; the bits probe (:mod:`spinf_stream.models.numerics`) checks the BLAS property it
rests on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch

from spinf_stream.engine.layout import PassLayout
from . import attention as attn
from . import blocks
from .libraries import blas, cpu_isa
from .ops import HEAD_GROUP, Backend, Numerics, PassAttention, QuantizedWeight, Weight, apply_softcap
from .workers import ComputePool

#: Rows of a pass whose token-wise ops (norms, projections, rotary, MLP) run together on the CPU:
#: every GEMM of a layer is ``[ROW_CHUNK, K] @ [K, tile]``, the last chunk padded with rows of
#: token 0. Chosen by measurement (bench/README.md, "Fixed shapes"): 128 and 256 give the same
#: throughput on full passes; 128 pads a short pass less.
ROW_CHUNK = 128
#: Rows per chunk of a pass of decode steps (a few rows per open extraction): its GEMMs are
#: ``[16, K] @ [K, 512]``, a second fixed shape the bits probe checks too.
DECODE_ROWS = 16
#: Output columns per GEMM of a linear layer (the last tile of a layer narrower, fixed per model):
#: a pass of few row chunks is split over the workers by (row chunk, tile) without changing a
#: GEMM's shape.
COLUMN_TILE = 512
#: Read rows per LM-head GEMM (the last group padded): small, since every pass pays its padding,
#: and a size at which MKL's rows are place-invariant on its AVX2 path too (at 32 rows that path
#: gives some places other bits; measured, bench/README.md "Fixed shapes"). Divides HEAD_GROUP.
HEAD_ROWS = 64
assert HEAD_GROUP % HEAD_ROWS == 0
#: Vocabulary columns per LM-head GEMM (the last tile of a vocabulary is narrower, fixed per model).
HEAD_COLUMNS = 8192

T = TypeVar("T")
R = TypeVar("R")


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class TorchBackend(Backend):
    """torch ops on the CPU, on ``threads`` single-threaded workers (created on first use).

    Args:
        threads: compute workers; default :func:`spinf_stream.cpus.compute_threads`.
    """

    name = "torch"
    needs_bits_probe = True

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads
        self._pool: ComputePool | None = None

    @classmethod
    def check(cls, device: torch.device, dtype: torch.dtype | str | None) -> None:
        if device.type == "cuda":
            raise ValueError("the torch back end is for the CPU; on CUDA the Triton kernels run (unset SPINF_KERNELS)")

    @classmethod
    def create(cls, *, threads: int | None = None) -> TorchBackend:
        return cls(threads)

    @classmethod
    def numerics(cls, device: torch.device, dtype: torch.dtype) -> Numerics:
        return Numerics(
            isa=cpu_isa(),
            library=f"torch {torch.__version__.split('+')[0]}, {blas()}",
            tiles=f"rows {ROW_CHUNK} (decode {DECODE_ROWS}), columns {COLUMN_TILE}, content blocks {attn.CONTENT_BLOCK}, "
                  f"branch rows {attn.BRANCH_ROWS}, head {HEAD_ROWS}x{HEAD_COLUMNS}",
        )

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

    def row_chunks(self, n_rows: int, decode: bool = False) -> list[slice]:
        size = DECODE_ROWS if decode else ROW_CHUNK
        return [slice(r, r + size) for r in range(0, n_rows, size)]

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
            from spinf_stream.kernels import matmul_fp8_ref, matmul_int8_ref

            ref = matmul_int8_ref if weight.data.dtype == torch.int8 else matmul_fp8_ref
            y = ref(x, weight.data, weight.scale)
            return y if bias is None else y + bias
        return blocks.linear(x, weight, bias, out)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        return blocks.rms_norm(x, weight, eps, offset)

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        return attn.TorchAttention(layout, device, self.pool)

    def token_logprobs(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor, tokens: torch.Tensor,
    ) -> torch.Tensor:
        out = torch.empty(rows.shape[0], dtype=torch.float32)
        for sel, local, logits, lse in self._head_groups(hidden, lm_head, softcap, rows):
            out[sel] = (logits[local, tokens[sel]] - lse[local]).cpu()
        return out

    def read_logits(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits_out = torch.empty(rows.shape[0], lm_head.shape[0], dtype=torch.float32)
        lse_out = torch.empty(rows.shape[0], dtype=torch.float32)
        for sel, local, logits, lse in self._head_groups(hidden, lm_head, softcap, rows):
            logits_out[sel] = logits[local].cpu()
            lse_out[sel] = lse[local].cpu()
        return logits_out, lse_out

    def _head_groups(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per group of :data:`~spinf_stream.models.ops.HEAD_GROUP` hidden rows that ``rows``
        reads: ``(sel [N] bool, local [n] rows in the group, logits [g, V] fp32, lse [g])``, the
        logits in ``HEAD_ROWS`` x ``HEAD_COLUMNS`` tiles on the workers."""
        from spinf_stream.kernels import logsumexp_ref

        n_hidden, vocab = hidden.shape[0], lm_head.shape[0]
        if rows.numel() == 0:
            return
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
                logits[r.start - g0 : r.stop - g0, c] = apply_softcap(y.float(), softcap)

            self.map(tile, [(r, c) for r in chunks for c in columns])
            lse = torch.cat(self.map(lambda r, _: logsumexp_ref(logits[r.start - g0 : r.stop - g0]), chunks))
            yield sel, rows[sel] - g0, logits, lse

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

