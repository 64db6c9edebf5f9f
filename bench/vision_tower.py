"""Gemma 3's vision tower on the CPU: the engine's (``VisionTower.soft_tokens``, one picture a
call) against transformers' ``get_image_features`` on the same random-weight model and pixel
values, side by side in one run. Installs and downloads nothing.

    python bench/vision_tower.py            # tiny (the tests' config) and Gemma-3-4B-shaped, 2 of 27 layers

Shapes: ``tiny`` is the tests' model (20-pixel pictures, 5-pixel patches, 4 soft tokens);
``4b`` is Gemma 3 4B's tower at full width (896-pixel pictures, 14-pixel patches: 4096 patches,
hidden 1152, 16 heads, MLP 4304, 256 soft tokens of 2560) with 2 of its 27 layers (a layer's
time scales the rest). Each prints one JSON line: seconds per picture (median of ``--repeats``)
for both at torch's thread count, their ratio, the engine's on one thread (as it runs, on one of
its workers), the largest difference of their soft tokens, the torch threads and the load
average. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

SHAPES = {
    "tiny": dict(vision={"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "image_size": 20, "patch_size": 5}, text_hidden=64, tokens=4),
    "4b": dict(vision={"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 2, "num_attention_heads": 16,
                       "image_size": 896, "patch_size": 14}, text_hidden=2560, tokens=256),
}


def model_of(shape: dict):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    config = Gemma3Config(
        text_config={"vocab_size": 64, "hidden_size": shape["text_hidden"], "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16},
        vision_config={**shape["vision"], "layer_norm_eps": 1e-6}, mm_tokens_per_image=shape["tokens"],
        image_token_index=63, boi_token_index=61, eoi_token_index=62,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.02)
    return model


def timed(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from spinf_stream.models.vision import VisionTower

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    for name in args.shapes:
        shape = SHAPES[name]
        model = model_of(shape)
        cfg = model.config
        tower = VisionTower.from_state_dict(model.state_dict(), cfg.vision_config.num_attention_heads,
                                            cfg.vision_config.layer_norm_eps, cfg.mm_tokens_per_image)
        side = cfg.vision_config.image_size
        pixels = torch.rand(1, 3, side, side) * 2 - 1
        with torch.inference_mode():
            ours = timed(lambda: tower.soft_tokens(pixels[0]), args.repeats)
            theirs = timed(lambda: model.model.get_image_features(pixel_values=pixels), args.repeats)
            diff = (tower.soft_tokens(pixels[0]) - model.model.get_image_features(pixel_values=pixels).pooler_output[0])
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # as the engine runs it: on one of its single-threaded workers
            ours_one = timed(lambda: tower.soft_tokens(pixels[0]), args.repeats)
            torch.set_num_threads(threads)
        print(json.dumps({
            "shape": name, "engine_s": round(ours, 5), "transformers_s": round(theirs, 5),
            "engine_over_transformers": round(ours / theirs, 3), "engine_one_thread_s": round(ours_one, 5),
            "max_abs_diff": float(diff.abs().max()),
            "torch_threads": torch.get_num_threads(), "load": os.getloadavg(),
        }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
