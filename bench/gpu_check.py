"""The one script to run on a machine with one NVIDIA GPU: speed, invariance and parity of the GPU
engine on real model shapes with random weights. Installs nothing, downloads nothing.

    python bench/gpu_check.py                 # Qwen3-8B and Gemma-3-12B shapes, bf16, fp8 and int8 (7.3 min on one H200 before int8)
    python bench/gpu_check.py --non-invariant # also the same passes with cuBLAS GEMMs (the cost of invariance)
    python bench/gpu_check.py --tiny          # a tiny shape on the CPU through Triton's interpreter (CI runs this)
    python bench/gpu_check.py --sweep --profile --non-invariant --budget-s 380  # as bench/gpu_run.sh runs it

``--sweep`` (bench/gpu_sweep.py) first times every candidate GEMM kernel and tile on both models'
shapes and uses the winners for the rest of the run (and writes them under ``--out``);
``--profile`` (bench/gpu_profile.py) adds, per shape and dtype, the pass op by op beside the time
model's floors (bench/gpu_time.py, docs/gpu-time.md), each GEMM alone against the library's, and
the kernels by name. ``--budget-s`` skips what would start after that many seconds (a
``skipped`` line names it), so one call of a known length always ends with its lines written.

Workload (the seed's): 24 documents of 470 tokens, 56 questions of 13 tokens each with two
single-token choices, token budget 16,384 — seeded random token ids, so no tokenizer or weights
are needed. Models: random-weight Gemma-3-12B text (hidden 3840, 48 layers, 16 query / 8 KV heads,
head dim 256, MLP 15360, vocab 262144, sliding window 1024 on 5 of 6 layers) and Qwen3-8B (hidden
4096, 36 layers, 32 / 8 heads, head dim 128, MLP 12288, vocab 151936, q/k norms), built with
transformers' own classes so the baselines run the same weights.

The first line names the device, its architecture as the CI compile check knows it
(``kernels.aot.ARCHS``: shared memory limit, tensor-core family, fp8) and the kernel libraries;
after each shape, one line gives the kernels the run compiled, read as that check reads them.
int8 (``--dtype int8``: int8 weights, bf16 MMA) runs on any GPU of compute capability 8.0 or more.

First a small fp32 parity check of the Triton path against the torch path on the GPU. Then one
JSON line per (shape, setting): questions/s, tokens/s, achieved TFLOP/s and MFU against a GEMM
peak measured in this run (bf16 ``torch.mm`` 8192³; fp8 ``torch._scaled_mm``), peak GPU memory,
``digests_equal`` (every document scored alone = in the full batch = in reverse order = shuffled =
with a quarter of the token budget = with a budget below one document), and the
same workload through transformers on the same weights and GPU: (a) one prompt per question (one
question sampled per document) and (b) the document's KV cache reused for every question, as
ratios of questions/s. Then the same documents with 4 more questions that each generate 12 tokens (issue 19's workload;
``--tiny``: 2 of 3 tokens), as ``extraction`` in each line: questions/s of the whole pack,
extracted tokens/s, decode passes against the longest extraction, digests (choices and
extractions) equal alone, in the batch and reversed under a budget below one document, and the
ratio to (b) with one greedy ``generate`` call per extraction question. Last, ``vision``: a
random-weight Gemma 3 4B multimodal model (SigLIP tower, 256 soft tokens a picture) reading 16
documents of a picture between 40 text tokens with 20 questions each: images/s, questions/s, the
tower's seconds per picture, digests equal alone, in the batch, reversed and split. Goals on one H200 (issue 7): >= 1,500 q/s fp8 and >= 800 q/s bf16 on the
12B shape, >= 5x (b), MFU >= 50 %, digests equal, <= 5 % slower than ``--non-invariant``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

if "--tiny" in sys.argv:  # the kernels run in Triton's interpreter: set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from spinf_stream.engine.decoding import Grammars  # noqa: E402
from spinf_stream.engine.grammar import GrammarSpec, TokenGrammar  # noqa: E402
from spinf_stream.engine.runner import run_passes, score_passes  # noqa: E402
from spinf_stream.engine.layout import plan_passes  # noqa: E402
from spinf_stream.models import build_decoder, spec_for  # noqa: E402
from spinf_stream.models.backend import make_backend  # noqa: E402
from spinf_stream.models.decoder import Decoder  # noqa: E402
from spinf_stream.engine.segment import Branch, PreparedMessage  # noqa: E402

YES, NO = 5, 6  # the two choices' token ids


def configs(tiny: bool) -> dict[str, Any]:
    from transformers import Gemma3TextConfig, Qwen3Config

    if tiny:
        return {
            "tiny-gemma3": Gemma3TextConfig(
                vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, sliding_window=16, query_pre_attn_scalar=16,
                layer_types=["sliding_attention", "full_attention"], max_position_embeddings=2048,
            ),
        }
    return {
        "qwen3-8b": Qwen3Config(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
            rope_theta=1_000_000.0, tie_word_embeddings=False,
        ),
        "gemma3-12b": Gemma3TextConfig(
            vocab_size=262144, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
            num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
            sliding_window=1024, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 8,
            max_position_embeddings=131072, rope_theta=1_000_000.0,
        ),
    }


# ------------------------------------------------------------------------------------ workload


def workload(vocab: int, docs: int, doc_len: int, questions: int, q_len: int, seed: int = 0) -> list[PreparedMessage]:
    """``docs`` messages of random content, each asked the same ``questions`` (random tokens)."""
    rng = random.Random(seed)
    q_tokens = [tuple(rng.randrange(10, vocab) for _ in range(q_len)) for _ in range(questions)]
    branches = tuple(
        Branch(q, toks, tuple(range(-1, q_len - 1)), tuple(range(q_len)), (q_len - 1,), (((0, YES),), ((0, NO),)))
        for q, toks in enumerate(q_tokens)
    )
    return [
        PreparedMessage(i, f"doc{i}", tuple(rng.randrange(10, vocab) for _ in range(doc_len)), False, 0, branches)
        for i in range(docs)
    ]


@dataclasses.dataclass(frozen=True)
class FreeText:
    """What a decode step reads of a pack's extraction question: free text (``generate``) of
    ``max_tokens`` tokens, no none word; the stop string is never written (see :func:`grammars`)."""

    max_tokens: int
    kind: str = "generate"
    stop: str = "\n"
    none: str | None = None


def with_extractions(prepared: list[PreparedMessage], vocab: int, n: int, q_len: int, max_tokens: int,
                     seed: int = 5) -> tuple[list[PreparedMessage], Grammars]:
    """Each document with ``n`` more questions that generate ``max_tokens`` tokens (random question
    tokens), and their grammars over a vocabulary of ``<id>`` strings (no token holds the stop
    string, so every extraction writes exactly ``max_tokens`` tokens)."""
    rng = random.Random(seed)
    q0 = len(prepared[0].branches)
    extra = tuple(
        Branch(q0 + j, tuple(rng.randrange(10, vocab) for _ in range(q_len)), tuple(range(-1, q_len - 1)),
               tuple(range(q_len)), (q_len - 1,), ())
        for j in range(n)
    )
    out = [dataclasses.replace(m, branches=m.branches + extra, decode_tokens=n * (max_tokens - 1)) for m in prepared]
    words = tuple(f"<{i}>".encode() for i in range(vocab))
    g = TokenGrammar.build(GrammarSpec("text", none=None), words, set())
    spec = FreeText(max_tokens)
    return out, Grammars({q0 + j: spec for j in range(n)}, {q0 + j: g for j in range(n)}, words)  # type: ignore[arg-type]


def extraction_digests(sums: list[dict[int, list[float]]], extracted: list[dict[int, Any]]) -> list[str]:
    """Per document: the choices' logprobs and every extraction's answer and numbers."""
    out = []
    for s, x in zip(sums, extracted):
        h = hashlib.sha256(digest(s).encode())
        for q in sorted(x):
            h.update(repr(dataclasses.astuple(x[q])).encode())
        out.append(h.hexdigest())
    return out


def digest(sums: dict[int, list[float]]) -> str:
    h = hashlib.sha256()
    for q in sorted(sums):
        h.update(struct.pack(f"<{len(sums[q])}d", *sums[q]))
    return h.hexdigest()


# ----------------------------------------------------------------------------------- measuring


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(device: torch.device, dtype: str) -> float:
    """Best-of-5 FLOP/s of one large GEMM: bf16 ``torch.mm`` (fp32 on the CPU), or fp8 ``_scaled_mm``."""
    n = 8192 if device.type == "cuda" else 1024
    if dtype == "fp8":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        run = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32
        a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
        run = lambda: torch.mm(a, b)  # noqa: E731
    run()
    sync(device)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        run()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def model_flops(spec: Any, prepared: list[PreparedMessage], budget: int) -> float:
    """Useful FLOPs of the engine's passes: 2 x params x tokens + attention over each token's
    visible keys (window-capped) + the LM head at read rows (bench/engine_bench.py's formula)."""
    h, i, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    per_layer = h * (spec.num_heads + 2 * spec.num_kv_heads) * d + spec.num_heads * d * h + 3 * h * i
    params = spec.num_layers * per_layer
    total = 0.0
    for works in plan_passes(prepared, budget):
        for w in works:
            m = w.message
            n = len(m.content)
            keys = [m.prefix_len + j + 1 for j in range(n)] if w.with_content else []
            reads = 0
            for bi in w.branches:
                b = m.branches[bi]
                keys.extend(m.prefix_len + n + dd + 1 for dd in b.depths)
                reads += len(b.reads)
            total += 2.0 * params * len(keys) + 2.0 * h * spec.vocab_size * reads
            for ls in spec.layers:
                seen = sum(keys) if ls.window is None else sum(min(k, ls.window) for k in keys)
                total += 4.0 * spec.num_heads * d * seen
    return total


# ------------------------------------------------------------------------------- transformers


def hf_kv_reuse(model: Any, prepared: list[PreparedMessage], device: torch.device) -> tuple[int, float]:
    """(b): per document one forward with a cache, then each question's tokens over a copy of it."""
    asked, _, seconds = hf_kv_reuse_generate(model, prepared, None, device)
    return asked, seconds


def hf_kv_reuse_generate(model: Any, prepared: list[PreparedMessage], grammars: Grammars | None,
                         device: torch.device) -> tuple[int, int, float]:
    """(b), with extractions: per document one forward with a cache, then each choice question's
    tokens over a copy of it, and one greedy ``generate`` call per extraction question of
    ``grammars`` over a copy (exactly ``max_tokens`` tokens each). Returns (questions, tokens
    written, seconds)."""
    from transformers import DynamicCache

    sync(device)
    t0 = time.perf_counter()
    asked = written = 0
    with torch.inference_mode():
        for m in prepared:
            base = DynamicCache(config=model.config)
            model(torch.tensor([m.content], device=device), past_key_values=base, use_cache=True, logits_to_keep=1)
            n = len(m.content)
            for b in m.branches:
                cache = copy.deepcopy(base)
                ids = torch.tensor([m.content + b.tokens], device=device)
                spec = grammars.specs.get(b.question) if grammars else None
                if spec is None:
                    out = model(ids[:, n:], past_key_values=cache, use_cache=True, logits_to_keep=1,
                                position_ids=torch.arange(n, n + len(b.tokens), device=device)[None])
                    out.logits[0, -1].float().log_softmax(-1)[[YES, NO]].tolist()
                else:
                    got = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                         max_new_tokens=spec.max_tokens, min_new_tokens=spec.max_tokens,
                                         do_sample=False, pad_token_id=0)
                    written += got.shape[1] - ids.shape[1]
                asked += 1
    sync(device)
    return asked, written, time.perf_counter() - t0


def hf_prompt_per_question(model: Any, prepared: list[PreparedMessage], device: torch.device) -> tuple[int, float]:
    """(a): one whole prompt per question, no cache; one question sampled per document."""
    rng = random.Random(1)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for m in prepared:
            b = m.branches[rng.randrange(len(m.branches))]
            out = model(torch.tensor([m.content + b.tokens], device=device), use_cache=False, logits_to_keep=1)
            out.logits[0, -1].float().log_softmax(-1)[[YES, NO]].tolist()
    sync(device)
    return len(prepared), time.perf_counter() - t0


# ------------------------------------------------------------------------------------ the runs


def build(config: Any, device: torch.device, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """transformers' model of ``config`` with seeded random weights on ``device`` (bf16 on CUDA)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norm scales near their identity, weights small
            if p.ndim == 1:
                p.normal_(0.0, 0.05)
                if config.model_type != "gemma3_text":
                    p.add_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model, dict(model.state_dict())


def decoder_for(config: Any, sd: dict[str, torch.Tensor], dtype: str, device: torch.device, kernels: str) -> Decoder:
    torch_dtype: torch.dtype | str = dtype if dtype in ("fp8", "int8") else getattr(torch, dtype)
    return build_decoder(spec_for(config), sd, dtype=torch_dtype, device=device, backend=make_backend(kernels))


def parity_check(device: torch.device, tiny: bool = False) -> dict[str, Any]:
    """fp32: the Triton path against the torch path on the same device, a small Qwen3-like shape
    (``tiny``: 2 documents of 30 tokens, 3 questions; else 3 of 60, 6 questions)."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)
    _, sd = build(cfg, torch.device("cpu"), 3)
    sd = {k: v.to(device, torch.float32) for k, v in sd.items()}
    prepared = workload(1024, *((2, 30, 3) if tiny else (3, 60, 6)), 9, seed=3)
    n_choices = [2] * len(prepared[0].branches)
    triton = score_passes(decoder_for(cfg, sd, "float32", device, "triton"), prepared, 16384, None, 0, n_choices)[0]
    ref = score_passes(decoder_for(cfg, sd, "float32", device, "torch"), prepared, 16384, None, 0, n_choices)[0]
    worst = max(abs(a - b) for t, r in zip(triton, ref) for q in t for a, b in zip(t[q], r[q]))
    return {"check": "parity_fp32_triton_vs_torch", "device": str(device), "max_abs_dlogprob": worst, "ok": worst <= 1e-4}


def run_setting(
    name: str, config: Any, model: Any, sd: dict[str, torch.Tensor], dtype: str, kernels: str,
    prepared: list[PreparedMessage], budget: int, device: torch.device, peaks: dict[str, float],
    baselines: dict[str, tuple[int, float]], profile: bool = False,
) -> dict[str, Any]:
    decoder = decoder_for(config, sd, dtype, device, kernels)
    if profile:
        profile_setting(name, dtype, decoder, prepared, budget, device, peaks)
    n_choices = [2] * len(prepared[0].branches)
    score_passes(decoder, prepared[:1], budget, None, 0, n_choices)  # compile the kernels
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t0 = time.perf_counter()
    batch, stats = score_passes(decoder, prepared, budget, None, 0, n_choices)
    sync(device)
    seconds = time.perf_counter() - t0
    questions = sum(len(m.branches) for m in prepared)
    flops = model_flops(decoder.spec, prepared, budget)
    peak = peaks["fp8" if dtype == "fp8" else "bf16"]
    reverse = score_passes(decoder, prepared[::-1], budget, None, 0, n_choices)[0][::-1]
    alone = [score_passes(decoder, [m], budget, None, 0, n_choices)[0][0] for m in prepared]
    order = list(range(len(prepared)))
    random.Random(16).shuffle(order)
    shuffled_sums = score_passes(decoder, [prepared[i] for i in order], budget, None, 0, n_choices)[0]
    shuffled = [shuffled_sums[order.index(i)] for i in range(len(prepared))]
    # smaller budgets: a quarter of the batch per pass, and less than one document (its questions
    # spread over passes with its content carried)
    small = [budget // 4, max(prepared[0].n_tokens // 3, 8)]
    budgets = {b: score_passes(decoder, prepared, b, None, 0, n_choices)[0] for b in small}
    d_batch, d_rev, d_alone, d_shuf = ([digest(s) for s in sums] for sums in (batch, reverse, alone, shuffled))
    d_budgets = {b: [digest(s) for s in sums] for b, sums in budgets.items()}
    extraction = None
    if "kv_reuse_generate" in baselines:  # the same documents with extraction questions
        prepared_x, grammars = baselines["extraction_workload"]  # type: ignore[misc]
        n_x = [2] * len(prepared_x[0].branches)
        run_passes(decoder, prepared_x[:1], budget, None, 0, n_x, grammars)
        sync(device)
        t0 = time.perf_counter()
        sums_x, got_x, stats_x = run_passes(decoder, prepared_x, budget, None, 0, n_x, grammars)
        sync(device)
        seconds_x = time.perf_counter() - t0
        alone_x = [run_passes(decoder, [m], budget, None, 0, n_x, grammars)[:2] for m in prepared_x]
        small_x = run_passes(decoder, prepared_x[::-1], small[1], None, 0, n_x, grammars)[:2]
        d_x = extraction_digests(sums_x, got_x)
        d_alone_x = [extraction_digests(*a)[0] for a in alone_x]
        d_small_x = extraction_digests(small_x[0][::-1], small_x[1][::-1])
        bq, bt, bs = baselines["kv_reuse_generate"]
        q_x = sum(len(m.branches) for m in prepared_x)
        extraction = {
            "questions": q_x, "extraction_questions": len(grammars.specs), "seconds": round(seconds_x, 4),
            "questions_per_s": round(q_x / seconds_x, 1), "extracted_tokens": stats_x.extracted_tokens,
            "extracted_tokens_per_s": round(stats_x.extracted_tokens / seconds_x, 1),
            "decode_passes": stats_x.decode_passes, "longest_extraction": max(r.tokens for x in got_x for r in x.values()),
            "digests_equal": d_x == d_alone_x == d_small_x,
            "hf_kv_reuse_generate_qps": round(bq / bs, 2), "hf_extracted_tokens": bt,
            "ratio_vs_kv_reuse_generate": round((q_x / seconds_x) / (bq / bs), 2),
        }
    kv_q, kv_s = baselines["kv_reuse"]
    pp_q, pp_s = baselines["prompt_per_question"]
    qps = questions / seconds
    out = {
        "shape": name, "dtype": dtype, "kernels": kernels, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "documents": len(prepared), "questions": questions, "passes": stats.passes, "tokens": stats.tokens_computed,
        "seconds": round(seconds, 4), "questions_per_s": round(qps, 1), "tokens_per_s": round(stats.tokens_computed / seconds, 1),
        "tflops": round(flops / seconds / 1e12, 3), "peak_tflops": round(peak / 1e12, 3), "mfu": round(flops / seconds / peak, 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
        "digests_equal": d_batch == d_rev == d_alone == d_shuf and all(d == d_batch for d in d_budgets.values()),
        "digests_alone_vs_batch": sum(a == b for a, b in zip(d_alone, d_batch)),
        "digests_reverse_vs_batch": sum(a == b for a, b in zip(d_rev, d_batch)),
        "digests_shuffled_vs_batch": sum(a == b for a, b in zip(d_shuf, d_batch)),
        **{f"digests_budget_{b}_vs_batch": sum(a == c for a, c in zip(d, d_batch)) for b, d in d_budgets.items()},
        "hf_kv_reuse_qps": round(kv_q / kv_s, 1), "hf_prompt_per_question_qps": round(pp_q / pp_s, 2),
        "ratio_vs_kv_reuse": round(qps / (kv_q / kv_s), 2), "ratio_vs_prompt_per_question": round(qps / (pp_q / pp_s), 2),
        "extraction": extraction,
    }
    del decoder
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def profile_setting(name: str, dtype: str, decoder: Decoder, prepared: list[PreparedMessage], budget: int,
                    device: torch.device, peaks: dict[str, float]) -> None:
    """bench/gpu_profile.py's lines for one (shape, dtype): the pass op by op beside the time
    model's floors (on this run's peaks), each GEMM alone, the kernels by name."""
    import gpu_profile
    from gpu_time import H200

    ceilings = {"bf16_tflops": peaks["bf16"] / 1e12, "fp8_tflops": peaks["fp8"] / 1e12, "copy_tbps": H200["copy_tbps"]}
    label = "fp8" if dtype == "fp8" else dtype
    lines = gpu_profile.profile(name, label, decoder, prepared, budget, device, ceilings)
    gpu_profile.emit(lines)
    print(gpu_profile.table(lines), flush=True)
    m = sum(w.n_tokens for w in plan_passes(prepared, budget)[0])  # the first pass's rows
    gpu_profile.emit(gpu_profile.gemm_alone(name, label, decoder, m, device, 5 if device.type == "cuda" else 1))
    if device.type == "cuda":
        print(json.dumps({"shape": name, "dtype": label, **gpu_profile.kernels(decoder, prepared, budget, device)}), flush=True)


def vision_config(tiny: bool) -> Any:
    """Gemma 3 4B's multimodal architecture (SigLIP so400m at 896 pixels in 14-pixel patches, 256
    soft tokens a picture; text hidden 2560, 34 layers, 8 / 4 heads of 256, MLP 10240, sliding
    window 1024 on 5 of 6 layers), or a tiny one."""
    from transformers import Gemma3Config

    if tiny:
        vocab, layers, n = 512, 3, 4
        text = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    sliding_window=16, query_pre_attn_scalar=16, max_position_embeddings=2048)
        vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, image_size=20,
                      patch_size=5)
    else:
        vocab, layers, n = 262208, 34, 256
        text = dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                    sliding_window=1024, query_pre_attn_scalar=256, max_position_embeddings=131072, rope_theta=1_000_000.0)
        vision = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                      image_size=896, patch_size=14)
    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    return Gemma3Config(
        text_config={**text, "vocab_size": vocab, "num_hidden_layers": layers, "layer_types": kinds},
        vision_config={**vision, "layer_norm_eps": 1e-6}, mm_tokens_per_image=n,
        image_token_index=vocab - 1, boi_token_index=vocab - 3, eoi_token_index=vocab - 2,
    )


def vision_check(tiny: bool, device: torch.device, budget: int) -> dict[str, Any]:
    """Pictures with questions: each document is 20 tokens, a picture (its markers and soft
    tokens), 20 tokens, then 20 questions of 13 tokens (``--tiny``: 3 documents, 4 questions of 5).
    Images/s and questions/s of the engine (the tower's time included), the tower's seconds per
    picture, and digests equal alone, in the batch, reversed and under a budget below one document."""
    from transformers import Gemma3ForConditionalGeneration

    from spinf_stream.engine.segment import ImageSlot
    from spinf_stream.models.loader import text_names
    from spinf_stream.models.vision import ImageReader

    config = vision_config(tiny)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with device:
        model = Gemma3ForConditionalGeneration(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05 if p.ndim == 1 else 0.02)
    sd = text_names(dict(model.state_dict()))
    decoder = build_decoder(spec_for(config), sd, dtype=dtype, device=device, backend=make_backend("triton"))
    reader = ImageReader.from_config(config, sd)
    assert reader is not None
    decoder.vision = ImageReader(reader.format, reader.tower.to(device))
    del model
    vocab, n, side = config.text_config.vocab_size, config.mm_tokens_per_image, config.vision_config.image_size
    docs, questions, q_len = (3, 4, 5) if tiny else (16, 20, 13)
    plain = workload(vocab - 8, docs, 40, questions, q_len, seed=5)
    gen = torch.Generator().manual_seed(5)
    prepared = []
    for m in plain:
        content = (*m.content[:20], vocab - 3, *([vocab - 1] * n), vocab - 2, *m.content[20:])
        pixels = torch.rand(3, side, side, generator=gen) * 2 - 1
        prepared.append(dataclasses.replace(m, content=content, images=(ImageSlot(21, n, pixels),)))
    n_choices = [2] * questions
    score_passes(decoder, prepared[:1], budget, None, 0, n_choices)  # compile the kernels
    sync(device)
    t0 = time.perf_counter()
    decoder.vision.soft_tokens(prepared[0].images[0].image)
    sync(device)
    tower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch, stats = score_passes(decoder, prepared, budget, None, 0, n_choices)
    sync(device)
    seconds = time.perf_counter() - t0
    alone = [score_passes(decoder, [m], budget, None, 0, n_choices)[0][0] for m in prepared]
    reverse = score_passes(decoder, prepared[::-1], budget, None, 0, n_choices)[0][::-1]
    small = score_passes(decoder, prepared, max(prepared[0].n_tokens // 3, 8), None, 0, n_choices)[0]
    d = [[digest(s) for s in sums] for sums in (batch, alone, reverse, small)]
    return {
        "check": "vision", "shape": "tiny-gemma3-vl" if tiny else "gemma3-4b-vl", "dtype": str(dtype).removeprefix("torch."),
        "documents": docs, "questions": docs * questions, "passes": stats.passes, "tokens": stats.tokens_computed,
        "seconds": round(seconds, 4), "images_per_s": round(docs / seconds, 2),
        "questions_per_s": round(docs * questions / seconds, 1), "tower_seconds_per_image": round(tower_s, 4),
        "digests_equal": d[0] == d[1] == d[2] == d[3],
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
    }


def compiled_kernels() -> list[dict[str, Any]]:
    """Every Triton kernel compiled in this process so far, read as tests/test_kernel_targets.py
    reads the kernels it compiles (``spinf_stream.kernels.aot.inspect``: registers per thread and
    spilled bytes from ``cuobjdump -res-usage``, shared memory per block, constexprs, launch
    options, FMA contraction, tensor-core family and fp8 MMA from the PTX)."""
    import importlib

    from spinf_stream.kernels.aot import inspect

    out = []
    for mod, name in (("matmul", "_matmul_kernel"), ("rmsnorm", "_rms_norm_kernel"),
                      ("logsumexp", "_logsumexp_kernel"), ("tree_attention", "_tree_attention_kernel")):
        fn = getattr(importlib.import_module(f"spinf_stream.kernels.{mod}"), name)
        for caches in getattr(fn, "device_caches", {}).values():
            for k in caches[0].values():
                try:
                    out.append(dataclasses.asdict(inspect(k)))
                except Exception as e:  # noqa: BLE001 - one unreadable kernel must not end the check
                    out.append({"kernel": name, "error": f"{type(e).__name__}: {e}"})
    return out


def architecture(capability: tuple[int, int]) -> dict[str, Any]:
    """The device's architecture as the CI compile check knows it (``kernels.aot.ARCHS``): what
    its kernels must fit and use; ``known: false`` for one the check does not compile for."""
    from spinf_stream.kernels.aot import ARCHS

    sm = capability[0] * 10 + capability[1]
    a = ARCHS.get(sm)
    if a is None:
        return {"sm": sm, "known": False}
    return {"sm": sm, "known": True, "name": a.name, "shared_limit_bytes": a.shared_limit, "mma": a.mma, "fp8": a.fp8}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU through Triton's interpreter (CI)")
    ap.add_argument("--non-invariant", action="store_true", help="also run bf16 with cuBLAS GEMMs (not batch-invariant)")
    ap.add_argument("--baseline-docs", type=int, default=8, metavar="N",
                    help="documents the transformers baselines run over (their rate is per question; default 8)")
    ap.add_argument("--profile", action="store_true", help="the pass op by op, each GEMM alone, the kernels (gpu_profile.py)")
    ap.add_argument("--sweep", action="store_true", help="time every GEMM candidate first and use the winners (gpu_sweep.py)")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                    help="where --sweep writes gemm_tiles.json (default $OUT)")
    ap.add_argument("--budget-s", type=float, default=math.inf, metavar="S",
                    help="skip each part that would start after S seconds (a 'skipped' line names it)")
    ap.add_argument("--shapes", nargs="*", metavar="SHAPE",
                    help="subset of the shapes (default all): gemma3-12b, qwen3-8b, vision (Gemma 3 4B with "
                    "pictures); with --tiny: tiny-gemma3, vision")
    args = ap.parse_args(argv)
    shapes = configs(args.tiny)
    unknown = sorted(set(args.shapes or ()) - set(shapes) - {"vision"})
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}; use {', '.join(shapes)}")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type == "cpu" and not args.tiny:
        print("gpu_check: no CUDA GPU visible; use --tiny to run the check on the CPU", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    import triton

    info = {"check": "environment", "torch": torch.__version__, "triton": triton.__version__, "device": str(device)}
    fp8_ok = int8_ok = True
    if device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        info.update(gpu=torch.cuda.get_device_name(device), capability=f"{cc[0]}.{cc[1]}", arch=architecture(cc))
        fp8_ok = cc >= (8, 9)
        int8_ok = cc >= (8, 0)
    from spinf_stream.models.numerics import describe

    n = describe(device, "triton", torch.float32 if args.tiny else torch.bfloat16)
    info.update(numerics={"isa": n.isa, "library": n.library, "tiles": n.tiles})
    print(json.dumps(info), flush=True)
    print(json.dumps(parity_check(device, args.tiny)), flush=True)
    peaks = {"bf16": gemm_peak(device, "bf16")}
    if fp8_ok and device.type == "cuda":
        peaks["fp8"] = gemm_peak(device, "fp8")
    else:  # the interpreter emulates fp8: no tensor-core peak to compare with
        peaks["fp8"] = peaks["bf16"]
    def over(what: str) -> bool:
        spent = time.perf_counter() - t_start
        if spent > args.budget_s:
            print(json.dumps({"check": "skipped", "what": what, "seconds_spent": round(spent, 1)}), flush=True)
            return True
        return False

    if args.sweep and not over("sweep"):
        import gpu_sweep

        _, winners = gpu_sweep.sweep(args.tiny, device, 1 if args.tiny else 5)
        gpu_sweep.install(winners, args.out)
    if args.tiny:
        docs, doc_len, questions, q_len, budget = 3, 24, 6, 5, 40  # 40: every document split over two passes
        settings = [("float32", "triton"), ("fp8", "triton"), ("int8", "triton")]
    else:
        docs, doc_len, questions, q_len, budget = 24, 470, 56, 13, 16384
        settings = [("bfloat16", "triton")] + ([("fp8", "triton")] if fp8_ok else []) + ([("int8", "triton")] if int8_ok else [])
        if args.non_invariant:
            settings.append(("bfloat16", "cublas"))
    for name, config in sorted(shapes.items(), key=lambda kv: kv[0] != "gemma3-12b"):  # the 12B first
        if args.shapes and name not in args.shapes or over(name):
            continue
        model, sd = build(config, device, 0)
        prepared = workload(config.vocab_size, docs, doc_len, questions, q_len)
        few = prepared if args.tiny else prepared[:args.baseline_docs]  # rates per question: a subset will do
        baselines: dict[str, Any] = {
            "kv_reuse": hf_kv_reuse(model, few, device),
            "prompt_per_question": hf_prompt_per_question(model, few, device),
        }
        # the same documents with 4 extraction questions (12 tokens each; --tiny: 2 of 3 tokens)
        prepared_x, grammars = with_extractions(prepared, config.vocab_size, 2 if args.tiny else 4, q_len,
                                                3 if args.tiny else 12)
        baselines["extraction_workload"] = (prepared_x, grammars)
        baselines["kv_reuse_generate"] = hf_kv_reuse_generate(model, prepared_x if args.tiny else prepared_x[:args.baseline_docs],
                                                              grammars, device)
        for dtype, kernels in settings:
            if over(f"{name} {dtype} {kernels}"):
                continue
            plain = {k: baselines[k] for k in ("kv_reuse", "prompt_per_question")}
            given = plain if args.tiny and dtype != "float32" else baselines  # --tiny: extraction once
            line = run_setting(name, config, model, sd, dtype, kernels, prepared, budget, device, peaks, given,
                               profile=args.profile and kernels == "triton" and dtype in ("bfloat16", "fp8", "float32")
                               and (dtype == "float32" or not args.tiny))  # --tiny: the code path once
            print(json.dumps(line), flush=True)
        del model, sd
        if device.type == "cuda":
            torch.cuda.empty_cache()
            print(json.dumps({"check": "compiled_kernels", "shape": name, "kernels": compiled_kernels()}), flush=True)
    if (not args.shapes or "vision" in args.shapes) and not over("vision"):
        print(json.dumps(vision_check(args.tiny, device, budget)), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps({"check": "done", "seconds": round(time.perf_counter() - t_start, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
