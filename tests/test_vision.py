"""Gemma 3's image path against transformers on a random-weight model of the real architecture
(a small config, as transformers' own Gemma 3 tests build): the processor's pixel values from the
same picture, and the tower's soft tokens from the same pixel values."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from spinf_stream.images import decode_image
from spinf_stream.models.vision import VisionTower, gemma3_pixel_values

IMAGE_SIZE = 20


@pytest.fixture(scope="module")
def gemma3():
    """transformers' ``Gemma3ForConditionalGeneration`` of a small config, random weights (seeded)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    config = Gemma3Config(
        text_config={"vocab_size": 300, "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 24},
        vision_config={"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": IMAGE_SIZE, "patch_size": 5, "layer_norm_eps": 1e-6},
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projector starts at zeros: give it weights that show a wrong one
        model.model.multi_modal_projector.mm_input_projection_weight.normal_()
        model.model.multi_modal_projector.mm_soft_emb_norm.weight.normal_()
    return model


def tower_of(model) -> VisionTower:
    cfg = model.config
    return VisionTower.from_state_dict(model.state_dict(), cfg.vision_config.num_attention_heads,
                                       cfg.vision_config.layer_norm_eps, cfg.mm_tokens_per_image)


def picture(seed: int, size: tuple[int, int] = (37, 23)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("size", [(37, 23), (20, 20), (3, 90), (400, 300)])
def test_pixel_values_equal_the_gemma3_processors(size):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    buf = io.BytesIO()
    picture(1, size).save(buf, format="PNG")
    img = decode_image(buf.getvalue(), "photo")
    want = processor(images=img, return_tensors="pt")["pixel_values"][0]
    got = gemma3_pixel_values(img, IMAGE_SIZE)
    assert got.dtype == torch.float32 and got.shape == (3, IMAGE_SIZE, IMAGE_SIZE)
    assert torch.equal(got, want)


def test_soft_tokens_equal_transformers_image_features(gemma3):
    tower = tower_of(gemma3)
    assert tower.image_size == IMAGE_SIZE
    pixels = torch.stack([gemma3_pixel_values(picture(s), IMAGE_SIZE) for s in range(3)])
    with torch.no_grad():
        want = gemma3.model.get_image_features(pixel_values=pixels).pooler_output  # [3, 4, 48]
    for i in range(3):
        got = tower.soft_tokens(pixels[i])
        assert got.shape == (4, 48)
        torch.testing.assert_close(got, want[i], atol=1e-5, rtol=1e-5)


def test_an_images_soft_tokens_do_not_depend_on_other_images(gemma3):
    tower = tower_of(gemma3)
    pixels = [gemma3_pixel_values(picture(s), IMAGE_SIZE) for s in range(4)]
    alone = [tower.soft_tokens(p) for p in pixels]
    assert all(torch.equal(tower.soft_tokens(p), a) for p, a in zip(reversed(pixels), reversed(alone)))
    assert not torch.equal(alone[0], alone[1])


def test_the_checkpoints_names_on_disk_load_the_same_tower(gemma3):
    """Gemma 3's files name the tower ``vision_tower.vision_model.…`` (transformers 5 maps them to
    ``model.vision_tower.…`` on load): both load the same tensors."""
    on_disk = {k.removeprefix("model.").replace("vision_tower.", "vision_tower.vision_model.", 1): v
               for k, v in gemma3.state_dict().items()}
    assert "vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight" in on_disk
    pixels = gemma3_pixel_values(picture(5), IMAGE_SIZE)
    assert torch.equal(tower_of(gemma3).soft_tokens(pixels), VisionTower.from_state_dict(on_disk, 4, 1e-6, 4).soft_tokens(pixels))


def test_a_checkpoint_without_a_tower_and_wrong_pixels_are_named(gemma3):
    state = {k: v for k, v in gemma3.state_dict().items() if "post_layernorm" not in k}
    with pytest.raises(KeyError, match="post_layernorm.weight"):
        VisionTower.from_state_dict(state, 4, 1e-6, 4)
    with pytest.raises(KeyError, match="encoder.layers.0"):
        VisionTower.from_state_dict({}, 4, 1e-6, 4)
    with pytest.raises(ValueError, match=r"\[3, 20, 20\]"):
        tower_of(gemma3).soft_tokens(torch.zeros(3, 10, 10))
    with pytest.raises(ValueError, match="RGB"):
        gemma3_pixel_values(Image.new("L", (4, 4)), IMAGE_SIZE)
