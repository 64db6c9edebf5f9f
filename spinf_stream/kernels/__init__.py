"""Batch-invariant kernels for the engine's forward pass, each with a torch reference twin.

Each module exposes three entry points with one signature:

- `<op>`: the dispatcher the engine calls (Triton on CUDA tensors, the torch twin elsewhere);
- `<op>_triton`: the Triton kernel (CUDA; on CPU under `TRITON_INTERPRET=1`, as the tests run it);
- `<op>_ref`: the torch twin.

Every op computes a row (a token, or a message's tokens for attention) with a reduction order that
depends on that row alone, so scores are bitwise independent of what else is in the batch.
"""

from __future__ import annotations

from .logsumexp import logsumexp, logsumexp_ref, logsumexp_triton
from .matmul import gated_matmul_ref, gated_matmul_triton, matmul, matmul_ref, matmul_triton
from .matmul_fp8 import gated_matmul_fp8_triton, matmul_fp8, matmul_fp8_ref, matmul_fp8_triton, quantize_rows
from .matmul_int8 import gated_matmul_int8_triton, matmul_int8, matmul_int8_ref, matmul_int8_triton
from .rmsnorm import quantize_rows_triton, rms_norm, rms_norm_add_triton, rms_norm_fp8_triton, rms_norm_ref, rms_norm_triton
from .tree_attention import TreeMask, rows_per_block, tree_attention, tree_attention_ref, tree_attention_triton

__all__ = [
    "TreeMask",
    "gated_matmul_fp8_triton",
    "gated_matmul_int8_triton",
    "gated_matmul_ref",
    "gated_matmul_triton",
    "quantize_rows_triton",
    "rms_norm_add_triton",
    "rms_norm_fp8_triton",
    "logsumexp",
    "logsumexp_ref",
    "logsumexp_triton",
    "matmul",
    "matmul_ref",
    "matmul_triton",
    "matmul_fp8",
    "matmul_fp8_ref",
    "matmul_fp8_triton",
    "matmul_int8",
    "matmul_int8_ref",
    "matmul_int8_triton",
    "quantize_rows",
    "rms_norm",
    "rms_norm_ref",
    "rms_norm_triton",
    "rows_per_block",
    "tree_attention",
    "tree_attention_ref",
    "tree_attention_triton",
]
