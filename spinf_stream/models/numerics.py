"""What decides a record's bits, and the probe that checks it at load.

The records' ``numerics`` block, and the probe that
checks the few properties of a vendor library (the CPU BLAS) that bit-stability rests on.

A record's ``numerics`` block comes from :func:`describe`, that is from the back end's own
:meth:`~spinf_stream.models.ops.Backend.numerics`: the instruction-set class torch's kernels use
(``avx512``, ``avx2``; on CUDA the architecture, ``sm_90``), the libraries with their versions
(torch and its BLAS with the code path it picked, :mod:`spinf_stream.models.libraries`; Triton),
and the tile sizes of the pass. Digests are comparable, and equal by construction, between
records whose ``model`` and ``numerics`` blocks are equal.

:func:`probe` (torch back end) runs the model's own GEMM shapes on random inputs, on the back
end's workers, and checks what ``docs/invariance.md`` relies on:

- a GEMM row's bits depend on that row alone: not on the other rows of the fixed-shape GEMM,
  nor on the row's place in it (rows permuted and half of them replaced; every row shifted by
  each of :data:`SHIFTS` places, so that each place is compared with the next);
- every worker computes the same bits (each runs its BLAS with one thread; with MKL, its own
  thread count is read back on every worker).

It raises :class:`UnstableBits` naming the shape and the BLAS when one fails.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import attention as attn
from .backend import backend_class
from .libraries import blas, blas_threads
from .ops import Numerics, Weight, weight_rows
from .torch_backend import DECODE_ROWS, HEAD_COLUMNS, HEAD_ROWS, ROW_CHUNK, TorchBackend

if TYPE_CHECKING:
    from .decoder import Decoder

log = logging.getLogger(__name__)

#: Cyclic shifts of the probe's rows: with 1, every place is compared with the next one.
SHIFTS = (1, 2, 3, 5)

__all__ = ["Numerics", "ProbeReport", "UnstableBits", "blas", "blas_threads", "check_bits", "describe", "probe"]


class UnstableBits(RuntimeError):
    """The bits probe found a property the engine's bit-stability rests on broken on this
    machine (the message names the shape, the property and the BLAS)."""


def describe(device: torch.device, backend_name: str, dtype: torch.dtype) -> Numerics:
    """The numerics of a decoder on ``device`` with back end ``backend_name`` (activations in
    ``dtype``): the back end's :meth:`~spinf_stream.models.ops.Backend.numerics`;
    ``bits_probe`` is ``not_run`` or ``not_needed`` (the engine sets it after the probe).

    Raises:
        ValueError: an unknown back end name.
    """
    return backend_class(backend_name).numerics(device, dtype)


@dataclass(frozen=True)
class ProbeReport:
    """What :func:`probe` checked: ``shapes`` GEMM shapes on ``workers`` workers in ``seconds``."""

    shapes: int
    workers: int
    seconds: float


def _shapes(decoder: Decoder) -> list[tuple[str, Weight, torch.Tensor | None, int]]:
    """``(label, weight tile [N, K] (quantized ones too), bias, rows)`` of every distinct GEMM shape of layer 0's
    linear layers (their column tiles, at the prefill's and the decode steps' row chunks) and of
    the LM head."""
    lw = decoder.layers[0]
    inter = lw.gate_up.shape[0] // 2
    layers = (("q/k/v projection", lw.qkv, lw.qkv_bias, 0), ("attention output", lw.o, None, 0),
              ("MLP gate/up", lw.gate_up, None, inter), ("MLP down", lw.down, None, 0))
    out: list[tuple[str, Weight, torch.Tensor | None, int]] = []
    seen: set[tuple[int, int, int]] = set()
    for label, w, bias, width in layers:
        for t in decoder.backend.column_tiles(width or w.shape[0]):
            for rows in (ROW_CHUNK, DECODE_ROWS):
                key = (t.stop - t.start, w.shape[1], rows)
                if key not in seen:
                    seen.add(key)
                    out.append((label, weight_rows(w, t), None if bias is None else bias[t], rows))
    head, vocab = decoder.lm_head, decoder.lm_head.shape[0]
    out.append(("LM head tile", head[: min(HEAD_COLUMNS, vocab)], None, HEAD_ROWS))
    if vocab > HEAD_COLUMNS and vocab % HEAD_COLUMNS:
        out.append(("LM head last tile", head[vocab - vocab % HEAD_COLUMNS :], None, HEAD_ROWS))
    return out


def _attention_shapes(decoder: Decoder) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor], int, int]]:
    """``(label, f, rows, K)``: the attention's GEMMs of a branch chunk, as functions of their
    row operand ``[rows, K]``: q·kᵀ and p·v against a few key counts (the other operand fixed),
    and the own-branch products batched over rows (a row holds both operands of its item)."""
    s = decoder.spec
    g, d = s.num_heads // s.num_kv_heads, s.head_dim
    gen = torch.Generator().manual_seed(1)
    dt = torch.float32  # the attention computes in fp32
    out: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], int, int]] = []
    rows = g * attn.BRANCH_ROWS
    for n_keys in (16, 48, 272, 1040):
        kt = torch.randn(d, n_keys, generator=gen, dtype=dt)
        vv = torch.randn(n_keys, d, generator=gen, dtype=dt)
        out.append((f"attention q.k [{rows}, {d}] @ [{d}, {n_keys}]", lambda x, kt=kt: torch.mm(x, kt), rows, d))
        out.append((f"attention p.v [{rows}, {n_keys}] @ [{n_keys}, {d}]", lambda x, vv=vv: torch.mm(x, vv), rows, n_keys))
    batch = s.num_kv_heads * attn.BRANCH_ROWS
    for w in (16, 32):
        # a row of the operand is one batch item: its [g, K] block and its own [K, N] block
        for what, k, n in (("q.k", d, w), ("p.v", w, d)):
            def item_bmm(x: torch.Tensor, g: int = g, k: int = k, n: int = n) -> torch.Tensor:
                a, b = x[:, : g * k].reshape(-1, g, k), x[:, g * k :].reshape(-1, k, n)
                return torch.bmm(a, b).reshape(x.shape[0], -1)

            out.append((f"attention own-branch {what} {batch} x [{g}, {k}] @ [{k}, {n}]", item_bmm, batch, g * k + k * n))
    return out


def probe(decoder: Decoder, *, seed: int = 0) -> ProbeReport:
    """Check, on ``decoder``'s back end workers and its own GEMM shapes, that a GEMM row's bits
    depend on that row alone and on no worker (see the module docstring). Cheap: a few GEMMs
    per shape (~0.1-0.5 s for the shipped models).

    Raises:
        UnstableBits: names the first shape and property that failed, and the BLAS.
        TypeError: ``decoder`` does not run on the torch back end (nothing to probe).
    """
    backend = decoder.backend
    if not isinstance(backend, TorchBackend):
        raise TypeError(f"the bits probe checks the torch back end, not {backend.name!r}")
    t0 = time.perf_counter()
    pool = backend.pool
    where = f"{blas()}, torch {torch.__version__}, {pool.threads} worker(s)"
    threads = pool.on_each_worker(blas_threads)
    if any(t is not None and t != 1 for t in threads):
        raise UnstableBits(
            f"the BLAS runs {max(t or 0 for t in threads)} threads on the engine's workers, which must run 1 "
            f"({where}): a GEMM's bits would follow the thread count"
        )
    checks: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], int, int, torch.dtype]] = []
    for label, w, bias, rows in _shapes(decoder):
        n, k = w.shape
        # the engine's own call: the GEMM written into a buffer (Decoder._tile, the LM head's tiles);
        # a quantized weight's activations are the pass's (the final norm's dtype)
        act = w.dtype if isinstance(w, torch.Tensor) else decoder.final_norm.dtype
        kind = "" if isinstance(w, torch.Tensor) else f" ({w.data.dtype} weights)"
        checks.append((f"{label}{kind} [{rows}, {k}] @ [{k}, {n}]",
                       lambda x, w=w, bias=bias: backend.linear(x, w, bias, out=x.new_empty(x.shape[0], w.shape[0])),
                       rows, k, act))
    checks.extend((label, f, rows, k, torch.float32) for label, f, rows, k in _attention_shapes(decoder))
    gen = torch.Generator().manual_seed(seed)
    for label, f, rows, k, dtype in checks:
        x = torch.randn(rows, k, generator=gen).to(dtype)
        perm = torch.randperm(rows, generator=gen)
        kept = perm[: rows // 2]
        y = torch.randn(rows, k, generator=gen).to(dtype)
        y[: rows // 2] = x[kept]  # half the rows moved to other places, the rest new
        results = pool.on_each_worker(lambda x=x, y=y, f=f: (f(x).clone(), f(y).clone()))
        ref = results[0][0]
        if not torch.equal(results[0][1][: rows // 2], ref[kept]):
            raise UnstableBits(
                f"{label}: a row's bits depend on the other rows or on the row's place in the GEMM ({where})"
            )
        if any(not (torch.equal(a, ref) and torch.equal(b, results[0][1])) for a, b in results[1:]):
            raise UnstableBits(f"{label}: the engine's workers compute different bits for the same rows ({where})")
        # every row moved by each shift: each place is compared with the places next to it, so an
        # edge kernel for the last rows (place-dependent bits) cannot hide behind the random draw above
        shifted = pool.map(lambda s, _, x=x, f=f: torch.roll(f(torch.roll(x, s, 0)), -s, 0), SHIFTS)
        for s, got in zip(SHIFTS, shifted):
            moved = (got != ref).flatten(1).any(1).nonzero().flatten().tolist()
            if moved:
                r = moved[0]
                raise UnstableBits(
                    f"{label}: a row's bits depend on the row's place in the GEMM (row {r} has other bits at place "
                    f"{(r + s) % rows}) ({where})"
                )
    return ProbeReport(shapes=len(checks), workers=pool.threads, seconds=time.perf_counter() - t0)


#: decoder -> what its probe found (a decoder's workers and shapes do not change after load)
_PROBED: weakref.WeakKeyDictionary[Decoder, ProbeReport | UnstableBits] = weakref.WeakKeyDictionary()


def check_bits(decoder: Decoder, allow_unstable: bool = False) -> str | None:
    """Run :func:`probe` once per decoder (logged with its time) and say how it went:
    ``"passed"``, ``"failed"`` (only when ``allow_unstable``; logged as a warning), or ``None``
    for a back end with nothing to probe.

    Raises:
        UnstableBits: the probe failed and ``allow_unstable`` is false.
    """
    if not decoder.backend.needs_bits_probe:
        return None
    found = _PROBED.get(decoder)
    if found is None:
        try:
            found = probe(decoder)
            log.info("bits probe passed: %d GEMM shapes on %d worker(s) in %.2f s (%s)",
                     found.shapes, found.workers, found.seconds, blas())
        except UnstableBits as e:
            found = e
        _PROBED[decoder] = found
    if isinstance(found, UnstableBits):
        if not allow_unstable:
            raise found
        log.warning("bits probe failed, scoring anyway (--allow-unstable-bits): %s", found)
        return "failed"
    return "passed"
