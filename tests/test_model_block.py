"""Every record says which model made it and how it ran: ``model`` = {name, sha256 of the weights,
device, dtype, kernels, numerics}; a CPU score can be told from a GPU score."""

from __future__ import annotations

import hashlib

import pytest
import torch

from spinf_stream.engine import Engine, Message
from spinf_stream.engine.results import ScoreRecord

MESSAGE = Message("m1", {"text": "WIN a prize, call now"})


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models("llama")


def _weights_sha256(directory) -> str:
    """From the definition: config.json, then the *.safetensors files in name order."""
    h = hashlib.sha256()
    for p in [directory / "config.json", *sorted(directory.glob("*.safetensors"))]:
        h.update(p.read_bytes())
    return h.hexdigest()


def test_a_cpu_record_names_the_model_its_weights_sha256_and_cpu_float32_torch(model_dir, monkeypatch):
    monkeypatch.delenv("SPINF_KERNELS", raising=False)
    engine = Engine.load(str(model_dir), "spam", token_budget=4096, device="cpu", dtype="float32")
    (rec,) = engine.score([MESSAGE])
    assert isinstance(rec, ScoreRecord)
    from spinf_stream.models import numerics

    described = numerics.describe(torch.device("cpu"), "torch", torch.float32)
    assert rec.model.model_dump() == {
        "name": str(model_dir), "sha256": _weights_sha256(model_dir), "device": "cpu", "dtype": "float32", "kernels": "torch",
        "numerics": {"isa": described.isa, "library": described.library, "tiles": described.tiles, "bits_probe": "passed"},
    }


def test_the_record_says_bfloat16_when_the_engine_runs_in_it(model_dir):
    engine = Engine.load(str(model_dir), "spam", token_budget=4096, device="cpu", dtype=torch.bfloat16)
    (rec,) = engine.score([MESSAGE])
    assert (rec.model.device, rec.model.dtype) == ("cpu", "bfloat16")


def test_the_record_names_the_kernels_that_ran(model_dir, loaded, monkeypatch):
    """SPINF_KERNELS=triton (with the interpreter on the CPU) loads the Triton back end, and the
    record says so; a decoder loaded without it says torch."""
    from spinf_stream.models import load_decoder
    from spinf_stream.packs import load_pack

    decoder, tok = loaded(model_dir)
    assert Engine(decoder, tok, load_pack("spam"), "tiny").model_info.kernels == "torch"
    monkeypatch.setenv("SPINF_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    engine = Engine(load_decoder(model_dir), tok, load_pack("spam"), "tiny")
    assert engine.model_info.kernels == "triton" and engine.model_info.sha256 is None


def test_the_model_block_is_outside_the_digest(model_dir, loaded):
    """Same scores, another model block: the digest (over the scores only) does not change."""
    from spinf_stream.packs import load_pack
    from spinf_stream.engine.results import digest

    decoder, tok = loaded(model_dir)
    rec = Engine(decoder, tok, load_pack("spam"), "tiny").score([MESSAGE])[0]
    assert rec.digest == digest(rec.model_dump(mode="json")["scores"])


def test_an_unknown_dtype_name_is_refused_by_engine_load(model_dir):
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        Engine.load(str(model_dir), "spam", dtype="float8")
