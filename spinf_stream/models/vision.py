"""Gemma 3's image path: a picture → the soft tokens its decoder reads as content.

- :func:`gemma3_pixel_values`: the processor's steps (transformers' ``Gemma3ImageProcessorPil``,
  pan-and-scan off, as Gemma 3's checkpoints ship it): a bilinear resize by Pillow to the tower's
  square size, ``x / 255`` rounded to float32, then ``(x - 0.5) / 0.5``.
- :class:`VisionTower`: the SigLIP vision encoder (patch convolution, learned positions,
  pre-norm layers of bidirectional attention and a tanh-GELU MLP, a final LayerNorm) and Gemma 3's
  projector (an average pool to ``mm_tokens_per_image`` tokens, Gemma's RMSNorm ``x * (1 + w)``,
  a linear map to the decoder's width). Sources: transformers' ``SiglipVisionModel`` and
  ``Gemma3MultiModalProjector``.

The tower reads one image at a time: every shape is fixed by the config, so an image's soft
tokens are the same bits whatever other images a message or batch holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # Pillow is imported where a picture is read: the decoder runs without it
    from PIL import Image

__all__ = ["GEMMA3_MARKERS", "ImageFormat", "ImageReader", "SiglipLayer", "VisionTower", "gemma3_pixel_values"]


def gemma3_pixel_values(image: Image.Image, size: int) -> torch.Tensor:
    """``[3, size, size]`` float32 pixel values of an RGB ``image`` (Gemma 3's processor).

    Raises:
        ValueError: ``image`` is not RGB (see :func:`spinf_stream.images.decode_image`).
    """
    from PIL import Image

    if image.mode != "RGB":
        raise ValueError(f"an image reaches the tower as RGB, got mode {image.mode}")
    resized = np.asarray(image.resize((size, size), Image.Resampling.BILINEAR))  # [size, size, 3] uint8
    x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


@dataclass
class SiglipLayer:
    """One encoder layer's tensors (transformers names): ``layer_norm1/2`` weight and bias
    ``[E]``; ``qkv [3E, E]``, ``qkv_bias [3E]`` (q_proj, k_proj, v_proj stacked); ``out [E, E]``,
    ``out_bias [E]`` (out_proj); ``fc1 [I, E]``, ``fc1_bias [I]``, ``fc2 [E, I]``, ``fc2_bias [E]``."""

    norm1: tuple[torch.Tensor, torch.Tensor]
    qkv: torch.Tensor
    qkv_bias: torch.Tensor
    out: torch.Tensor
    out_bias: torch.Tensor
    norm2: tuple[torch.Tensor, torch.Tensor]
    fc1: torch.Tensor
    fc1_bias: torch.Tensor
    fc2: torch.Tensor
    fc2_bias: torch.Tensor


@dataclass
class VisionTower:
    """Gemma 3's vision tower and projector, fp32.

    Args:
        patch: ``[E, 3, P, P]`` and ``patch_bias [E]``: the patch convolution (stride ``P``).
        positions: ``[N, E]``, one per patch (``N = (image_size / P)²``).
        layers: the encoder's layers. post_norm: the final LayerNorm's weight and bias ``[E]``.
        soft_norm: ``[E]`` the projector's RMSNorm weight (Gemma's ``1 + w``).
        projection: ``[E, hidden]`` (``mm_input_projection_weight``).
        heads: attention heads; eps: the LayerNorms' and RMSNorm's epsilon;
        tokens_per_image: soft tokens per image (a square number).
    """

    patch: torch.Tensor
    patch_bias: torch.Tensor
    positions: torch.Tensor
    layers: list[SiglipLayer]
    post_norm: tuple[torch.Tensor, torch.Tensor]
    soft_norm: torch.Tensor
    projection: torch.Tensor
    heads: int
    eps: float
    tokens_per_image: int

    def to(self, device: torch.device | str) -> VisionTower:
        """This tower with every tensor on ``device`` (still fp32)."""
        move = lambda t: t.to(device)  # noqa: E731
        layers = [SiglipLayer(*(tuple(map(move, f)) if isinstance(f, tuple) else move(f)
                                for f in (ly.norm1, ly.qkv, ly.qkv_bias, ly.out, ly.out_bias, ly.norm2, ly.fc1, ly.fc1_bias,
                                          ly.fc2, ly.fc2_bias))) for ly in self.layers]
        return VisionTower(move(self.patch), move(self.patch_bias), move(self.positions), layers,
                           (move(self.post_norm[0]), move(self.post_norm[1])), move(self.soft_norm),
                           move(self.projection), self.heads, self.eps, self.tokens_per_image)

    @property
    def image_size(self) -> int:
        """Pixels on each side of the tower's input."""
        return int(round(self.positions.shape[0] ** 0.5)) * self.patch.shape[-1]

    @torch.inference_mode()
    def soft_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[tokens_per_image, hidden]`` fp32 soft tokens of one image's ``[3, S, S]`` pixel values.

        Raises:
            ValueError: pixel values of another shape than ``[3, image_size, image_size]``.
        """
        s = self.image_size
        if tuple(pixel_values.shape) != (3, s, s):
            raise ValueError(f"pixel values must be [3, {s}, {s}], got {list(pixel_values.shape)}")
        e = self.patch.shape[0]
        x = F.conv2d(pixel_values[None].float().to(self.patch.device), self.patch, self.patch_bias, stride=self.patch.shape[-1])
        side = x.shape[-1]
        h = x.flatten(2).transpose(1, 2)[0] + self.positions  # [N, E]
        d = e // self.heads
        for layer in self.layers:
            a = F.layer_norm(h, (e,), *layer.norm1, eps=self.eps)
            q, k, v = F.linear(a, layer.qkv, layer.qkv_bias).view(-1, 3, self.heads, d).permute(1, 2, 0, 3)
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], scale=d**-0.5)[0]  # [heads, N, d]
            h = h + F.linear(o.transpose(0, 1).reshape(-1, e), layer.out, layer.out_bias)
            m = F.layer_norm(h, (e,), *layer.norm2, eps=self.eps)
            m = F.gelu(F.linear(m, layer.fc1, layer.fc1_bias), approximate="tanh")
            h = h + F.linear(m, layer.fc2, layer.fc2_bias)
        h = F.layer_norm(h, (e,), *self.post_norm, eps=self.eps)
        per_side = int(round(self.tokens_per_image**0.5))
        grid = h.transpose(0, 1).reshape(1, e, side, side)
        pooled = F.avg_pool2d(grid, kernel_size=side // per_side, stride=side // per_side).flatten(2)[0].T  # [T, E]
        normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.soft_norm)
        return normed @ self.projection

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor], heads: int, eps: float, tokens_per_image: int) -> VisionTower:
        """The tower of a Gemma 3 checkpoint's tensors, as fp32, named as the checkpoints on disk
        name them (``vision_tower.vision_model.…``, ``multi_modal_projector.…``) or as
        transformers 5 does (``model.vision_tower.…``, ``model.multi_modal_projector.…``).

        Raises:
            KeyError: naming the first tensor the checkpoint lacks.
        """
        towers = ("vision_tower.vision_model.", "model.vision_tower.vision_model.", "model.vision_tower.", "vision_tower.")
        v = next((t for t in towers if f"{t}embeddings.patch_embedding.weight" in state), towers[0])
        projector = next((p for p in ("multi_modal_projector.", "model.multi_modal_projector.")
                          if f"{p}mm_input_projection_weight" in state), "multi_modal_projector.")

        def get(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"the checkpoint has no tensor {name!r} (a Gemma 3 vision tower's)")
            return state[name].float()

        layers = []
        while f"{v}encoder.layers.{len(layers)}.layer_norm1.weight" in state:
            p = f"{v}encoder.layers.{len(layers)}."
            attn = p + "self_attn."
            layers.append(SiglipLayer(
                norm1=(get(p + "layer_norm1.weight"), get(p + "layer_norm1.bias")),
                qkv=torch.cat([get(f"{attn}{n}_proj.weight") for n in "qkv"]),
                qkv_bias=torch.cat([get(f"{attn}{n}_proj.bias") for n in "qkv"]),
                out=get(attn + "out_proj.weight"), out_bias=get(attn + "out_proj.bias"),
                norm2=(get(p + "layer_norm2.weight"), get(p + "layer_norm2.bias")),
                fc1=get(p + "mlp.fc1.weight"), fc1_bias=get(p + "mlp.fc1.bias"),
                fc2=get(p + "mlp.fc2.weight"), fc2_bias=get(p + "mlp.fc2.bias"),
            ))
        if not layers:
            raise KeyError(f"the checkpoint has no tensor {v}encoder.layers.0.layer_norm1.weight (a Gemma 3 vision tower's)")
        return cls(
            patch=get(v + "embeddings.patch_embedding.weight"), patch_bias=get(v + "embeddings.patch_embedding.bias"),
            positions=get(v + "embeddings.position_embedding.weight"), layers=layers,
            post_norm=(get(v + "post_layernorm.weight"), get(v + "post_layernorm.bias")),
            soft_norm=get(projector + "mm_soft_emb_norm.weight"),
            projection=get(projector + "mm_input_projection_weight"),
            heads=heads, eps=eps, tokens_per_image=tokens_per_image,
        )


#: Gemma 3's image markers (transformers' ``Gemma3Processor``: ``boi_token``, ``image_token``,
#: ``eoi_token``); a prompt's image reads ``"\n\n" + boi + tokens_per_image × image + eoi + "\n\n"``.
GEMMA3_MARKERS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")


@dataclass(frozen=True)
class ImageFormat:
    """What a prompt holds in a picture's place, read from the config alone (no weights).

    ``text``: the prompt text standing for one image (the processor's ``full_image_sequence``);
    ``image_token_id``: the soft-token placeholder's id, ``tokens_per_image`` of them per image,
    each row's embedding replaced by the tower's output (unscaled) and attending to its whole
    image (transformers' ``token_type_ids`` block mask); ``markers``: the token strings the
    tokenizer must know, with the ids the config gives them.
    """

    text: str
    image_token_id: int
    tokens_per_image: int
    markers: tuple[tuple[str, int], ...]

    @classmethod
    def from_config(cls, config: object) -> ImageFormat | None:
        """A ``Gemma3ForConditionalGeneration`` config's format; ``None`` without a ``vision_config``."""
        if getattr(config, "vision_config", None) is None or getattr(config, "model_type", None) != "gemma3":
            return None
        n = int(config.mm_tokens_per_image)  # type: ignore[attr-defined]
        boi, image, eoi = GEMMA3_MARKERS
        ids = (int(config.boi_token_index), int(config.image_token_index), int(config.eoi_token_index))  # type: ignore[attr-defined]
        return cls(f"\n\n{boi}{image * n}{eoi}\n\n", ids[1], n, tuple(zip(GEMMA3_MARKERS, ids)))


@dataclass
class ImageReader:
    """A multimodal checkpoint's picture → soft tokens: its :class:`ImageFormat` and tower."""

    format: ImageFormat
    tower: VisionTower

    def soft_tokens(self, image: Image.Image | torch.Tensor) -> torch.Tensor:
        """``[tokens_per_image, hidden]`` fp32 of an RGB picture (:func:`gemma3_pixel_values`), or
        of its pixel values ``[3, S, S]`` already made."""
        if isinstance(image, torch.Tensor):
            return self.tower.soft_tokens(image)
        return self.tower.soft_tokens(gemma3_pixel_values(image, self.tower.image_size))

    @classmethod
    def from_config(cls, config: object, state: Mapping[str, torch.Tensor]) -> ImageReader | None:
        """The reader of a ``Gemma3ForConditionalGeneration`` config and its tensors; ``None``
        for a config without a ``vision_config`` (a text-only model).

        Raises:
            KeyError: a tower tensor the checkpoint lacks (named).
        """
        fmt = ImageFormat.from_config(config)
        if fmt is None:
            return None
        vision = config.vision_config  # type: ignore[attr-defined]
        heads, eps = int(vision.num_attention_heads), float(vision.layer_norm_eps)
        return cls(fmt, VisionTower.from_state_dict(state, heads, eps, fmt.tokens_per_image))
