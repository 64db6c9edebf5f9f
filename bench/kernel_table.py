"""Every Triton kernel the GPU engine launches, compiled for every GPU architecture the product
names, on this machine (no GPU): shared memory, registers, spills and tensor-core instructions.

    python bench/kernel_table.py                      # all models, dtypes and architectures: a table
    python bench/kernel_table.py --json               # one JSON line per compiled kernel
    python bench/kernel_table.py --models qwen3-8b --archs 90 --write docs/kernels.md

The engine runs for real on random-free, uninitialised weights of each model's real shape (one
layer of each attention kind), on a small workload that exercises what a real one does: a batch
of documents and questions, documents split across passes (content carried), and extraction
decode steps. Inside :func:`spinf_stream.kernels.aot.compiling_for` each launch compiles for the
architecture and returns without running, so the kernels, constexprs and launch options are
exactly those the engine picks on that GPU. ``tests/test_kernel_targets.py`` checks the reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.pop("TRITON_INTERPRET", None)  # the compiler, not the interpreter
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from spinf_stream.kernels.aot import ARCHS, KernelReport, compiling_for, inspect  # noqa: E402

def _gemma3(hidden: int, mlp: int, heads: int, kv_heads: int, head_dim: int, window: int, vocab: int = 262208,
            scalar: int | None = None) -> tuple[str, dict[str, Any]]:
    return ("Gemma3TextConfig", dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, query_pre_attn_scalar=scalar or head_dim, sliding_window=window))


#: name -> (transformers config class, its arguments): the real shapes of every supported family
#: and of the three shipped models, with one layer of each attention kind.
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3-270m": _gemma3(640, 2048, 4, 1, 256, 512, vocab=262144),
    "gemma3-1b": _gemma3(1152, 6912, 4, 1, 256, 512, vocab=262144),
    "gemma3-4b": _gemma3(2560, 10240, 8, 4, 256, 1024),
    "gemma3-12b": _gemma3(3840, 15360, 16, 8, 256, 1024),
    "gemma3-27b": _gemma3(5376, 21504, 32, 16, 128, 1024, scalar=168),
    "llama3-8b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)),
    "smollm2-135m": ("LlamaConfig", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
        tie_word_embeddings=True)),
    "qwen2.5-7b": ("Qwen2Config", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4)),
    "qwen2.5-coder-0.5b": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
        tie_word_embeddings=True)),
    "qwen3-8b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, tie_word_embeddings=False)),
    "mistral-7b": ("MistralConfig", dict(
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        sliding_window=None)),
}

#: The activations' dtypes the engine serves on a GPU ("fp8", "int8": float8 or int8 weights, bf16 activations),
#: and float32, which only the parity checks use (IEEE products, no tensor cores), on the models
#: of :data:`PARITY_MODELS`.
DTYPES = ("bfloat16", "float16", "fp8", "int8", "float32")
PARITY_MODELS = ("qwen2.5-coder-0.5b", "smollm2-135m")

#: A subset of :data:`MODELS` with every attention kind of the whole list (what CI compiles):
#: the kernels' variants depend on the head dim, the query heads per KV head (rounded up to a
#: power of two) and the window, never on the other sizes, which are runtime arguments.
COVERING = ("gemma3-270m", "gemma3-12b", "gemma3-27b", "qwen3-8b", "qwen2.5-7b", "qwen2.5-coder-0.5b", "smollm2-135m")


#: What CI compiles (tests/test_kernel_targets.py): fp16 is bf16's twin (the same tiles and
#: bytes), float32 serves parity checks only, sm_86 has sm_89's limits without fp8.
CI_DTYPES = ("bfloat16", "fp8", "int8")
CI_ARCHS = (80, 89, 90, 100, 120)


def attention_kinds(name: str) -> set[tuple[int, int, bool]]:
    """``(head dim, query heads per KV head rounded up to a power of two, windowed)`` of each of
    model ``name``'s attention layers: what picks the attention kernel's variant."""
    cfg = config(name)
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    types = getattr(cfg, "layer_types", None) or ["sliding_attention" if getattr(cfg, "sliding_window", None) else "full_attention"]
    windowed = {t == "sliding_attention" for t in types}
    return {(d, 1 << (group - 1).bit_length(), w) for w in windowed}


def config(name: str) -> Any:
    import transformers

    cls, kwargs = MODELS[name]
    extra: dict[str, Any] = {"num_hidden_layers": 1, "max_position_embeddings": 4096}
    if cls == "Gemma3TextConfig":
        extra.update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    return getattr(transformers, cls)(**kwargs, **extra)


def weights(cfg: Any) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, uninitialised (never read: no kernel runs)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return {k: torch.empty(v.shape, dtype=torch.bfloat16) for k, v in model.state_dict().items()}


#: The workloads each model runs (documents, token budget): the batch in one pass, each document
#: alone, and the batch over passes of fewer tokens than a document (content carried).
WORKLOADS = {"batch": (None, 4096), "alone": (0, 4096), "carried": (None, 24)}


def decoder_and_workload(name: str, dtype: str) -> tuple[Any, tuple[Any, ...]]:
    """Model ``name``'s decoder in ``dtype`` (uninitialised weights) and the workload it runs:
    ``(docs, n_choices, grammars)``. Neither depends on the architecture (kernels pick their
    variant at launch), so one serves every architecture."""
    from gpu_check import with_extractions, workload

    from spinf_stream.models import build_decoder, spec_for
    from spinf_stream.models.backend import make_backend

    cfg = config(name)
    act = dtype if dtype in ("fp8", "int8") else getattr(torch, dtype)
    decoder = build_decoder(spec_for(cfg), weights(cfg), dtype=act, device="cpu", backend=make_backend("triton"))
    docs = workload(cfg.vocab_size, 3, 40, 3, 5)
    docs, grammars = with_extractions(docs, cfg.vocab_size, 1, 5, 3)
    return decoder, (docs, [2] * len(docs[0].branches), grammars)


def variants(decoder: Any, work: tuple[Any, ...], sm: int) -> dict[str, dict[str, Any]]:
    """Run ``decoder`` on ``work`` (:func:`decoder_and_workload`) with every launch compiled for
    ``sm``, once per workload of :data:`WORKLOADS`: per workload, the compiled kernels by their
    hash (which covers the arguments' specialisation, the constexprs and the launch options)."""
    from spinf_stream.engine.runner import run_passes

    docs, n_choices, grammars = work
    out = {}
    for workload, (doc, budget) in WORKLOADS.items():
        with compiling_for(sm) as compiled:
            run_passes(decoder, docs if doc is None else docs[doc:doc + 1], budget, None, 0, n_choices, grammars)
        out[workload] = {k.hash: k for k in compiled}
    return out


def launches(decoder: Any, work: tuple[Any, ...], sm: int) -> list[tuple[KernelReport, list[str]]]:
    """The distinct kernels ``decoder`` compiled for ``sm`` over every workload, inspected, each
    with the workloads that compiled it."""
    seen: dict[str, Any] = {}
    where: dict[str, list[str]] = {}
    for workload, kernels in variants(decoder, work, sm).items():
        seen.update(kernels)
        for h in kernels:
            where.setdefault(h, []).append(workload)
    return [(inspect(k), where[h]) for h, k in seen.items()]


#: The markers between which ``--write`` puts the table.
BEGIN, END = "<!-- kernel_table -->", "<!-- /kernel_table -->"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per distinct (architecture, kernel, constexprs, launch options)."""
    out = ["| arch | kernel | dtype | models | constexprs | warps | stages | shared KiB | limit KiB | registers | spills (bytes) | MMA |",
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (r["sm"], r["kernel"], r["dtype"], json.dumps(r["constexprs"], sort_keys=True), r["num_warps"], r["num_stages"])
        merged.setdefault(key, {**r, "models": []})["models"].append(r["model"])
    for (sm, kernel, dtype, consts, warps, stages), r in sorted(merged.items()):
        shown = ", ".join(f"{k}={v}" for k, v in r["constexprs"].items() if k.isupper())
        out.append(f"| sm_{sm} | `{kernel.strip('_')}` | {dtype} | {', '.join(sorted(set(r['models'])))} | {shown} | {warps} | "
                   f"{stages} | {r['shared'] / 1024:.0f} | {ARCHS[sm].shared_limit / 1024:.0f} | {r['registers']} | "
                   f"{r['spill_bytes']} | {r['mma'] + (' fp8' if r['fp8_mma'] else '')} |")
    return "\n".join(out) + "\n"


def collect(models: list[str], dtypes: list[str], archs: list[int]) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        for dtype in dtypes:
            targets = [sm for sm in archs if dtype != "fp8" or ARCHS[sm].fp8]
            if not targets or dtype == "float32" and name not in PARITY_MODELS:
                continue
            decoder, work = decoder_and_workload(name, dtype)
            for sm in targets:
                for rep, workloads in launches(decoder, work, sm):
                    rows.append({"model": name, "dtype": dtype, **dataclasses.asdict(rep), "workloads": workloads})
            del decoder
    rows.sort(key=lambda r: (r["sm"], DTYPES.index(r["dtype"]), list(MODELS).index(r["model"])))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--archs", nargs="*", type=int, default=list(ARCHS), choices=list(ARCHS))
    ap.add_argument("--json", action="store_true", help="one JSON line per compiled kernel")
    ap.add_argument("--write", type=Path, help="write the markdown table into this file, between its markers")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = collect(args.models, args.dtypes, args.archs)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    elif args.write:
        text = args.write.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        args.write.write_text(text[:start] + "\n" + table(rows) + text[end:])
    else:
        print(table(rows))
    print(f"{len(rows)} kernels compiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
