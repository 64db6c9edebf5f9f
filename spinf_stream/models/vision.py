"""The picture path of multimodal checkpoints: a picture → the soft tokens its decoder reads as
content. Two families: Gemma 3 and Idefics3 (SmolVLM).

- :func:`gemma3_pixel_values`: Gemma 3's processor (transformers' ``Gemma3ImageProcessorPil``,
  pan-and-scan off, as Gemma 3's checkpoints ship it): a bilinear resize by Pillow to the tower's
  square size, ``x / 255`` rounded to float32, then ``(x - 0.5) / 0.5``.
- :func:`idefics3_tiles`: Idefics3's (``Idefics3ImageProcessorPil``): Lanczos resizes, tiles of
  the tower's size and a global view, normalised the same way.
- :class:`VisionTower`: the SigLIP vision encoder (patch convolution, learned positions,
  pre-norm layers of bidirectional attention and a tanh-GELU MLP, a final LayerNorm) and the
  family's projector: Gemma 3's (an average pool to ``mm_tokens_per_image`` tokens, Gemma's
  RMSNorm ``x * (1 + w)``, a linear map to the decoder's width) or Idefics3's (a pixel shuffle, a
  linear map). Sources: transformers' ``SiglipVisionModel``, ``Gemma3MultiModalProjector``,
  ``Idefics3VisionTransformer`` and ``Idefics3Connector``.
- :class:`ImageFormat`: what a prompt holds in a picture's place; :class:`ImageReader`: a tile →
  its soft tokens.

The tower reads one tile at a time: every shape is fixed by the config, so a tile's soft tokens
are the same bits whatever other pictures a message or batch holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # Pillow is imported where a picture is read: the decoder runs without it
    from PIL import Image

__all__ = [
    "GEMMA3_MARKERS", "IDEFICS3_MARKERS", "ImageFormat", "ImageReader", "SiglipLayer", "VisionTower", "gemma3_pixel_values",
    "idefics3_tiles", "processor_settings",
]


def gemma3_pixel_values(image: Image.Image, size: int) -> torch.Tensor:
    """``[3, size, size]`` float32 pixel values of an RGB ``image`` (Gemma 3's processor).

    Raises:
        ValueError: ``image`` is not RGB (see :func:`spinf_stream.images.decode_image`).
    """
    from PIL import Image

    if image.mode != "RGB":
        raise ValueError(f"an image reaches the tower as RGB, got mode {image.mode}")
    return _normalized(np.asarray(image.resize((size, size), Image.Resampling.BILINEAR)))  # [size, size, 3] uint8


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
    """A SigLIP vision tower and its projector to the decoder's width, fp32: Gemma 3's (an average
    pool, RMSNorm, a matrix) or Idefics3's / SmolVLM's (a pixel shuffle by ``scale_factor``, a
    linear map; ``scale_factor > 0``).

    Args:
        patch: ``[E, 3, P, P]`` and ``patch_bias [E]``: the patch convolution (stride ``P``).
        positions: ``[N, E]``, one per patch (``N = (image_size / P)²``); ``position_ids [N]``:
            which each patch takes (Idefics3's bucketed ids; ``None``: patch i takes row i).
        layers: the encoder's layers. post_norm: the final LayerNorm's weight and bias ``[E]``.
        soft_norm: ``[E]`` Gemma 3's projector RMSNorm weight (``1 + w``); ``None`` for Idefics3.
        projection: Gemma 3: ``[E, hidden]`` (``mm_input_projection_weight``); Idefics3:
            ``[hidden, E * scale_factor²]`` (``connector.modality_projection.proj.weight``).
        heads: attention heads; eps: the LayerNorms' and RMSNorm's epsilon;
        tokens_per_image: soft tokens per image (a square number).
    """

    patch: torch.Tensor
    patch_bias: torch.Tensor
    positions: torch.Tensor
    layers: list[SiglipLayer]
    post_norm: tuple[torch.Tensor, torch.Tensor]
    soft_norm: torch.Tensor | None
    projection: torch.Tensor
    heads: int
    eps: float
    tokens_per_image: int
    position_ids: torch.Tensor | None = None
    scale_factor: int = 0

    def to(self, device: torch.device | str) -> VisionTower:
        """This tower with every tensor on ``device`` (still fp32)."""
        move = lambda t: t.to(device)  # noqa: E731
        layers = [SiglipLayer(*(tuple(map(move, f)) if isinstance(f, tuple) else move(f)
                                for f in (ly.norm1, ly.qkv, ly.qkv_bias, ly.out, ly.out_bias, ly.norm2, ly.fc1, ly.fc1_bias,
                                          ly.fc2, ly.fc2_bias))) for ly in self.layers]
        return VisionTower(move(self.patch), move(self.patch_bias), move(self.positions), layers,
                           (move(self.post_norm[0]), move(self.post_norm[1])),
                           None if self.soft_norm is None else move(self.soft_norm), move(self.projection), self.heads,
                           self.eps, self.tokens_per_image,
                           None if self.position_ids is None else move(self.position_ids), self.scale_factor)

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
        h = x.flatten(2).transpose(1, 2)[0]  # [N, E]
        h = h + (self.positions if self.position_ids is None else self.positions[self.position_ids])
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
        if self.scale_factor:  # Idefics3's pixel shuffle (its ``Idefics3Connector.pixel_shuffle``), then a linear map
            f, n = self.scale_factor, h.shape[0]
            x = h.view(side, side // f, e * f).permute(1, 0, 2).reshape(side // f, side // f, e * f * f)
            return F.linear(x.permute(1, 0, 2).reshape(n // (f * f), e * f * f), self.projection)
        assert self.soft_norm is not None
        per_side = int(round(self.tokens_per_image**0.5))
        grid = h.transpose(0, 1).reshape(1, e, side, side)
        pooled = F.avg_pool2d(grid, kernel_size=side // per_side, stride=side // per_side).flatten(2)[0].T  # [T, E]
        normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.soft_norm)
        return normed @ self.projection

    @classmethod
    def from_idefics3_state_dict(cls, state: Mapping[str, torch.Tensor], heads: int, eps: float,
                                 scale_factor: int) -> VisionTower:
        """The tower of an Idefics3 / SmolVLM checkpoint (``model.vision_model.…``,
        ``model.connector.modality_projection.proj.weight``), fp32; a full tile's patch position
        ids as its ``Idefics3VisionEmbeddings`` buckets them.

        Raises:
            KeyError: naming the first tensor the checkpoint lacks.
        """
        v = next((t for t in ("model.vision_model.", "vision_model.") if f"{t}embeddings.patch_embedding.weight" in state),
                 "model.vision_model.")
        proj = next((p for p in ("model.connector.", "connector.") if f"{p}modality_projection.proj.weight" in state),
                    "model.connector.")
        get = _getter(state, "an Idefics3 vision tower's")
        n_side = int(round(get(v + "embeddings.position_embedding.weight").shape[0] ** 0.5))
        boundaries = torch.arange(1 / n_side, 1.0, 1 / n_side)
        coords = torch.clamp(torch.arange(n_side, dtype=torch.float32) * (1.0 / torch.tensor(n_side)), max=1.0 - 1e-6)
        bucket = torch.bucketize(coords, boundaries, right=True)
        ids = (bucket[:, None] * n_side + bucket[None, :]).reshape(-1)
        return cls(*_siglip(state, v, get), soft_norm=None, projection=get(proj + "modality_projection.proj.weight"),
                   heads=heads, eps=eps, tokens_per_image=n_side * n_side // (scale_factor * scale_factor),
                   position_ids=ids, scale_factor=scale_factor)

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
        get = _getter(state, "a Gemma 3 vision tower's")
        return cls(*_siglip(state, v, get), soft_norm=get(projector + "mm_soft_emb_norm.weight"),
                   projection=get(projector + "mm_input_projection_weight"), heads=heads, eps=eps,
                   tokens_per_image=tokens_per_image)


def _getter(state: Mapping[str, torch.Tensor], whose: str) -> Callable[[str], torch.Tensor]:
    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"the checkpoint has no tensor {name!r} ({whose})")
        return state[name].float()

    return get


def _siglip(state: Mapping[str, torch.Tensor], v: str, get: Callable[[str], torch.Tensor]) -> tuple:
    """``(patch, patch_bias, positions, layers, post_norm)`` of the SigLIP encoder under prefix ``v``."""
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
        get(f"{v}encoder.layers.0.layer_norm1.weight")  # raises, naming it
    return (get(v + "embeddings.patch_embedding.weight"), get(v + "embeddings.patch_embedding.bias"),
            get(v + "embeddings.position_embedding.weight"), layers,
            (get(v + "post_layernorm.weight"), get(v + "post_layernorm.bias")))


#: Gemma 3's image markers (transformers' ``Gemma3Processor``: ``boi_token``, ``image_token``,
#: ``eoi_token``); a prompt's image reads ``"\n\n" + boi + tokens_per_image × image + eoi + "\n\n"``.
GEMMA3_MARKERS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
#: Idefics3's (``Idefics3Processor``): ``fake_image_token``, ``image_token``, ``global_image_tag``
IDEFICS3_MARKERS = ("<fake_token_around_image>", "<image>", "<global-img>")
#: The most pixels on a side Idefics3's processor resizes to (its ``MAX_IMAGE_SIZE``)
IDEFICS3_MAX_SIDE = 4096


@dataclass(frozen=True)
class ImageFormat:
    """What a prompt holds in a picture's place and the pixel values its tower reads, from the
    config and the processor's settings alone (no weights).

    ``family``: ``gemma3`` or ``idefics3``. ``image_token_id``: the soft-token placeholder's id,
    ``tokens_per_image`` of them per tile, each row's embedding replaced by the tower's output.
    ``bidirectional``: a tile's rows see each other both ways (Gemma 3: transformers'
    ``token_type_ids`` block mask); else causal (Idefics3). ``tile``: pixels on a tile's side.
    ``longest_edge``, ``split``: Idefics3's processor ``size["longest_edge"]`` and
    ``do_image_splitting``. ``markers``: the token strings the tokenizer must know, with the ids
    the config gives them.
    """

    family: str
    image_token_id: int
    tokens_per_image: int
    markers: tuple[tuple[str, int], ...]
    bidirectional: bool
    tile: int
    longest_edge: int = 0
    split: bool = False

    def text(self, rows: int = 0, cols: int = 0) -> str:
        """The prompt text standing for a picture cut into ``rows`` × ``cols`` tiles (0 × 0: one)
        and, for Idefics3, its global view (transformers' processors' expansion)."""
        n = self.tokens_per_image
        if self.family == "gemma3":
            boi, image, eoi = GEMMA3_MARKERS
            return f"\n\n{boi}{image * n}{eoi}\n\n"
        fake, image, glob = IDEFICS3_MARKERS
        whole = f"{fake}{glob}{image * n}{fake}"
        if not rows and not cols:
            return whole
        grid = "".join("".join(f"{fake}<row_{r + 1}_col_{c + 1}>{image * n}" for c in range(cols)) + "\n"
                       for r in range(rows))
        return f"{grid}\n{whole}"

    def read(self, image: Image.Image) -> tuple[str, list[torch.Tensor]]:
        """A picture's prompt text and its tiles' pixel values (``[3, tile, tile]`` float32 each, in
        the text's order), as the family's processor makes them (the PIL image processors)."""
        if self.family == "gemma3":
            return self.text(), [gemma3_pixel_values(image, self.tile)]
        rows, cols, tiles = idefics3_tiles(image, self.longest_edge, self.tile, self.split)
        return self.text(rows, cols), tiles

    @classmethod
    def from_config(cls, config: object, processor: Mapping[str, object] | None = None) -> ImageFormat | None:
        """The format of a ``Gemma3ForConditionalGeneration`` or ``Idefics3ForConditionalGeneration``
        config (``processor``: the checkpoint's image processor settings, :func:`processor_settings`,
        for Idefics3's sizes); ``None`` for a text-only config.

        Raises:
            ValueError: processor settings this module does not implement (named)."""
        vision = getattr(config, "vision_config", None)
        family = getattr(config, "model_type", None)
        if vision is None or family not in ("gemma3", "idefics3"):
            return None
        if family == "gemma3":
            _check_processor(processor or {}, "gemma3")
            n = int(config.mm_tokens_per_image)  # type: ignore[attr-defined]
            ids = (int(config.boi_token_index), int(config.image_token_index), int(config.eoi_token_index))  # type: ignore[attr-defined]
            return cls("gemma3", ids[1], n, tuple(zip(GEMMA3_MARKERS, ids)), True, int(vision.image_size))
        p = dict(processor or {})
        _check_processor(p, "idefics3")
        tile = int(vision.image_size)
        per_side = int(vision.image_size) // int(vision.patch_size) // int(config.scale_factor)  # type: ignore[attr-defined]
        longest = int((p.get("size") or {}).get("longest_edge", 4 * tile))  # type: ignore[union-attr]
        return cls("idefics3", int(config.image_token_id), per_side * per_side,  # type: ignore[attr-defined]
                   ((IDEFICS3_MARKERS[1], int(config.image_token_id)),), False, tile,  # type: ignore[attr-defined]
                   longest_edge=longest, split=bool(p.get("do_image_splitting", True)))


def _normalized(rgb: np.ndarray) -> torch.Tensor:
    """``[3, H, W]`` float32 of ``rgb [H, W, 3]`` uint8: ``x / 255`` (in float64, then float32),
    then ``(x - 0.5) / 0.5`` (transformers' ``rescale`` and ``normalize`` with mean = std = 0.5)."""
    x = (rgb.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


def idefics3_tiles(image: Image.Image, longest_edge: int, tile: int, split: bool) -> tuple[int, int, list[torch.Tensor]]:
    """Idefics3's processor (``Idefics3ImageProcessorPil``) on an RGB picture: its longest edge
    resized to ``longest_edge`` (Lanczos, the other side even), then (``split``) to multiples of
    ``tile`` and cut into ``rows`` × ``cols`` tiles row by row, with the whole picture resized to
    ``tile`` × ``tile`` last; or, without splitting, the picture resized to one tile.
    Returns ``(rows, cols, [3, tile, tile] float32 tiles)``; ``rows = cols = 0`` for one tile."""
    from PIL import Image

    lanczos = Image.Resampling.LANCZOS
    w, h = image.size
    aspect = w / h
    if w >= h:  # _resize_output_size_rescale_to_max_len
        w, h = longest_edge, int(longest_edge / aspect)
        h += h % 2
    else:
        h, w = longest_edge, int(longest_edge * aspect)
        w += w % 2
    h, w = max(h, 1), max(w, 1)
    aspect = w / h
    if w >= h and w > IDEFICS3_MAX_SIDE:  # _resize_output_size_scale_below_upper_bound
        w, h = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE / aspect)
    elif h > w and h > IDEFICS3_MAX_SIDE:
        h, w = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE * aspect)
    img = image.resize((max(w, 1), max(h, 1)), lanczos)
    if not split:
        return 0, 0, [_normalized(np.asarray(img.resize((tile, tile), lanczos)))]
    w, h = img.size
    aspect = w / h
    if w >= h:  # resize_for_vision_encoder
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / aspect) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * aspect) / tile) * tile
    img = img.resize((w, h), lanczos)
    if h <= tile and w <= tile:
        return 0, 0, [_normalized(np.asarray(img))]
    rows, cols = (h - tile) // tile + 1, (w - tile) // tile + 1
    pixels = np.asarray(img)
    tiles = [_normalized(pixels[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile]) for r in range(rows) for c in range(cols)]
    tiles.append(_normalized(np.asarray(img.resize((tile, tile), lanczos))))
    return rows, cols, tiles


@dataclass
class ImageReader:
    """A multimodal checkpoint's tile → soft tokens: its :class:`ImageFormat` and tower."""

    format: ImageFormat
    tower: VisionTower

    def soft_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[tokens_per_image, hidden]`` fp32 of one tile's pixel values ``[3, S, S]``
        (:meth:`ImageFormat.read`)."""
        return self.tower.soft_tokens(pixels)

    @classmethod
    def from_config(cls, config: object, state: Mapping[str, torch.Tensor],
                    processor: Mapping[str, object] | None = None) -> ImageReader | None:
        """The reader of a multimodal config (:meth:`ImageFormat.from_config`) and its tensors;
        ``None`` for a text-only model.

        Raises:
            KeyError: a tower tensor the checkpoint lacks (named).
        """
        fmt = ImageFormat.from_config(config, processor)
        if fmt is None:
            return None
        vision = config.vision_config  # type: ignore[attr-defined]
        heads, eps = int(vision.num_attention_heads), float(getattr(vision, "layer_norm_eps", 1e-6))
        if fmt.family == "idefics3":
            tower = VisionTower.from_idefics3_state_dict(state, heads, eps, int(config.scale_factor))  # type: ignore[attr-defined]
        else:
            tower = VisionTower.from_state_dict(state, heads, eps, fmt.tokens_per_image)
        return cls(fmt, tower)


def processor_settings(path: Path) -> dict[str, object]:
    """A checkpoint directory's image processor settings: its ``preprocessor_config.json``, or
    the ``image_processor`` of the ``processor_config.json`` transformers 5 writes (``{}``
    without either)."""
    import json

    for name, key in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        f = Path(path) / name
        if f.exists():
            got = json.loads(f.read_text(encoding="utf-8"))
            got = got.get(key, {}) if key else got
            return got if isinstance(got, dict) else {}
    return {}


def _check_processor(p: Mapping[str, object], family: str) -> None:
    """The settings this module implements: mean and std 0.5 per channel, the family's resampling
    (Gemma 3: bilinear, 2; Idefics3: Lanczos, 1), no pan-and-scan.

    Raises:
        ValueError: naming the setting the checkpoint's processor has otherwise.
    """
    want = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2 if family == "gemma3" else 1,
            "do_pan_and_scan": False}
    for key, value in want.items():
        got = p.get(key)
        if got is not None and got != value and not (key == "do_pan_and_scan" and got is None):
            raise ValueError(f"the checkpoint's image processor has {key} = {got!r}; the engine reads pictures with "
                             f"{key} = {value!r} only")
