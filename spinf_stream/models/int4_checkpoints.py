"""GPTQ and AWQ int4 checkpoints: their ``quantization_config`` checked, their packed weights
unpacked and dequantized on load.

A linear layer ``<name>`` of such a checkpoint is stored as ``<name>.qweight`` (int32, eight
4-bit values per word, lowest bits first), ``<name>.qzeros`` (int32, packed the same way along the
output channels) and ``<name>.scales`` (fp16 ``[groups, out]``); GPTQ adds ``<name>.g_idx``
(int32 ``[in]``, the group of each input channel). The definitions followed:

- GPTQ (Frantar et al. 2022; the AutoGPTQ / GPTQModel file format, ``checkpoint_format`` ``gptq``):
  ``qweight [in / 8, out]`` packed along the input channels, value ``k`` of column ``n`` in bits
  ``4 * (k % 8)`` of word ``[k // 8, n]``; ``qzeros [groups, out / 8]`` packed along the output
  channels and stored minus one (zero ``z`` is written ``z - 1``); ``gptq_v2`` stores ``z``
  itself. ``w[n, k] = scales[g, n] * (q[k, n] - z[g, n])`` with ``g = g_idx[k]`` (``desc_act``
  checkpoints permute the groups; ``g_idx`` says where each channel went). Symmetric checkpoints
  store ``z = 8``.
- AWQ, GEMM layout (Lin et al. 2023; the AutoAWQ ``WQLinear_GEMM`` format, ``version: gemm``):
  ``qweight [in, out / 8]`` and ``qzeros [groups, out / 8]`` packed along the output channels in
  the interleaved order ``0, 2, 4, 6, 1, 3, 5, 7`` (nibble ``i`` of word ``c`` holds channel
  ``8c + order[i]``); ``w[n, k] = scales[k // group, n] * (q[k, n] - z[k // group, n])``.

What the engine does with them: dequantized at load, exactly (a 4-bit difference times an fp16
scale is exact in fp32), then stored as every other checkpoint's weights in the pass's dtype
(float32, bfloat16; ``--dtype int8``/``fp8`` quantize them again per output channel). No W4A16
kernel: the weights take 4x the int4 size in memory in bfloat16 (8x in float32).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .convert import ModelLoadError

__all__ = ["AWQ_ORDER", "Int4Format", "dequantize_awq", "dequantize_gptq", "dequantize_state_dict", "int4_format"]

#: Output channel of each nibble of an AWQ (GEMM layout) word, lowest nibble first.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: ``quantization_config`` methods read here.
METHODS = ("gptq", "awq")


@dataclass(frozen=True)
class Int4Format:
    """A checkpoint's ``quantization_config``, checked: ``method`` ``gptq`` or ``awq``;
    ``group_size`` input channels per scale (``-1``: one group per output channel);
    ``zeros_minus_one``: GPTQ's v1 files store each zero point minus one."""

    method: str
    group_size: int
    zeros_minus_one: bool


def _refuse(where: Path, key: str, value: Any, allowed: str) -> ModelLoadError:
    return ModelLoadError(f"{where}: quantization_config.{key} = {value!r} is not supported; {allowed}")


def int4_format(config_path: Path) -> Int4Format | None:
    """The checkpoint's int4 format from its ``config.json``, or ``None`` when it has no
    ``quantization_config``.

    Raises:
        ModelLoadError: a ``quantization_config`` this engine does not read (another method,
            another bit width, AWQ other than the GEMM layout, GPTQ of an unknown
            ``checkpoint_format``), naming the file, the key and what is supported.
    """
    config = json.loads(config_path.read_text(encoding="utf-8"))
    q = config.get("quantization_config") if isinstance(config, dict) else None
    if q is None:
        return None
    if not isinstance(q, dict):
        raise _refuse(config_path, "", q, "expected an object")
    method = str(q.get("quant_method", "")).lower()
    if method not in METHODS:
        raise _refuse(config_path, "quant_method", q.get("quant_method"),
                      "spinf-stream reads 4-bit gptq and awq checkpoints (or load an unquantized one with --dtype int8/fp8)")
    if q.get("bits") != 4:
        raise _refuse(config_path, "bits", q.get("bits"), f"{method} checkpoints are read with bits = 4 only")
    group = q.get("group_size", 128 if method == "awq" else -1)
    if group is None:
        group = -1
    if not isinstance(group, int) or not (group == -1 or group > 0):
        raise _refuse(config_path, "group_size", group, "use a positive group size or -1 (per channel)")
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise _refuse(config_path, "version", q.get("version"), "awq checkpoints are read in the GEMM layout only")
        if q.get("zero_point", True) is not True:
            raise _refuse(config_path, "zero_point", q.get("zero_point"), "awq checkpoints are read with zero points only")
        return Int4Format("awq", group, zeros_minus_one=False)
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(config_path, "checkpoint_format", q.get("checkpoint_format"), "use gptq or gptq_v2")
    return Int4Format("gptq", group, zeros_minus_one=fmt == "gptq")


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """``[..., w]`` int32 → ``[..., w, 8]`` int32: each word's eight 4-bit values, lowest bits first."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    return (words.to(torch.int32)[..., None] >> shifts) & 0xF


def dequantize_gptq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
    *, zeros_minus_one: bool, group_size: int = -1,
) -> torch.Tensor:
    """One GPTQ linear layer as its float weight ``[out, in]`` fp32 (see the module docstring).

    Args:
        qweight: ``[in / 8, out]`` int32. qzeros: ``[groups, out / 8]`` int32.
        scales: ``[groups, out]`` fp16 (or any float). g_idx: ``[in]`` int, or ``None`` for
            ``k // group_size`` (``group_size`` -1: one group).
        zeros_minus_one: the file stores each zero point minus one (``checkpoint_format: gptq``).

    Raises:
        ValueError: shapes that do not fit together (names them).
    """
    k8, out = qweight.shape
    k = k8 * 8
    q = _nibbles(qweight).permute(0, 2, 1).reshape(k, out)  # [in, out]
    z = _nibbles(qzeros).reshape(qzeros.shape[0], -1) + (1 if zeros_minus_one else 0)  # [groups, out]
    if z.shape[1] != out or scales.shape != z.shape:
        raise ValueError(f"gptq: qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)} and scales "
                         f"{tuple(scales.shape)} do not fit together")
    if g_idx is None:
        g_idx = torch.arange(k) // (k if group_size == -1 else group_size)
    g_idx = g_idx.long()
    if g_idx.shape != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= scales.shape[0]:
        raise ValueError(f"gptq: g_idx {tuple(g_idx.shape)} does not index {scales.shape[0]} groups of {k} inputs")
    w = (q - z[g_idx]).float() * scales.float()[g_idx]
    return w.t().contiguous()


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """One AWQ (GEMM layout) linear layer as its float weight ``[out, in]`` fp32.

    Args:
        qweight: ``[in, out / 8]`` int32. qzeros: ``[groups, out / 8]`` int32.
        scales: ``[groups, out]`` fp16. group_size: inputs per group (-1: one group).

    Raises:
        ValueError: shapes that do not fit together (names them).
    """
    order = torch.tensor(AWQ_ORDER)
    k = qweight.shape[0]

    def unpack(words: torch.Tensor) -> torch.Tensor:  # [rows, w] -> [rows, 8w] in channel order
        n = _nibbles(words)
        out = torch.empty_like(n)
        out[..., order] = n  # nibble i holds channel order[i] of its word
        return out.reshape(words.shape[0], -1)

    q, z = unpack(qweight), unpack(qzeros)
    groups = scales.shape[0]
    size = k if group_size == -1 else group_size
    if z.shape != scales.shape or q.shape[1] != scales.shape[1] or groups * size < k or (groups - 1) * size >= k:
        raise ValueError(f"awq: qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)} and scales "
                         f"{tuple(scales.shape)} do not fit together (group size {group_size})")
    g = torch.arange(k) // size
    w = (q - z[g]).float() * scales.float()[g]
    return w.t().contiguous()


def dequantize_state_dict(sd: dict[str, torch.Tensor], fmt: Int4Format, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``sd`` with every packed layer (``<name>.qweight`` and its ``qzeros``, ``scales``,
    ``g_idx``) replaced by ``<name>.weight [out, in]`` in ``dtype``, one layer at a time.

    Raises:
        ModelLoadError: a packed layer without its ``qzeros`` or ``scales``, or whose tensors do
            not fit together (names the layer).
    """
    out: dict[str, torch.Tensor] = {}
    packed = {name[: -len(".qweight")] for name in sd if name.endswith(".qweight")}
    parts = {f"{p}.{s}" for p in packed for s in ("qweight", "qzeros", "scales", "g_idx")}
    for name, t in sd.items():
        if name not in parts:
            out[name] = t
    for p in sorted(packed):
        missing = [s for s in ("qzeros", "scales") if f"{p}.{s}" not in sd]
        if missing:
            raise ModelLoadError(f"{fmt.method} layer {p}: no {' or '.join(f'{p}.{s}' for s in missing)}")
        try:
            if fmt.method == "gptq":
                w = dequantize_gptq(sd[f"{p}.qweight"], sd[f"{p}.qzeros"], sd[f"{p}.scales"], sd.get(f"{p}.g_idx"),
                                    zeros_minus_one=fmt.zeros_minus_one, group_size=fmt.group_size)
            else:
                w = dequantize_awq(sd[f"{p}.qweight"], sd[f"{p}.qzeros"], sd[f"{p}.scales"], fmt.group_size)
        except ValueError as e:
            raise ModelLoadError(f"{fmt.method} layer {p}: {e}") from None
        out[f"{p}.weight"] = w.to(dtype)
    return out
