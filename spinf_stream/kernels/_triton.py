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

__all__ = ["FP_FUSION", "HAS_TRITON", "cdiv", "dot_precision", "jit", "tl", "triton"]

HAS_TRITON: bool = triton is not None

#: Floating-point contraction (``a * b + c`` as one fused multiply-add) in every kernel, passed
#: at every launch: it decides the bits, and Triton's default for it changes in 3.10 (on until
#: 3.9, off after). The interpreter ignores it (numpy rounds each operation).
FP_FUSION = True


def _row_invariant_interpreter_dot() -> None:
    """Make the interpreter's `tl.dot` compute each output row on its own, as a GPU's MMA does.

    Triton's interpreter evaluates `tl.dot` with `np.matmul`, i.e. the host BLAS, whose result
    for a row depends on the row's place in the tile (OpenBLAS's Haswell sgemm, measured: row 41
    of a 64-row tile differs from the same row at row 0 by 3e-6). That would make every kernel's
    batch invariance untestable on the CPU. `np.einsum(optimize=False)` runs numpy's own
    sum-of-products loop instead: each output element accumulates over k in order, whatever
    the other rows (and it is faster on these small tiles). Applied once, at import.
    """
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton without its interpreter
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "create_dot", None)
    if original is None or getattr(original, "_spinf_row_invariant", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
        a_data, b_data = a.data, b.data
        for h in (a, b):
            if h.dtype.primitive_bitwidth == 8 and h.dtype.is_floating():
                # float8 bytes: widen exactly to float16 with the interpreter's own converter
                data = interpreter._convert_float(h.data, h.dtype, tl.float16, None).view(np.float16)
                a_data, b_data = (data, b_data) if h is a else (a_data, data)
        acc = d.data.dtype
        out = np.einsum("...ik,...kj->...ij", a_data.astype(acc), b_data.astype(acc), optimize=False)
        return interpreter.TensorHandle(out + d.data, d.dtype.scalar)

    create_dot._spinf_row_invariant = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot


def _rounding_interpreter_float8() -> None:
    """Make the interpreter round fp32 to float8 e4m3 as the GPU does (round to nearest even).

    Triton's interpreter narrows floats by truncating the significand and adding the first cut
    bit, with no carry into the exponent: 127.69 became 64.0, not 128.0 (Triton 3.9). A GPU's
    ``cvt.rn`` rounds to nearest even, as torch's ``.to(torch.float8_e4m3fn)`` does, which is
    what the interpreter now calls for that one conversion. Applied once, at import.
    """
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton without its interpreter
        return
    original = getattr(interpreter, "_convert_float", None)
    if original is None or getattr(original, "_spinf_rounding", False):
        return

    def convert(data, input_dtype, output_dtype, rounding_mode):  # noqa: ANN001, ANN202
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
            x = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        return original(data, input_dtype, output_dtype, rounding_mode)

    convert._spinf_rounding = True  # type: ignore[attr-defined]
    interpreter._convert_float = convert


if HAS_TRITON:
    _row_invariant_interpreter_dot()
    _rounding_interpreter_float8()


def cdiv(a: int, b: int) -> int:
    """Ceil division for launch grids."""
    return -(-a // b)


def dot_precision(dtype: torch.dtype) -> str | None:
    """`tl.dot`'s input_precision for operands of `dtype`.

    fp32 operands get "ieee": true fp32 products, as torch computes them on CPU (TF32 would round
    the inputs to 10 mantissa bits and break fp32 parity with the oracle). Other operands (bf16,
    fp16, fp8) keep Triton's default (None): the setting only concerns fp32.
    """
    return "ieee" if dtype == torch.float32 else None


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
