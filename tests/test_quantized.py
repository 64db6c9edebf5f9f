"""Quantized weights: ``--dtype int8`` (int8 linear weights quantized on load, bf16 activations)
and GPTQ / AWQ int4 checkpoints (dequantized on load), on tiny random-weight models of every family.

The int4 checkpoints are written here from the formats' published definitions (GPTQ: AutoGPTQ's
``qweight [in/8, out]`` packed along the inputs, zeros packed along the outputs and stored minus
one in ``checkpoint_format: gptq``; AWQ: AutoAWQ's GEMM layout, both packed along the outputs in
the order 0, 2, 4, 6, 1, 3, 5, 7), not by the project's loader. The loaded weights must equal the
test's own dequantization bit for bit, and the scores transformers' on those dequantized weights.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from conftest import at_budget, dataset
from oracle import Oracle, load_hf, probabilities

from spinf_stream.engine import Engine, Message
from spinf_stream.models import load_decoder
from spinf_stream.models.convert import ModelLoadError
from spinf_stream.models.ops import QuantizedWeight
from spinf_stream.models.resolve import resolve
from spinf_stream.packs import load_pack
from tiny import FAMILIES

REPO = Path(__file__).resolve().parents[1]
LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")


def _copy_model(src: Path, dst: Path, tensors: dict[str, torch.Tensor], quantization: dict | None) -> Path:
    """``src``'s tokenizer and config (with ``quantization`` as its ``quantization_config``) and ``tensors``."""
    from safetensors.torch import save_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    if quantization is not None:
        config["quantization_config"] = quantization
    (dst / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# --------------------------------------------------------------------------- int4 formats, by definition


def _words(nibbles: np.ndarray) -> np.ndarray:
    """``[..., 8]`` values in 0..15 → ``[...]`` int32 words, value i in bits 4i..4i+3."""
    acc = np.zeros(nibbles.shape[:-1], dtype=np.uint32)
    for i in range(8):
        acc |= nibbles[..., i].astype(np.uint32) << np.uint32(4 * i)
    return acc.view(np.int32)


def _quantize(w: torch.Tensor, g_idx: torch.Tensor, groups: int, sym: bool):
    """Round-to-nearest int4 of ``w [out, in]`` per (group, output channel): ``q [in, out]`` in
    0..15, zeros ``z [groups, out]``, fp16 scales ``s [groups, out]`` and the dequantized weight
    ``(q - z[g]) * s[g]`` in fp32 (exact), the definition both formats share."""
    wt = w.t().double()  # [in, out]
    s = torch.empty(groups, w.shape[0], dtype=torch.float64)
    z = torch.empty(groups, w.shape[0], dtype=torch.int64)
    for g in range(groups):
        rows = wt[g_idx == g]
        if sym:
            s[g] = rows.abs().amax(0).clamp(min=1e-4) / 7.5
            z[g] = 8
        else:
            lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            s[g] = ((hi - lo) / 15).clamp(min=1e-4)
            z[g] = torch.round(-lo / s[g]).clamp(1, 15)  # 1..15: GPTQ v1 cannot store zero 0
    s16 = s.to(torch.float16)
    q = torch.round(wt / s16.double()[g_idx] + z[g_idx]).clamp(0, 15).long()
    deq = ((q - z[g_idx]).float() * s16.float()[g_idx]).t().contiguous()
    return q, z, s16, deq


def _gptq_tensors(q, z, s16, g_idx, v1: bool) -> dict[str, torch.Tensor]:
    k, n = q.shape
    qweight = _words(q.numpy().reshape(k // 8, 8, n).transpose(0, 2, 1))  # [in/8, out]: along the inputs
    stored = (z - 1) & 0xF if v1 else z
    qzeros = _words(stored.numpy().reshape(z.shape[0], n // 8, 8))  # [groups, out/8]: along the outputs
    return {"qweight": torch.from_numpy(qweight), "qzeros": torch.from_numpy(qzeros), "scales": s16,
            "g_idx": g_idx.to(torch.int32)}


def _awq_tensors(q, z, s16) -> dict[str, torch.Tensor]:
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a word holds output channel 8c + order[i]

    def pack(v: torch.Tensor) -> torch.Tensor:
        rows, n = v.shape
        grouped = v.numpy().reshape(rows, n // 8, 8)[:, :, order]
        return torch.from_numpy(_words(grouped))

    return {"qweight": pack(q), "qzeros": pack(z), "scales": s16}


#: (name, method, group size, symmetric, desc_act, checkpoint_format)
VARIANTS = [
    ("gptq-g32-sym", "gptq", 32, True, False, "gptq"),
    ("gptq-g64-asym-act-order", "gptq", 64, False, True, "gptq"),
    ("gptq-channel-v2", "gptq", -1, False, False, "gptq_v2"),
    ("gptq-g128-sym", "gptq", 128, True, True, "gptq"),
    ("awq-g32", "awq", 32, False, False, None),
    ("awq-g64", "awq", 64, False, False, None),
]


def _int4_checkpoint(src: Path, root: Path, variant: tuple, seed: int = 0) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """``(quantized dir, dequantized dir, dequantized weights by name)`` of the model at ``src``."""
    name, method, group, sym, act_order, fmt = variant
    gen = torch.Generator().manual_seed(seed)
    sd = _state_dict(src)
    packed: dict[str, torch.Tensor] = {}
    plain: dict[str, torch.Tensor] = {}
    deqs: dict[str, torch.Tensor] = {}
    for key, w in sd.items():
        if not LINEAR.fullmatch(key):
            packed[key] = plain[key] = w
            continue
        k = w.shape[1]
        size = k if group == -1 else min(group, k)
        groups = -(-k // size)
        order = torch.randperm(k, generator=gen) if act_order else torch.arange(k)
        g_idx = torch.empty(k, dtype=torch.long)
        g_idx[order] = torch.arange(k) // size  # desc_act: the groups follow a permutation of the inputs
        q, z, s16, deq = _quantize(w, g_idx, groups, sym)
        prefix = key[: -len(".weight")]
        parts = _gptq_tensors(q, z, s16, g_idx, fmt == "gptq") if method == "gptq" else _awq_tensors(q, z, s16)
        packed.update({f"{prefix}.{p}": t for p, t in parts.items()})
        plain[key] = deqs[key] = deq
    if method == "gptq":
        config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": sym,
                  "checkpoint_format": fmt}
    else:
        config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return (_copy_model(src, root / name, packed, config), _copy_model(src, root / f"{name}-dequantized", plain, None), deqs)


def _layer_weights(decoder) -> dict[str, torch.Tensor]:
    """The decoder's linear weights under transformers' names (unstacked)."""
    out = {}
    for i, lw in enumerate(decoder.layers):
        p = f"model.layers.{i}."
        sizes = [decoder.spec.num_heads * decoder.spec.head_dim] + [decoder.spec.num_kv_heads * decoder.spec.head_dim] * 2
        for n, t in zip("qkv", lw.qkv.split(sizes)):
            out[f"{p}self_attn.{n}_proj.weight"] = t
        out[f"{p}self_attn.o_proj.weight"] = lw.o
        gate, up = lw.gate_up.chunk(2)
        out.update({f"{p}mlp.gate_proj.weight": gate, f"{p}mlp.up_proj.weight": up, f"{p}mlp.down_proj.weight": lw.down})
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_int4_checkpoints_unpack_exactly(tiny_models, tmp_path, family, variant):
    """Every family, every format variant: the loaded float32 weights equal the test's own
    dequantization bit for bit; the other tensors are the checkpoint's."""
    qdir, _, deqs = _int4_checkpoint(tiny_models(family), tmp_path, variant)
    decoder = load_decoder(qdir, dtype=torch.float32)
    got = _layer_weights(decoder)
    assert set(got) == set(deqs)
    for key, want in deqs.items():
        assert torch.equal(got[key], want), key
    assert torch.equal(decoder.embed, _state_dict(tiny_models(family))["model.embed_tokens.weight"])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", [VARIANTS[1], VARIANTS[4]], ids=[VARIANTS[1][0], VARIANTS[4][0]])
def test_int4_checkpoint_scores_match_transformers_on_the_dequantized_weights(tiny_models, tmp_path, family, variant):
    qdir, plain_dir, _ = _int4_checkpoint(tiny_models(family), tmp_path, variant)
    engine = Engine.load(str(qdir), "spam", calibration="none")
    rows = dataset("sms_spam", 3)
    records = engine.score([Message(id=r["id"], fields=r) for r in rows])
    oracle = Oracle(load_hf(str(plain_dir)), engine.tokenizer, engine.pack, prefix_cache=False)
    for row, rec in zip(rows, records):
        for qid, lps in oracle.score(row).items():
            probs = probabilities(lps)
            for label, lp in lps.items():
                assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4)
                assert rec.scores[qid].choices[label].probability == pytest.approx(probs[label], abs=2e-5)


@pytest.mark.parametrize(("change", "key"), [
    ({"bits": 3}, "quantization_config.bits = 3"),
    ({"bits": 8}, "quantization_config.bits = 8"),
    ({"quant_method": "hqq"}, "quantization_config.quant_method = 'hqq'"),
    ({"quant_method": "awq", "version": "gemv"}, "quantization_config.version = 'gemv'"),
    ({"checkpoint_format": "marlin"}, "quantization_config.checkpoint_format = 'marlin'"),
    ({"group_size": 0}, "quantization_config.group_size = 0"),
])
def test_a_quantization_config_we_cannot_read_is_refused_naming_the_key(tiny_models, tmp_path, change, key):
    qdir, _, _ = _int4_checkpoint(tiny_models("llama"), tmp_path, VARIANTS[0])
    config = json.loads((qdir / "config.json").read_text())
    config["quantization_config"].update(change)
    (qdir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=re.escape(f"{qdir / 'config.json'}: {key} is not supported")):
        resolve(str(qdir))  # the reference check, before any weight is read
    with pytest.raises(ModelLoadError, match=re.escape(key)):
        load_decoder(qdir)


def test_a_packed_layer_without_its_zeros_is_refused_naming_it(tiny_models, tmp_path):
    from safetensors.torch import save_file

    qdir, _, _ = _int4_checkpoint(tiny_models("qwen2"), tmp_path, VARIANTS[4])
    sd = _state_dict(qdir)
    del sd["model.layers.1.mlp.down_proj.qzeros"]
    save_file(sd, str(qdir / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"awq layer model\.layers\.1\.mlp\.down_proj: no .*down_proj\.qzeros"):
        load_decoder(qdir)


# --------------------------------------------------------------------------- --dtype int8


def _int8_dequantized(src: Path, dst: Path) -> Path:
    """``src`` with every linear weight replaced by its int8 per-channel dequantization, by the
    definition: ``s = max|w[n]| / 127``, ``q = round(w / s)``, ``w' = q * s`` (float64, then fp32)."""
    tensors = {}
    for key, w in _state_dict(src).items():
        if LINEAR.fullmatch(key):
            wd = w.double()
            s = (wd.abs().amax(1) / 127).float().double()
            w = (torch.round(wd / s[:, None]) * s[:, None]).float()
        tensors[key] = w
    return _copy_model(src, dst, tensors, None)


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_weights_score_as_transformers_on_their_dequantization(tiny_models, tmp_path, family):
    """``--dtype int8``: linear weights int8 with a scale per output channel (the rest bf16); the
    scores against transformers (fp32) on the int8-dequantized weights, within bf16's rounding.
    """
    path = tiny_models(family)
    engine = Engine.load(str(path), "spam", dtype="int8", calibration="none")
    lw = engine.decoder.layers[0]
    assert isinstance(lw.gate_up, QuantizedWeight) and lw.gate_up.data.dtype == torch.int8
    assert engine.decoder.embed.dtype == torch.bfloat16
    rows = dataset("sms_spam", 4)
    records = engine.score([Message(id=r["id"], fields=r) for r in rows])
    assert {r.model.dtype for r in records} == {"int8"}
    deq = Oracle(load_hf(str(_int8_dequantized(path, tmp_path / "deq"))), engine.tokenizer, engine.pack, prefix_cache=False)
    worst = 0.0
    for row, rec in zip(rows, records):
        for qid, lps in deq.score(row).items():
            probs = probabilities(lps)
            for label in lps:
                worst = max(worst, abs(rec.scores[qid].choices[label].probability - probs[label]))
    assert worst < 0.01, worst  # bf16 activations: ~2**-8 relative per rounding


def test_int8_scores_are_bitwise_batch_invariant_and_the_probe_covers_int8_gemms(tiny_models):
    engine = Engine.load(str(tiny_models("gemma3")), "spam", dtype="int8", calibration="none")
    msgs = [Message(id=str(i), fields={"text": t}) for i, t in enumerate([
        "WINNER!! You have been selected for a cash prize, call 09061701461 now",
        "Are we still meeting for lunch tomorrow at noon?",
        "Your account is locked. Verify at http://example.com within 24 hours or lose access",
    ])]
    packed = engine.score(msgs)
    assert packed[0].model.numerics.bits_probe == "passed"
    alone = [engine.score([m])[0] for m in msgs]
    split = at_budget(engine, 40).score(list(reversed(msgs)))[::-1]  # a pass smaller than a message
    for a, b, c in zip(packed, alone, split):
        assert a.digest == b.digest == c.digest
    from spinf_stream.models.numerics import _shapes

    assert any(isinstance(w, QuantizedWeight) for _, w, _, _ in _shapes(engine.decoder))


def test_score_command_runs_int8_on_the_cpu(tiny_models, tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b'{"id": "a", "text": "Free entry to win a prize"}\n')
    cmd = [sys.executable, "-m", "spinf_stream.cli", "score", "--model", str(tiny_models("qwen3")), "--pack", "spam",
           "--device", "cpu", "--dtype", "int8", "--input", str(src), "--output", str(dst)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    (rec,) = [orjson.loads(x) for x in dst.read_bytes().splitlines()]
    assert rec["model"]["dtype"] == "int8" and rec["model"]["device"] == "cpu"
