"""Draws the product photos of ``examples/product_photos.jsonl`` (Pillow, no download).

Each photo is a 96×96 PNG of a simple product on a background, written into its message as
``{"image": "<base64>"}`` with a listing title. Run from the repository root:

    python examples/make_product_photos.py > examples/product_photos.jsonl
"""

from __future__ import annotations

import base64
import io
import json

from PIL import Image, ImageDraw

SIDE = 96


def _canvas(background: tuple[int, int, int]) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    img = Image.new("RGB", (SIDE, SIDE), background)
    return img, ImageDraw.Draw(img)


def mug(cracked: bool = False) -> Image.Image:
    img, d = _canvas((245, 245, 245))
    d.rectangle((28, 30, 62, 76), fill=(200, 40, 40), outline=(90, 20, 20), width=2)
    d.arc((54, 40, 78, 64), start=-90, end=90, fill=(90, 20, 20), width=5)
    if cracked:
        d.line((36, 30, 44, 48, 38, 60, 46, 76), fill=(20, 20, 20), width=2)
    return img


def tshirt() -> Image.Image:
    img, d = _canvas((250, 250, 250))
    d.polygon([(30, 20), (66, 20), (86, 36), (76, 46), (68, 40), (68, 80), (28, 80), (28, 40), (20, 46), (10, 36)],
              fill=(40, 90, 200), outline=(20, 40, 110))
    return img


def phone() -> Image.Image:
    img, d = _canvas((235, 235, 240))
    d.rounded_rectangle((32, 12, 64, 84), radius=6, fill=(30, 30, 35))
    d.rectangle((35, 18, 61, 74), fill=(90, 160, 230))
    d.ellipse((45, 76, 51, 82), fill=(120, 120, 120))
    return img


def ball() -> Image.Image:
    img, d = _canvas((120, 190, 110))  # on grass: not a plain background
    d.ellipse((24, 24, 72, 72), fill=(250, 210, 40), outline=(160, 120, 0), width=2)
    d.arc((24, 24, 72, 72), start=200, end=340, fill=(220, 60, 60), width=4)
    return img


MESSAGES = [
    ("p1", mug, "Red ceramic coffee mug, 350 ml"),
    ("p2", lambda: mug(cracked=True), "Red ceramic coffee mug, 350 ml (second hand)"),
    ("p3", tshirt, "Blue cotton t-shirt, size M"),
    ("p4", phone, "Smartphone with 6.1 inch screen"),
    ("p5", ball, "Yellow rubber ball for dogs"),
    ("p6", tshirt, "Stainless steel kitchen knife"),  # the title does not match the photo
]


def png_b64(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode()


if __name__ == "__main__":
    for msg_id, draw, title in MESSAGES:
        print(json.dumps({"id": msg_id, "photo": {"image": png_b64(draw())}, "title": title}))
