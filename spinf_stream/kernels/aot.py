"""Compiling the engine's Triton kernels for a GPU architecture on a machine without one.

Triton's compiler needs no GPU (its wheel carries ``ptxas``). Inside :func:`compiling_for`, every
kernel launch the engine makes is compiled by Triton's own JIT path (the same binder, the same
specialization of arguments, the same constexprs and launch options) for the named architecture,
and not run: the launch returns at once and its output tensors stay unwritten. Each compiled
kernel is then read back from its cubin and PTX by :func:`inspect`: shared memory per block,
registers, spills, and the tensor-core instruction family.

The architectures, their shared-memory limit per block and their tensor-core instructions are
from NVIDIA's CUDA C++ Programming Guide (table "Technical Specifications per Compute
Capability") and the PTX ISA (``mma.sync`` from sm_80, ``wgmma`` sm_90a, ``tcgen05`` sm_100a).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

from ._triton import triton

__all__ = [
    "ARCHS", "OUTPUTS", "Arch", "KernelReport", "compiling_for", "inspect", "planned_capability", "shared_memory_limit",
]


@dataclasses.dataclass(frozen=True)
class Arch:
    """A GPU architecture a build targets."""

    sm: int  #: compute capability as Triton names it (major * 10 + minor)
    name: str
    shared_limit: int  #: bytes of shared memory one block may use (the opt-in maximum)
    mma: str  #: the tensor-core instruction family its kernels must use: "mma", "wgmma" or "tcgen05"
    fp8: bool  #: whether it has fp8 tensor cores (compute capability >= 8.9)
    sms: int  #: streaming multiprocessors of its named card (a persistent kernel's grid when compiling)
    tma: bool  #: whether it has the tensor memory accelerator (bulk tensor copies: sm_90 on)


ARCHS: dict[int, Arch] = {a.sm: a for a in (
    Arch(80, "Ampere (A100, A30)", 166_912, "mma", False, 108, False),
    Arch(86, "Ampere (A10, RTX 30)", 101_376, "mma", False, 72, False),
    Arch(89, "Ada (L4, L40S, RTX 4090)", 101_376, "mma", True, 128, False),
    Arch(90, "Hopper (H100, H200)", 232_448, "wgmma", True, 132, True),
    Arch(100, "Blackwell (B200)", 232_448, "tcgen05", True, 148, True),
    Arch(120, "Blackwell (RTX 50, RTX PRO)", 101_376, "mma", True, 170, True),
)}

#: What the engine's kernels call their output argument.
OUTPUTS = frozenset({"Y", "O", "OUT"})

_TARGET: contextvars.ContextVar[int | None] = contextvars.ContextVar("spinf_aot_target", default=None)


def planned_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability launches on ``device`` are planned for: the device's own on CUDA,
    the architecture :func:`compiling_for` names inside it, else ``None`` (Triton's interpreter)."""
    if device.type == "cuda":
        return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]
    sm = _TARGET.get()
    return None if sm is None else divmod(sm, 10)


def shared_memory_limit(device: torch.device) -> int | None:
    """Bytes of shared memory one block may use on the GPU launches are planned for: the
    device's opt-in maximum on CUDA, :data:`ARCHS`' figure inside :func:`compiling_for`, ``None``
    for Triton's interpreter (no limit)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).shared_memory_per_block_optin)
    sm = _TARGET.get()
    return None if sm is None else ARCHS[sm].shared_limit


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """One compiled kernel, as read from its cubin (``cuobjdump -res-usage``) and its PTX."""

    kernel: str
    sm: int
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    shared: int  #: bytes of shared memory per block (all of it dynamic: Triton declares no static)
    registers: int  #: per thread
    spill_bytes: int  #: local memory per thread (spilled registers, stack)
    mma: str  #: "wgmma", "tcgen05", "mma" or "none"
    fp8_mma: bool  #: whether its PTX multiplies fp8 (e4m3) operands on tensor cores
    fp_fusion: bool
    tma: bool = False  #: whether its PTX loads through the tensor memory accelerator (``cp.async.bulk.tensor``)


class _PlanningDriver:
    """Triton's active driver while compiling for ``sm``: no device, only the target."""

    def __init__(self, sm: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", sm, 32)

    def get_current_device(self) -> int:
        return self.target.arch  # one cache of compiled kernels per architecture

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def is_active(self) -> bool:
        return True

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


@contextlib.contextmanager
def compiling_for(sm: int) -> Iterator[list[Any]]:
    """Within it, Triton kernel launches compile for ``sm`` and return without running; each
    zero-fills its output (the argument named in :data:`OUTPUTS`), so the host code around the
    launches reads finite values, never uninitialised memory.

    Yields the list the compiled kernels (Triton's ``CompiledKernel``) are appended to, one per
    launch, in launch order. Not thread-safe; not under ``TRITON_INTERPRET``.

    Raises:
        RuntimeError: Triton is not installed, or the interpreter is on.
        KeyError: an architecture not in :data:`ARCHS`.
    """
    if triton is None:
        raise RuntimeError("compiling kernels ahead of time needs Triton")
    from triton.runtime import driver as drivers
    from triton.runtime.jit import JITFunction

    if not hasattr(JITFunction, "run") or os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        raise RuntimeError("compiling kernels ahead of time needs Triton's compiler, not its interpreter")
    ARCHS[sm]  # noqa: B018 - a KeyError names the unknown architecture
    compiled: list[Any] = []
    launch = JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        for arg_name, a in zip(self.arg_names, args):  # the host reads zeros, not uninitialised memory
            a = getattr(a, "base", a)  # a tensor descriptor's tensor
            if arg_name in OUTPUTS and isinstance(a, torch.Tensor):
                a.zero_()
        return kernel

    token = _TARGET.set(sm)
    previous = drivers._active  # None until a launch asked for one (reset_active would make one: no GPU here)
    drivers.set_active(_PlanningDriver(sm))
    JITFunction.run = compile_only
    try:
        yield compiled
    finally:
        JITFunction.run = launch
        drivers._active = previous
        _TARGET.reset(token)


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def _resources(cubin: bytes) -> dict[str, int]:
    """``cuobjdump -res-usage``'s counts for the cubin's one function: REG, STACK, LOCAL, ... (its
    SHARED is the 1 KiB per block the system reserves, not the kernel's)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_cuobjdump(), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    return {k: int(v) for k, v in (field.split(":") for field in line.split() if ":" in field and field.split(":")[1].isdigit())}


def _mma_family(ptx: str) -> str:
    if "tcgen05.mma" in ptx:
        return "tcgen05"
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if "mma.sync" in ptx:
        return "mma"
    return "none"


def inspect(kernel: Any) -> KernelReport:
    """What one compiled kernel uses and which instructions it was built from."""
    md = kernel.metadata
    res = _resources(kernel.asm["cubin"])
    ptx = kernel.asm["ptx"]
    fn = kernel.src.fn
    consts = {fn.arg_names[path[0]]: v for path, v in kernel.src.constants.items() if len(path) == 1}
    consts = {k: v for k, v in consts.items() if isinstance(v, (bool, int, float, str))}
    return KernelReport(
        kernel=fn.__name__, sm=int(md.target.arch), constexprs=consts, num_warps=md.num_warps,
        num_stages=md.num_stages, shared=int(md.shared), registers=res["REG"],
        spill_bytes=res.get("LOCAL", 0) + res.get("STACK", 0), mma=_mma_family(ptx),
        fp8_mma=any("mma" in ln and (".e4m3" in ln or "kind::f8f6f4" in ln) for ln in ptx.splitlines()),
        fp_fusion=bool(md.enable_fp_fusion), tma="cp.async.bulk.tensor" in ptx,
    )
