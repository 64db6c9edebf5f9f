"""Triton as an optional dependency.

Triton is needed only on CUDA (and in the kernel tests, which run it on CPU under
`TRITON_INTERPRET=1`); a CPU-only install has no Triton, and then the package still imports, the
torch twins are the whole back end, and launching a Triton kernel raises `RuntimeError`.

Interpreter mode is fixed when `triton` is first imported in the process: its own standard
library (`tl.zeros`, `tl.sum`, ...) is decorated then. Set `TRITON_INTERPRET=1` before anything
imports triton (note: `from transformers import <model>` does).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only install
    triton = None
    tl = None

__all__ = ["HAS_TRITON", "cdiv", "dot_precision", "jit", "tl", "triton"]

HAS_TRITON: bool = triton is not None


def cdiv(a: int, b: int) -> int:
    """Ceil division for launch grids."""
    return -(-a // b)


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input_precision for operands of `dtype`.

    fp32 operands get "ieee": true fp32 products, as torch computes them on CPU (TF32 would round
    the inputs to 10 mantissa bits and break fp32 parity with the oracle). Half-precision operands
    keep Triton's default; the setting only concerns fp32.
    """
    return "ieee" if dtype == torch.float32 else "tf32"


class _MissingTriton:
    """Stands in for a jitted kernel when Triton is not installed; fails at launch, not import."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        raise RuntimeError(f"{self.fn.__name__}: Triton is not installed (CUDA back end only)")


def jit(**jit_kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
    """`triton.jit(**jit_kwargs)`, or a launch-time error when Triton is missing."""

    def decorate(fn: Callable[..., Any]) -> Any:
        if triton is None:
            return _MissingTriton(fn)
        return triton.jit(fn, **jit_kwargs)

    return decorate
