"""Where the engine runs: ``--device`` and ``--dtype`` resolved and checked before any weight loads.

``auto`` picks CUDA when ``torch.cuda.is_available()``, else the CPU; and bfloat16 on CUDA,
float32 on the CPU. A choice this machine cannot run (``cuda`` without a visible GPU, ``fp8`` on
the CPU or on a GPU without fp8 tensor cores, i.e. compute capability below 8.9, ``int8`` on a GPU
older than Ampere, 8.0) raises
:class:`~spinf_stream.errors.UsageError` saying what to use instead.

torch is imported on first use only, so that a typo in another flag is reported without it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from .config import DEVICE_PATTERN, DType
from .errors import UsageError
from .cpus import compute_threads, usable_cpus

__all__ = [
    "DEVICE_PATTERN", "DTYPES", "FP8_MIN_CAPABILITY", "INT8_MIN_CAPABILITY", "Placement", "choose", "describe_runtime", "size_cpu_threads",
    "usable_cpus",
]

#: ``--dtype`` values (``--device`` values: :data:`DEVICE_PATTERN`)
DTYPES: tuple[str, ...] = get_args(DType)
#: fp8 (e4m3) tensor cores: Ada Lovelace (8.9), Hopper (9.0) and newer
FP8_MIN_CAPABILITY = (8, 9)
#: int8 weights with bf16 tensor-core MMA (the W8A16 GEMM): Ampere (8.0) and newer
INT8_MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Placement:
    """A resolved choice: ``device`` is ``cpu``, ``cuda`` or ``cuda:N``; ``dtype`` is ``float32``,
    ``bfloat16``, ``fp8`` or ``int8`` (the name ``Engine.load`` takes)."""

    device: str
    dtype: str

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda`` (what records say)."""
        return self.device.split(":", 1)[0]


def choose(device: str = "auto", dtype: str = "auto", *, torch_module: Any = None) -> Placement:
    """Resolve ``auto`` and check that this machine can run the choice.

    Args:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``auto``, ``float32``, ``bfloat16``, ``fp8`` or ``int8``.
        torch_module: the torch to ask (tests pass a stand-in); default: ``import torch``.

    Raises:
        UsageError: an unknown value, one this machine cannot run, a ``SPINF_KERNELS`` that
            does not suit it, or (on the CPU) an ``OMP_NUM_THREADS`` that is not a positive
            integer (the message says what to use instead).
    """
    if not re.match(DEVICE_PATTERN, device):
        raise UsageError(f"--device {device!r} (SPINF_DEVICE): use auto, cpu, cuda or cuda:N")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} (SPINF_DTYPE): use one of {', '.join(DTYPES)}")
    if torch_module is None:
        import torch as torch_module
    torch = torch_module
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0

    if device == "auto":
        device = "cuda" if gpus else "cpu"
    elif device.startswith("cuda"):
        if not gpus:
            build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
            raise UsageError(
                f"--device {device} (SPINF_DEVICE): no CUDA GPU is visible ({build}; "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                "use --device cpu, or auto to take a GPU when there is one"
            )
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= gpus:
            raise UsageError(
                f"--device {device} (SPINF_DEVICE): only {gpus} GPU(s) visible; use cuda:0"
                + (f" to cuda:{gpus - 1}" if gpus > 1 else "")
            )
    on_gpu = device.startswith("cuda")

    if dtype == "auto":
        dtype = "bfloat16" if on_gpu else "float32"
    if dtype == "fp8":
        if not on_gpu:
            raise UsageError(
                "--dtype fp8 (SPINF_DTYPE) needs a CUDA GPU with fp8 tensor cores (compute capability "
                "8.9 or newer: Ada, Hopper, Blackwell); on the CPU use --dtype float32 (or auto)"
            )
        cap = tuple(torch.cuda.get_device_capability(device))
        if cap < FP8_MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            raise UsageError(
                f"--dtype fp8 (SPINF_DTYPE): {name} ({device}) has compute capability {cap[0]}.{cap[1]}, "
                "fp8 tensor cores need 8.9 or newer; use --dtype int8 (int8 weights) or bfloat16 (or auto)"
            )
    if dtype == "int8" and on_gpu:
        cap = tuple(torch.cuda.get_device_capability(device))
        if cap < INT8_MIN_CAPABILITY:
            raise UsageError(
                f"--dtype int8 (SPINF_DTYPE): {torch.cuda.get_device_name(device)} ({device}) has compute capability "
                f"{cap[0]}.{cap[1]}; the int8-weight GEMM runs bfloat16 tensor cores, 8.0 (Ampere) or newer; "
                "use --dtype float32"
            )
    if dtype in ("bfloat16", "int8") and on_gpu and not torch.cuda.is_bf16_supported():
        raise UsageError(
            f"--dtype {dtype} (SPINF_DTYPE): {torch.cuda.get_device_name(device)} has no bfloat16 support; "
            "use --dtype float32"
        )
    # The kernel back end (SPINF_KERNELS) must suit the choice too: found now, not after the
    # model has loaded, and reported as a usage error.
    from .models.backend import choose as choose_kernels

    try:
        choose_kernels(device, dtype=dtype)
        if not on_gpu:
            compute_threads()  # OMP_NUM_THREADS sizes the CPU engine's compute workers
    except ValueError as e:
        raise UsageError(str(e)) from None
    return Placement(device=device, dtype=dtype)


def size_cpu_threads(*, environ: Mapping[str, str] | None = None, cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """The CPU engine's compute workers: ``OMP_NUM_THREADS`` when it is set (the standard knob),
    else :func:`usable_cpus` (see :func:`spinf_stream.cpus.compute_threads`; the rule and its
    measurements: README, "The service"). Every worker runs torch with one intra-op
    thread, so the bits do not depend on this number."""
    return compute_threads(environ=environ, cgroup_root=cgroup_root)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def describe_runtime() -> list[str]:
    """Lines for ``spinf-stream --version``: this package, torch, triton, and the GPUs torch sees."""
    import platform

    import torch

    cuda = torch.version.cuda
    lines = [
        f"spinf-stream {_version('spinf-stream')} (Python {platform.python_version()})",
        f"torch {torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU-only build'})",
        f"triton {_version('triton')}",
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            fp8 = "fp8 ok" if (major, minor) >= FP8_MIN_CAPABILITY else "no fp8"
            lines.append(f"GPU cuda:{i}: {torch.cuda.get_device_name(i)} (compute capability {major}.{minor}, {fp8})")
        lines.append("--device auto uses cuda (bfloat16)")
    else:
        lines.append("GPU: none visible to torch; --device auto uses the CPU (float32)")
    return lines
