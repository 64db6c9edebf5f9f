"""The interface every kernel back end implements.

The ops of a forward pass, the weights they
take, and what decides their bits.

The back ends are :class:`~spinf_stream.models.torch_backend.TorchBackend` (the CPU) and
:class:`~spinf_stream.models.triton_backend.TritonBackend` with its cuBLAS variant;
:mod:`spinf_stream.models.backend` chooses one by name when the model loads. After that every
difference between them is a method or a class attribute of theirs, never a name compared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

import torch

from spinf_stream.engine.layout import PassLayout
from . import blocks
from .attention import KV

#: Read rows whose logits are held at once (bounds the ``[rows, vocab]`` fp32 buffer).
HEAD_GROUP = 256

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear layer's weight quantized with one fp32 scale per output channel:
    ``weight ≈ data.float() * scale[:, None]``. ``data [N, K]`` float8_e4m3fn (``--dtype fp8``) or
    int8 (``--dtype int8``), ``scale [N]`` fp32."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


Weight = torch.Tensor | QuantizedWeight


@dataclass(frozen=True)
class QuantizedRows:
    """Activations a back end already quantized per row for a float8 linear layer (its norm wrote
    them so): ``rows ≈ data.float() * scale[:, None]``; ``data [M, K]`` float8_e4m3fn, ``scale
    [M]`` fp32, ``dtype`` the activations' own dtype (the layer's output dtype)."""

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


#: A linear layer's input: activations, or (a back end's own) rows quantized for it.
Activation = torch.Tensor | QuantizedRows


def weight_rows(w: Weight, t: slice) -> Weight:
    """Output rows ``t`` of a linear layer's weight ``[N, K]`` (a view; a quantized weight's scales too)."""
    return QuantizedWeight(w.data[t], w.scale[t]) if isinstance(w, QuantizedWeight) else w[t]


@dataclass(frozen=True)
class Numerics:
    """What decides the bits besides the model, its weights, the device and the dtype.

    ``isa``: the instruction-set class of torch's CPU kernels (``avx512``, ``avx2``, ...) or the
    CUDA architecture (``sm_90``). ``library``: the kernel libraries and versions. ``tiles``:
    the pass's fixed shapes. ``bits_probe``: ``passed``, ``failed`` (scores anyway, as
    ``--allow-unstable-bits`` asked) or ``not_needed`` (no vendor library decides a row's bits:
    the Triton kernels), ``not_run``.
    """

    isa: str
    library: str
    tiles: str
    bits_probe: str = "not_run"


class PassAttention(Protocol):
    """The attention of one pass; called once per layer (see
    :class:`~spinf_stream.models.attention.TorchAttention`)."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: KV | None, carried: list[KV],
        *, scale: float, window: int | None, softcap: float | None,
    ) -> torch.Tensor: ...


def apply_softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``tanh(logits / cap) * cap`` (``logits`` unchanged when ``cap`` is ``None``)."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


class Backend:
    """The ops of a forward pass; one subclass per back end.

    The decoder cuts a pass's rows with :meth:`row_chunks` and runs the token-wise ops of each
    chunk through :meth:`map`; every op of a chunk goes through :meth:`linear`,
    :meth:`rms_norm` and the shared blocks.
    """

    #: The back end's name: what ``--kernels``/``SPINF_KERNELS`` say and records write.
    name: ClassVar[str]
    #: Whether a row's bits rest on a vendor library's properties that the bits probe checks at
    #: load (:func:`spinf_stream.models.numerics.check_bits`).
    needs_bits_probe: ClassVar[bool] = False
    #: Whether no vendor library decides a row's bits (records say ``"bits_probe": "not_needed"``).
    invariant_by_construction: ClassVar[bool] = False
    #: Whether the back end fuses the layer's epilogues: :meth:`gated_linear` (the gated MLP's
    #: first half in one op), :meth:`add_linear` and :meth:`add_norm` (residual adds in the op
    #: that produces them). Else the decoder runs linear layers, activation and adds apart.
    fused_epilogues: ClassVar[bool] = False

    @classmethod
    def check(cls, device: torch.device, dtype: torch.dtype | str | None) -> None:
        """Refuse a ``device`` or activation ``dtype`` (``None``: not checked) it cannot run.

        Raises:
            ValueError: says what to change.
        """

    @classmethod
    def create(cls, *, threads: int | None = None) -> Backend:
        """A new back end; ``threads``: compute workers, for a back end that runs on them."""
        return cls()

    @classmethod
    def numerics(cls, device: torch.device, dtype: torch.dtype) -> Numerics:
        """What decides its bits on ``device`` with activations in ``dtype``; ``bits_probe`` as
        known before any probe runs."""
        raise NotImplementedError

    def row_chunks(self, n_rows: int, decode: bool = False) -> list[slice]:
        """How the token-wise ops cut ``n_rows`` rows: consecutive slices from 0; the last may end
        past ``n_rows`` (the caller pads its buffers to ``chunks[-1].stop`` rows). ``decode``: a
        pass of decode steps (one row per open extraction; :attr:`PassLayout.decode`)."""
        return [slice(0, n_rows)] if n_rows else []

    def column_tiles(self, n_out: int) -> list[slice]:
        """How a linear layer's ``n_out`` output columns are cut into GEMMs (consecutive slices)."""
        return [slice(0, n_out)]

    def tile_units(self, n_chunks: int) -> bool:
        """Whether a pass of ``n_chunks`` row chunks runs its linear layers as one unit per
        (row chunk, column tile) rather than one per row chunk (same ops, same bits)."""
        return False

    def map(self, fn: Callable[[T, blocks.Scratch | None], R], items: Sequence[T]) -> list[R]:
        """``[fn(item, scratch) for item in items]``: units of work that write disjoint rows."""
        return [fn(it, None) for it in items]

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ weight.T + bias``: ``x [M, K]``, ``weight [N, K]`` (float8 when a
        :class:`QuantizedWeight`) → ``[M, N]`` in ``x.dtype``. ``out``: a ``[M, N]`` buffer the
        back end may write into; use the returned tensor."""
        raise NotImplementedError

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
        """RMSNorm over the last dim of ``x [..., H]`` (see :func:`blocks.rms_norm`)."""
        raise NotImplementedError

    def norm_into(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, into: Weight) -> Activation:
        """:meth:`rms_norm` of ``x [M, H]`` as the input of the linear layer ``into``: a back end
        may return it already quantized for that layer (:class:`QuantizedRows`), which only its
        own :meth:`linear` and :meth:`gated_linear` read."""
        return self.rms_norm(x, weight, eps, offset)

    def gated_linear(self, x: Activation, weight: Weight, activation: str) -> torch.Tensor:
        """``act(x @ gate.T) * (x @ up.T)`` in one op (back ends with :attr:`fused_epilogues`):
        ``x [M, K]``, ``weight [2I, K]`` the gate's rows then the up projection's → ``[M, I]``
        in the activations' dtype."""
        raise NotImplementedError

    def add_linear(self, residual: torch.Tensor, x: Activation, weight: Weight) -> None:
        """``residual += x @ weight.T`` in place (:attr:`fused_epilogues`): ``residual [M, N]``,
        ``x [M, K]``, ``weight [N, K]``."""
        raise NotImplementedError

    def add_norm(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> None:
        """``residual += rms_norm(x)`` in place (:attr:`fused_epilogues`): both ``[M, H]``."""
        raise NotImplementedError

    def attention(self, layout: PassLayout, device: torch.device, group: int) -> PassAttention:
        """The attention of ``layout`` for ``group`` query heads per KV head (its plan moved to
        ``device`` once, here)."""
        raise NotImplementedError

    def token_logprobs(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor, tokens: torch.Tensor,
    ) -> torch.Tensor:
        """``[N]`` fp32 on the CPU: ``logits[rows, tokens] - logsumexp(logits[rows])`` with
        ``logits = softcap(hidden @ lm_head.T)`` in fp32 (natural log). ``hidden [R, H]``,
        ``lm_head [V, H]``, ``rows``/``tokens`` ``[N]`` int64."""
        raise NotImplementedError

    def read_logits(
        self, hidden: torch.Tensor, lm_head: torch.Tensor, softcap: float | None, rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The full-vocabulary logits ``[N, V]`` fp32 and their logsumexp ``[N]`` fp32 of hidden
        rows ``rows [N]`` int64, on the CPU: the numbers :meth:`token_logprobs` reads,
        ``logits[i, t] - lse[i]`` bitwise equal to its logprob of token ``t`` at ``rows[i]``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the back end's threads (if any)."""
