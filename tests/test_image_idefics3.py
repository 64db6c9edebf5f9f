"""Picture messages on a second family: Idefics3 (SmolVLM's architecture: SigLIP tiles, a pixel
shuffle, a Llama decoder, causal attention over the soft tokens) as a random-weight model of a
small config, with the SmolLM2 tokenizer plus Idefics3's image tokens.

The oracle is transformers: ``Idefics3Processor`` (its PIL image processor: Lanczos resizes,
pictures cut into tiles plus a global view) makes the input ids and pixel values of each
question's full prompt from the same picture, ``Idefics3ForConditionalGeneration`` the logits.
"""

from __future__ import annotations

import base64
import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from spinf_stream.engine import Engine, Message
from spinf_stream.models import load_decoder
from spinf_stream.models.vision import ImageFormat, processor_settings
from spinf_stream.packs import parse_pack

PACK = """\
name: listing
version: "1.0.0"
description: a photo and a title
preamble: "Check the listing.\\n\\n"
prompt: "Photo: {photo}\\nTitle: {title}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - {id: matches, text: "Does the photo show the titled product?"}
  - {id: kind, text: "What kind of product is it?", choices: [kitchen, clothing, toys]}
"""

TWO = """\
name: pair
version: "1.0.0"
description: two photos
prompt: "Before: {before}\\nNote: {note}\\nAfter: {after}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - {id: same, text: "Are they the same?"}
"""


@pytest.fixture(scope="module")
def idefics3(tiny_idefics3):
    """``(path, transformers model, processor, engine_of)`` of the tiny Idefics3."""
    from transformers import AutoProcessor, AutoTokenizer, Idefics3ForConditionalGeneration

    model = Idefics3ForConditionalGeneration.from_pretrained(str(tiny_idefics3), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(tiny_idefics3))
    decoder, tok = load_decoder(tiny_idefics3), AutoTokenizer.from_pretrained(str(tiny_idefics3))
    engines: dict[str, Engine] = {}

    def engine_of(pack: str) -> Engine:
        if pack not in engines:
            engines[pack] = Engine(decoder, tok, parse_pack(pack, "test.yaml"), "tiny-idefics3", 4096)
        return engines[pack]

    return tiny_idefics3, model, processor, engine_of


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8))


def png_b64(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("size", [(37, 23), (90, 3), (20, 20), (12, 50), (400, 300)])
def test_tiles_equal_the_processors_pixel_values(idefics3, size):
    path, _, processor, _ = idefics3
    from transformers import AutoConfig

    fmt = ImageFormat.from_config(AutoConfig.from_pretrained(str(path)), processor_settings(path))
    img = picture(1, size)
    text, tiles = fmt.read(img)
    got = processor.image_processor(images=[[img]], return_tensors="pt", return_row_col_info=True)
    want = got["pixel_values"][0]
    assert len(tiles) == want.shape[0]
    for a, b in zip(tiles, want):
        assert torch.equal(a, b)
    rows, cols = got["rows"][0][0], got["cols"][0][0]
    assert text == processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)


def oracle(idefics3, pack_text: str, fields: dict) -> dict[str, dict[str, float]]:
    _, model, processor, _ = idefics3
    pack = parse_pack(pack_text, "test.yaml")
    images = [fields[f] for f in pack.field_occurrences if isinstance(fields[f], Image.Image)]
    head = pack.preamble + pack.render_prompt({k: "<image>" if isinstance(v, Image.Image) else v for k, v in fields.items()})
    out: dict[str, dict[str, float]] = {}
    for q in pack.expand():
        full = head + pack.render_question(q)
        n = processor(images=[images] if images else None, text=[full], return_tensors="pt")["input_ids"].shape[1]
        out[q.id] = {}
        for label in q.choices:
            inputs = processor(images=[images] if images else None, text=[full + pack.answer_prefix + label],
                               return_tensors="pt")
            ids = inputs["input_ids"][0]
            with torch.no_grad():
                lp = torch.log_softmax(model(**inputs).logits[0].double(), dim=-1)
            out[q.id][label] = sum(float(lp[i - 1, ids[i]]) for i in range(n, ids.shape[0]))
    return out


CASES = {
    "one picture in 2x2 tiles": (PACK, {"photo": picture(2, (37, 23)), "title": "a red mug"}),
    "one picture in 1x2 tiles": (PACK, {"photo": picture(3, (90, 3)), "title": "a thin strip"}),
    "text only": (PACK, {"photo": "no photo given", "title": "a mug"}),
    "two pictures around a text field": (TWO, {"before": picture(4, (20, 20)), "note": "then", "after": picture(5, (12, 50))}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_choice_logprobs_equal_transformers(idefics3, case):
    pack, fields = CASES[case]
    engine = idefics3[3](pack)
    msg = {k: {"image": png_b64(v)} if isinstance(v, Image.Image) else v for k, v in fields.items()}
    (rec,) = engine.score([Message("m", msg)])
    assert not hasattr(rec, "error"), rec
    want = oracle(idefics3, pack, fields)
    for qid, choices in want.items():
        for label, lp in choices.items():
            assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4), (qid, label)
        total = sum(math.exp(v) for v in choices.values())
        for label, lp in choices.items():
            assert rec.scores[qid].choices[label].probability == pytest.approx(math.exp(lp) / total, abs=2e-5)


def test_a_messages_bits_do_not_depend_on_its_batch_or_the_budget(idefics3):
    engine = idefics3[3](TWO)
    msgs = [Message(f"m{i}", {"before": {"image": png_b64(picture(10 + i, (30 + 7 * i, 25)))}, "note": "n" * (i + 1),
                              "after": {"image": png_b64(picture(20 + i, (20, 44)))}}) for i in range(4)]
    alone = {m.id: engine.score([m])[0].digest for m in msgs}
    for budget in (48, 4096):
        engine.token_budget = budget
        assert {r.id: r.digest for r in engine.score(msgs[::-1])} == alone, budget
    engine.token_budget = 4096


def test_its_soft_tokens_are_causal(idefics3):
    """Idefics3 reads its soft tokens causally: no block reaches the layout."""
    from spinf_stream.engine.layout import build_pass, plan_passes

    engine = idefics3[3](PACK)
    (p,) = engine.prepare([Message("m", {"photo": {"image": png_b64(picture(2, (37, 23)))}, "title": "x"})])
    assert len(p.images) == 5 and not any(s.bidirectional for s in p.images)  # 2 x 2 tiles and the global view
    layout = build_pass(plan_passes([p], 4096)[0], engine.preamble_len)
    assert layout.blocks == () and layout.messages[0].images == () and len(layout.images) == 5


def test_score_and_the_triton_path_read_its_pictures_as_the_torch_engine(idefics3, tmp_path):
    import subprocess
    import sys

    import orjson

    from spinf_stream.models.triton_backend import interpreter_on

    path, _, _, engine_of = idefics3
    rows = [{"id": f"m{i}", "photo": {"image": png_b64(picture(60 + i, (25 + 9 * i, 31)))}, "title": f"item {i}"}
            for i in range(3)]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / "p.yaml").write_text(PACK)
    subprocess.run([sys.executable, "-m", "spinf_stream.cli", "score", "--model", str(path), "--pack", str(tmp_path / "p.yaml"),
                    "--input", str(src), "--output", str(out), "--device", "cpu", "--dtype", "float32"],
                   check=True, capture_output=True)
    want = engine_of(PACK).score([Message(r["id"], r) for r in rows])
    got = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [g["digest"] for g in got] == [w.digest for w in want]
    if interpreter_on():
        from transformers import AutoTokenizer

        triton = Engine(load_decoder(path, kernels="triton"), AutoTokenizer.from_pretrained(str(path)),
                        parse_pack(PACK, "test.yaml"), "tiny-idefics3", 4096)
        for a, b in zip(want, triton.score([Message(r["id"], r) for r in rows])):
            for qid, q in a.scores.items():
                for label, c in q.choices.items():
                    assert b.scores[qid].choices[label].logprob == pytest.approx(c.logprob, abs=1e-5)
