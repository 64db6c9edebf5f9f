"""Which kernel back end runs a forward pass, chosen once at load.

- ``torch`` (:class:`~spinf_stream.models.torch_backend.TorchBackend`, the CPU default);
- ``triton`` (:class:`~spinf_stream.models.triton_backend.TritonBackend`, CUDA always; CPU
  tensors under Triton's interpreter with ``SPINF_KERNELS=triton`` and ``TRITON_INTERPRET=1``);
- ``cublas`` (:class:`~spinf_stream.models.triton_backend.CublasBackend`, measuring only).

Each implements :class:`~spinf_stream.models.ops.Backend`; a name is looked up here, once.
"""

from __future__ import annotations

import os

import torch

from .ops import Backend
from .torch_backend import TorchBackend
from .triton_backend import CublasBackend, TritonBackend

#: Environment variable that selects the Triton kernels on CPU tensors (a fixed contract).
KERNELS_ENV = "SPINF_KERNELS"

_CLASSES: dict[str, type[Backend]] = {cls.name: cls for cls in (TorchBackend, TritonBackend, CublasBackend)}
BACKENDS = tuple(_CLASSES)


def backend_class(name: str) -> type[Backend]:
    """The back end called ``name``.

    Raises:
        ValueError: an unknown name.
    """
    if name not in _CLASSES:
        raise ValueError(f"unknown kernel back end {name!r}; use one of {', '.join(BACKENDS)}")
    return _CLASSES[name]


def choose(device: torch.device | str, requested: str | None = None, dtype: torch.dtype | str | None = None) -> str:
    """The back end for ``device``: ``requested`` if given, else ``triton`` on CUDA, else
    ``triton`` when ``SPINF_KERNELS=triton``, else ``torch``. ``dtype``: the activations' dtype
    (``None``: not checked).

    Raises:
        ValueError: an unknown name, or a back end that cannot run on ``device`` in ``dtype``
            (its :meth:`~spinf_stream.models.ops.Backend.check` says why).
    """
    dev = torch.device(device)
    env = os.environ.get(KERNELS_ENV, "").strip().lower() or None
    name = requested or env or ("triton" if dev.type == "cuda" else "torch")
    if name not in _CLASSES:
        raise ValueError(f"{KERNELS_ENV}={name!r} is not a kernel back end; use one of {', '.join(BACKENDS)}")
    _CLASSES[name].check(dev, dtype)
    return name


def make_backend(name: str, *, threads: int | None = None) -> Backend:
    """The back end called ``name`` (``threads``: the torch back end's compute workers).

    Raises:
        ValueError: an unknown name.
    """
    return backend_class(name).create(threads=threads)
