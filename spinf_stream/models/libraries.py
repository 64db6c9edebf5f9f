"""The vendor libraries under the kernels, as this machine has them.

Versions, torch's CPU BLAS
with the code path it picked, its thread count, and the CPU's instruction-set class."""

from __future__ import annotations

import ctypes
import importlib.metadata
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

#: MKL's code branches (``mkl_cbwr_get_auto_branch``; mkl_service.h, ``MKL_CBWR_*``)
MKL_BRANCHES = {
    2: "AUTO",  # what MKL answers on CPUs whose path it does not name (measured: AMD EPYC, AVX-512)
    3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2",
    11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1",
}


def installed_version(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``not installed``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@cache
def _torch_cpu_library() -> ctypes.CDLL | None:
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        return ctypes.CDLL(str(path)) if path.exists() else None
    except OSError:
        return None


def _mkl(symbol: str) -> Callable[..., int] | None:
    lib = _torch_cpu_library()
    return getattr(lib, symbol, None) if lib is not None else None


def blas_threads() -> int | None:
    """Threads MKL would use for a GEMM called from this thread (``mkl_get_max_threads``), or
    ``None`` when torch's BLAS is not MKL (or does not say)."""
    fn = _mkl("mkl_get_max_threads")
    return int(fn()) if fn is not None else None


@cache
def blas() -> str:
    """torch's BLAS, its version and, for MKL, the code branch it picked on this CPU, e.g.
    ``Intel oneMKL 2024.2 (AVX512_E1 code path)``."""
    config = torch.__config__.show()
    info = re.search(r"BLAS_INFO=(\w+)", config)
    name = info.group(1) if info else "unknown"
    if name == "mkl":
        version = re.search(r"Math Kernel Library Version ([0-9.]+)", config)
        branch_fn = _mkl("mkl_serv_cbwr_get_auto_branch")
        branch = int(branch_fn()) if branch_fn is not None else None
        path = MKL_BRANCHES.get(branch, f"branch {branch}") if branch is not None else "unknown"
        return f"Intel oneMKL {version.group(1) if version else '?'} ({path} code path)"
    return name


def cpu_isa() -> str:
    """torch's CPU kernel capability (``avx512``, ``avx2``, ``default``, ...)."""
    return torch.backends.cpu.get_cpu_capability().lower()
