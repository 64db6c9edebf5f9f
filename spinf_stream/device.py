"""Where the engine runs: ``--device`` and ``--dtype`` resolved and checked before any weight loads.

``auto`` picks CUDA when ``torch.cuda.is_available()``, else the CPU; and bfloat16 on CUDA,
float32 on the CPU. A choice this machine cannot run (``cuda`` without a visible GPU, ``fp8`` on
the CPU or on a GPU without fp8 tensor cores, i.e. compute capability below 8.9) raises
:class:`~spinf_stream.errors.UsageError` saying what to use instead.

torch is imported on first use only, so that a typo in another flag is reported without it.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from .config import DEVICE_PATTERN, DType
from .errors import UsageError

__all__ = [
    "DEVICE_PATTERN", "DTYPES", "FP8_MIN_CAPABILITY", "Placement", "choose", "describe_runtime", "size_cpu_threads",
    "usable_cpus",
]

#: ``--dtype`` values (``--device`` values: :data:`DEVICE_PATTERN`)
DTYPES: tuple[str, ...] = get_args(DType)
#: fp8 (e4m3) tensor cores: Ada Lovelace (8.9), Hopper (9.0) and newer
FP8_MIN_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Placement:
    """A resolved choice: ``device`` is ``cpu``, ``cuda`` or ``cuda:N``; ``dtype`` is ``float32``,
    ``bfloat16`` or ``fp8`` (the name ``Engine.load`` takes)."""

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
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``fp8``.
        torch_module: the torch to ask (tests pass a stand-in); default: ``import torch``.

    Raises:
        UsageError: an unknown value, one this machine cannot run, or a ``SPINF_KERNELS`` that
            does not suit it (the message says what to use instead).
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
                "fp8 tensor cores need 8.9 or newer; use --dtype bfloat16 (or auto)"
            )
    if dtype == "bfloat16" and on_gpu and not torch.cuda.is_bf16_supported():
        raise UsageError(
            f"--dtype bfloat16 (SPINF_DTYPE): {torch.cuda.get_device_name(device)} has no bfloat16 support; "
            "use --dtype float32"
        )
    # The kernel back end (SPINF_KERNELS) must suit the choice too: found now, not after the
    # model has loaded, and reported as a usage error.
    from .models.backend import choose as choose_kernels

    try:
        choose_kernels(device, dtype=dtype)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return Placement(device=device, dtype=dtype)


def _cgroup_cpu_quota(root: Path) -> float | None:
    """CPUs the cgroup may use per period (``quota / period``), or ``None`` when unlimited or unknown.
    cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``), else v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (quota ``-1`` = unlimited). Read where a container sees its own group."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: its affinity mask (``os.sched_getaffinity``; ``os.cpu_count``
    where that does not exist), capped by its cgroup's CPU quota rounded down, at least 1.

    The quota matters in containers: a pod limited to 2 CPUs on a 64-core node still sees 64 CPUs
    in its affinity mask, and 64 compute threads throttled to 2 CPUs' worth of time would stall
    each other at every barrier.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(Path(cgroup_root))
    if quota is not None:
        cpus = min(cpus, math.floor(quota))
    return max(1, cpus)


def size_cpu_threads(*, environ: Mapping[str, str] | None = None, torch_module: Any = None,
                     cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """Set torch's intra-op (compute) threads for the engine and return their number:
    ``OMP_NUM_THREADS`` when it is set (the standard knob, which torch reads itself), else
    :func:`usable_cpus`. Call it on the engine thread before its first op (the rule and its
    measurements: README, "The service").
    """
    environ = os.environ if environ is None else environ
    if torch_module is None:
        import torch as torch_module
    if not environ.get("OMP_NUM_THREADS", "").strip():
        torch_module.set_num_threads(usable_cpus(cgroup_root))
    return int(torch_module.get_num_threads())


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
