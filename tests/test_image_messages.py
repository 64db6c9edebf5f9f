"""Messages with pictures, end to end through the engine, on a random-weight model of Gemma 3's
multimodal architecture (a small config, as transformers' own Gemma 3 tests build it) with the
real Gemma 3 tokenizer plus its image soft token.

The oracle is transformers: ``Gemma3Processor`` (its PIL image processor) makes the input ids,
``token_type_ids`` and pixel values of each question's full prompt from the same picture, and
``Gemma3ForConditionalGeneration`` gives the logits, one question and one choice at a time.
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
from spinf_stream.engine.layout import build_pass, plan_passes
from spinf_stream.models import load_decoder
from spinf_stream.models.triton_backend import interpreter_on
from spinf_stream.packs import Pack, parse_pack

from tiny import VL_IMAGE_SIZE as IMAGE_SIZE, VL_TOKENS_PER_IMAGE as TOKENS_PER_IMAGE

ONE = """\
name: photo_check
version: "1.0.0"
description: pictures and text, for the image tests
preamble: "Look at the photo and answer.\\n\\n"
prompt: "Photo: {photo}\\nCaption: {caption}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - {id: cat, text: "Is there a cat in the photo?"}
  - {id: outdoor, text: "Was it taken outdoors?"}
  - {id: mood, text: "What is its mood?", choices: [happy, sad, calm]}
"""

TWO = """\
name: photo_pair
version: "1.0.0"
description: pictures and text, for the image tests
prompt: "Before: {before}\\nNote: {note}\\nAfter: {after}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - {id: same, text: "Do both photos show the same thing?"}
  - {id: changed, text: "Did anything change?"}
"""


@pytest.fixture(scope="module")
def gemma3_vl(tiny_vl):
    """The tiny multimodal model: ``(path, transformers model, transformers processor)``."""
    from transformers import AutoTokenizer, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    model = Gemma3ForConditionalGeneration.from_pretrained(str(tiny_vl), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_vl))
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
                                tokenizer=tok, image_seq_length=TOKENS_PER_IMAGE)
    return tiny_vl, model, processor


@pytest.fixture(scope="module")
def engine_of(gemma3_vl):
    from transformers import AutoTokenizer

    path = gemma3_vl[0]
    decoder, tok = load_decoder(path), AutoTokenizer.from_pretrained(str(path))
    memo: dict[str, Engine] = {}

    def get(pack_yaml: str, budget: int = 4096) -> Engine:
        if pack_yaml not in memo:
            memo[pack_yaml] = Engine(decoder, tok, _pack(pack_yaml), "tiny-gemma3-vl", budget)
        return memo[pack_yaml]

    return get


def _pack(text: str) -> Pack:
    return parse_pack(text, "test.yaml")


def picture(seed: int, size: tuple[int, int] = (37, 23)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png_b64(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def oracle(gemma3_vl, pack: Pack, fields: dict) -> dict[str, dict[str, float]]:
    """Per question, per choice: transformers' logprob of the choice's tokens after the full
    prompt, each picture at its field as the processor places it (``<start_of_image>``)."""
    _, model, processor = gemma3_vl
    frames = {k: ([v] if isinstance(v, Image.Image) else v) for k, v in fields.items() if not isinstance(v, str)}
    images = [pic for f in pack.field_occurrences if f in frames for pic in frames[f]]
    text_fields = {k: "<start_of_image>" * len(frames[k]) if k in frames else v for k, v in fields.items()}
    head = pack.preamble + pack.render_prompt(text_fields)
    out: dict[str, dict[str, float]] = {}
    for q in pack.expand():
        full = head + pack.render_question(q)
        base = processor(images=images or None, text=full, return_tensors="pt")
        n = base["input_ids"].shape[1]
        out[q.id] = {}
        for label in q.choices:
            inputs = processor(images=images or None, text=full + pack.answer_prefix + label, return_tensors="pt")
            ids = inputs["input_ids"][0]
            assert ids[:n].tolist() == base["input_ids"][0].tolist()
            with torch.no_grad():
                logits = model(**inputs).logits[0].double()
            lp = torch.log_softmax(logits, dim=-1)
            out[q.id][label] = sum(float(lp[i - 1, ids[i]]) for i in range(n, ids.shape[0]))
    return out


def _as_field(v):
    if isinstance(v, list):
        return [_as_field(x) for x in v]
    return {"image": png_b64(v)} if isinstance(v, Image.Image) else v


CASES = {
    "one picture": (ONE, {"photo": picture(1), "caption": "a small animal on a sofa"}),
    "two pictures around a text field": (TWO, {"before": picture(2), "note": "see the change", "after": picture(3, (20, 20))}),
    "text only": (ONE, {"photo": "no picture: a description of a grey cat", "caption": "a cat"}),
    "one picture and a text where the other was": (TWO, {"before": picture(4, (90, 3)), "note": "n", "after": "gone"}),
    "a video's frames and a picture": (TWO, {"before": [picture(7), picture(8), picture(9)], "note": "clip",
                                             "after": picture(10)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_choice_logprobs_equal_transformers(gemma3_vl, engine_of, case):
    pack_yaml, fields = CASES[case]
    engine = engine_of(pack_yaml)
    (rec,) = engine.score([Message("m", {k: _as_field(v) for k, v in fields.items()})])
    assert not hasattr(rec, "error"), rec
    want = oracle(gemma3_vl, engine.pack, fields)
    for qid, choices in want.items():
        for label, lp in choices.items():
            assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4), (qid, label)
        probs = {k: math.exp(v) for k, v in choices.items()}
        total = sum(probs.values())
        for label in choices:
            assert rec.scores[qid].choices[label].probability == pytest.approx(probs[label] / total, abs=2e-5)


def test_a_messages_bits_do_not_depend_on_its_batch_or_the_budget(engine_of):
    engine = engine_of(TWO)
    msgs = [Message(f"m{i}", {"before": {"image": png_b64(picture(10 + i))}, "note": f"note {i}" * (i + 1),
                              "after": {"image": png_b64(picture(20 + i, (30 + i, 25)))} if i % 2 else "text"})
            for i in range(5)]
    alone = {m.id: engine.score([m])[0].digest for m in msgs}
    for budget in (40, 64, 4096):
        engine.token_budget = budget
        together = engine.score(msgs[::-1])
        assert {r.id: r.digest for r in together} == alone, budget
    engine.token_budget = 4096


def test_the_soft_tokens_see_their_whole_picture(engine_of):
    """The layout marks each picture's rows as a block; a made-causal mask changes the scores
    (the parity test above fails then), so the block must reach the attention."""
    engine = engine_of(ONE)
    (p,) = engine.prepare([Message("m", {"photo": {"image": png_b64(picture(1))}, "caption": "x"})])
    assert [(s.start, s.length) for s in p.images] and all(s.length == TOKENS_PER_IMAGE for s in p.images)
    assert all(set(p.content[s.start : s.start + s.length]) == {engine.decoder.vision.format.image_token_id}
               for s in p.images)
    layout = build_pass(plan_passes([p], 4096)[0], engine.preamble_len)
    (plan,) = layout.messages
    assert plan.images == tuple((s.start, s.length) for s in p.images)
    assert layout.blocks == tuple((layout.query_start + plan.content_start + s.start, s.length) for s in p.images)


@pytest.mark.skipif(not interpreter_on(), reason="the Triton kernels run on the CPU only with TRITON_INTERPRET=1")
def test_the_triton_path_reads_pictures_as_the_torch_path(gemma3_vl, engine_of):
    from transformers import AutoTokenizer

    path = gemma3_vl[0]
    torch_engine = engine_of(TWO)
    triton = Engine(load_decoder(path, kernels="triton"), AutoTokenizer.from_pretrained(str(path)), torch_engine.pack,
                    "tiny-gemma3-vl", 4096)
    msg = Message("m", {"before": {"image": png_b64(picture(5))}, "note": "x", "after": {"image": png_b64(picture(6))}})
    (a,) = torch_engine.score([msg])
    (b,) = triton.score([msg])
    for qid, q in a.scores.items():
        for label, c in q.choices.items():
            assert b.scores[qid].choices[label].logprob == pytest.approx(c.logprob, abs=1e-5)


@pytest.mark.parametrize("value, kind", [
    ({"image": "bm90IGFuIGltYWdl"}, "invalid_image"),  # base64 of "not an image"
    ({"image": "%%%"}, "invalid_image"),
])
def test_a_bad_picture_is_an_error_record(engine_of, value, kind):
    engine = engine_of(ONE)
    (rec,) = engine.score([Message("m", {"photo": value, "caption": "x"})])
    assert rec.error.kind == kind and "photo" in rec.error.message


def test_a_text_only_model_refuses_pictures(tiny_models, loaded):
    from spinf_stream.engine import Engine

    decoder, tok = loaded(tiny_models("gemma3"))
    engine = Engine(decoder, tok, _pack(ONE), "tiny", 4096)
    (rec,) = engine.score([Message("m", {"photo": {"image": png_b64(picture(1))}, "caption": "x"})])
    assert rec.error.kind == "unsupported_image" and "photo" in rec.error.message


def mp4_b64(frames: list[np.ndarray], rate: int) -> str:
    """An MP4 (MPEG-4 Part 2, FFmpeg's own encoder) of ``frames`` at ``rate`` frames per second."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for f in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(stream.encode())
    return base64.b64encode(buf.getvalue()).decode()


def test_a_video_is_read_as_the_frames_taken_at_its_fps(gemma3_vl, engine_of):
    """8 frames at 4 frames per second, taken at 2 per second: the frames at 0, 0.5, 1.0 and
    1.5 s (every other one, decoded independently here), scored as transformers scores them."""
    import av

    rng = np.random.default_rng(3)
    raw = [np.repeat(np.repeat(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), 4, 0), 4, 1) for _ in range(8)]
    video = mp4_b64(raw, rate=4)
    with av.open(io.BytesIO(base64.b64decode(video))) as c:
        decoded = [(float(f.time), f.to_image()) for f in c.decode(c.streams.video[0])]
    want_frames = [img for t, img in decoded if any(abs(t - k / 2) < 1e-9 for k in range(4))]
    assert len(want_frames) == 4
    engine = engine_of(TWO)
    (rec,) = engine.score([Message("m", {"before": {"video": video, "fps": 2}, "note": "clip", "after": "text"})])
    assert not hasattr(rec, "error"), rec
    want = oracle(gemma3_vl, engine.pack, {"before": want_frames, "note": "clip", "after": "text"})
    for qid, choices in want.items():
        for label, lp in choices.items():
            assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4), (qid, label)


@pytest.mark.parametrize("value, kind", [
    ({"video": "bm90IGEgdmlkZW8="}, "invalid_image"),  # base64 of "not a video"
    ({"video": "AAAA", "fps": 0}, "invalid_image"),
    ({"video": "AAAA", "fps": True}, "invalid_image"),
    ([{"image": "AAAA"}], "invalid_image"),
    ([{"image": "AAAA"}] * 17, "image_too_large"),
])
def test_a_bad_video_is_an_error_record(engine_of, value, kind):
    engine = engine_of(TWO)
    (rec,) = engine.score([Message("m", {"before": value, "note": "x", "after": "y"})])
    assert rec.error.kind == kind and "before" in rec.error.message


def test_a_messages_bits_do_not_depend_on_the_thread_count(gemma3_vl):
    from transformers import AutoTokenizer

    path = gemma3_vl[0]
    tok = AutoTokenizer.from_pretrained(str(path))
    msgs = [Message(f"m{i}", {"before": {"image": png_b64(picture(30 + i))}, "note": "n" * (i + 1),
                              "after": [{"image": png_b64(picture(40 + i))}, {"image": png_b64(picture(50 + i))}]})
            for i in range(3)]
    digests = []
    for threads in (1, 2, 3):
        engine = Engine(load_decoder(path, threads=threads), tok, _pack(TWO), "tiny-gemma3-vl", 4096)
        digests.append([r.digest for r in engine.score(msgs)])
    assert digests[0] == digests[1] == digests[2]
