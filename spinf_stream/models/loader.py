"""Loading a checkpoint as a :class:`~spinf_stream.models.decoder.Decoder`.

The state dict by
transformers' names, the layers assembled for the spec, fp8 or int8 quantization on load."""

from __future__ import annotations

from pathlib import Path

import torch

from .backend import choose, make_backend
from .decoder import Decoder, LayerWeights
from .ops import Backend, QuantizedWeight, Weight
from .registry import spec_for
from .spec import ModelSpec
from .vision import ImageReader, processor_settings

#: Largest normal float8 e4m3 value (OCP 8-bit floating point spec, 2023).
FP8_MAX = 448.0
#: Largest int8 magnitude of the symmetric int8 weights.
INT8_MAX = 127
#: ``dtype`` names whose linear weights are quantized on load (the rest of the pass in bfloat16).
QUANTIZED = ("fp8", "int8")


def _load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path``'s ``*.safetensors`` files by transformers' names (a multimodal
    checkpoint's text model under the plain names).

    Raises:
        FileNotFoundError: no ``*.safetensors`` file.
    """
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return text_names(sd)


def text_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` with a multimodal checkpoint's text model under the plain names (``model.layers...``);
    the vision tower's and projector's tensors keep theirs."""
    out = {}
    for name, t in sd.items():
        for p in ("model.language_model.", "language_model.model.", "language_model.", "model.text_model."):
            if name.startswith(p):
                name = "model." + name[len(p):] if not name[len(p):].startswith("lm_head") else name[len(p):]
                break
        out[name] = t
    return out


def quantize_fp8(weight: torch.Tensor) -> QuantizedWeight:
    """float8 e4m3 weights with one scale per output channel: ``scale[n] = max|w[n]| / 448``
    (448 = e4m3's largest normal), ``data = round(w / scale)``. ``weight [N, K]`` any float dtype."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    data = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return QuantizedWeight(data.contiguous(), scale.contiguous())


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """int8 weights with one scale per output channel (symmetric): ``scale[n] = max|w[n]| / 127``,
    ``data = round(w / scale)`` in [-127, 127]. ``weight [N, K]`` any float dtype."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX
    data = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return QuantizedWeight(data.contiguous(), scale.contiguous())


def build_decoder(
    spec: ModelSpec, sd: dict[str, torch.Tensor], *, dtype: torch.dtype | str, device: str | torch.device,
    backend: Backend | None = None,
) -> Decoder:
    """Assemble a :class:`Decoder` from a transformers-named state dict.

    ``dtype``: a torch float dtype, ``"fp8"`` or ``"int8"``: the linear layers' weights in float8
    e4m3 or int8 with per-output-channel scales (:func:`quantize_fp8`, :func:`quantize_int8`),
    everything else in bfloat16.

    Raises:
        KeyError: a weight the spec needs is missing (names it).
    """
    quantize = {"fp8": quantize_fp8, "int8": quantize_int8}.get(dtype) if isinstance(dtype, str) else None
    act_dtype = torch.bfloat16 if quantize else dtype

    def get(name: str) -> torch.Tensor:
        if name not in sd:
            raise KeyError(f"checkpoint has no weight {name!r}")
        return sd[name].to(device=device, dtype=act_dtype)

    def opt(name: str) -> torch.Tensor | None:
        return get(name) if name in sd else None

    def mat(*names: str) -> Weight:
        """One linear layer's weight (stacked when several names), quantized for fp8 and int8."""
        for n in names:
            if n not in sd:
                raise KeyError(f"checkpoint has no weight {n!r}")
        w = torch.cat([sd[n] for n in names]) if len(names) > 1 else sd[names[0]]
        if quantize:
            return quantize(w.to(device))
        return w.to(device=device, dtype=act_dtype).contiguous()

    layers = []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        bias = None
        if f"{p}self_attn.q_proj.bias" in sd:
            bias = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
        sandwich = spec.sandwich_norms
        layers.append(
            LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=mat(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                qkv_bias=bias,
                o=mat(p + "self_attn.o_proj.weight"),
                q_norm=opt(p + "self_attn.q_norm.weight") if spec.qk_norm else None,
                k_norm=opt(p + "self_attn.k_norm.weight") if spec.qk_norm else None,
                post_attn_norm=get(p + "post_attention_layernorm.weight") if sandwich else None,
                mlp_norm=get(p + ("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight")),
                post_mlp_norm=get(p + "post_feedforward_layernorm.weight") if sandwich else None,
                gate_up=mat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down=mat(p + "mlp.down_proj.weight"),
            )
        )
    embed = get("model.embed_tokens.weight")
    head = embed if spec.tie_embeddings or "lm_head.weight" not in sd else get("lm_head.weight")
    return Decoder(spec, embed, layers, get("model.norm.weight"), head, backend)


def load_decoder(
    path: str | Path, *, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
    kernels: str | None = None, threads: int | None = None,
) -> Decoder:
    """Load a Hugging Face directory (``config.json`` + ``*.safetensors``) as a :class:`Decoder`.

    ``kernels``: the back end (``torch``, ``triton``, ``cublas``); default
    :func:`spinf_stream.models.backend.choose` for ``device`` (honours ``SPINF_KERNELS``).
    ``threads``: the torch back end's compute workers (default
    :func:`spinf_stream.cpus.compute_threads`).

    A GPTQ or AWQ int4 checkpoint (``quantization_config``) is dequantized on load
    (:mod:`spinf_stream.models.int4_checkpoints`).

    Raises:
        UnsupportedModel: unknown family. FileNotFoundError: no weights. KeyError: missing weight.
        ValueError: a back end that cannot run on ``device``. ModelLoadError: a
        ``quantization_config`` that is not read here (names the key), or packed tensors that do
        not fit together.
    """
    from transformers import AutoConfig

    from .int4_checkpoints import dequantize_state_dict, int4_format  # model files: not needed by build_decoder

    path = Path(path)
    backend = make_backend(choose(device, kernels, dtype), threads=threads)
    int4 = int4_format(path / "config.json")  # before the weights: a config we cannot read fails fast
    config = AutoConfig.from_pretrained(str(path))
    spec = spec_for(config)
    sd = _load_state_dict(path)
    if int4 is not None:
        # GPTQ/AWQ: unpacked and dequantized exactly, kept in the pass's weight dtype
        sd = dequantize_state_dict(sd, int4, dtype if isinstance(dtype, torch.dtype) else torch.bfloat16)
    decoder = build_decoder(spec, sd, dtype=dtype, device=device, backend=backend)
    reader = ImageReader.from_config(config, sd, processor_settings(path))  # fp32, on the decoder's device
    decoder.vision = None if reader is None else ImageReader(reader.format, reader.tower.to(device))
    return decoder
