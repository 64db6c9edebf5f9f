"""The tree-attention kernel alone on one NVIDIA GPU: milliseconds per launch over a real pass's
tree, for keys per step (BLOCK_N) and pipeline stages side by side. Installs nothing.

    python bench/attention_bench.py          # Gemma-3-12B (head dim 256) and Qwen3-8B (128) heads

The pass: gpu_check's workload (24 documents of 470 tokens, 56 questions of 13 tokens), planned
into passes of 16,384 tokens by the engine's own layout; the first pass is timed. Inputs are
seeded random bf16. Each setting prints one JSON line: ``ms`` (median of ``triton.testing.do_bench``),
and the output's largest difference from the engine's setting (different keys per step sum the
keys in another order: a few bf16 ulps, never more).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("attention_bench: no CUDA GPU visible", file=sys.stderr)
        return 2
    import triton
    from triton.testing import do_bench

    from gpu_check import workload
    from spinf_stream.engine.layout import build_pass, plan_passes
    from spinf_stream.kernels import TreeMask, rows_per_block

    ta = importlib.import_module("spinf_stream.kernels.tree_attention")
    dev = torch.device("cuda")
    prepared = workload(1000, 24, 470, 56, 13)
    layout = build_pass(plan_passes(prepared, 16384)[0], 0)
    T = layout.n_tokens
    print(json.dumps({"gpu": torch.cuda.get_device_name(dev), "triton": triton.__version__, "tokens": T,
                      "load": os.getloadavg()}), flush=True)
    engine_keys, engine_stages = ta.keys_per_step, ta.pipeline_stages
    for name, hq, hkv, d, window in (("gemma3-12b full", 16, 8, 256, None), ("gemma3-12b sliding", 16, 8, 256, 1024),
                                     ("qwen3-8b", 32, 8, 128, None), ("qwen2.5-7b", 28, 4, 128, None),
                                     ("gemma3-27b sliding", 32, 16, 128, 1024), ("qwen2.5-coder-0.5b", 14, 2, 64, None)):
        group = hq // hkv
        mask = TreeMask.from_segments(layout.segments, range(T), block_rows=rows_per_block(group)).to(dev)
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(T, hq, d, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(T, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(T, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
        run = lambda: ta.tree_attention_triton(q, k, v, mask, window=window)  # noqa: E731
        ref = run()
        for keys in (64, 32):
            for stages in (2, 1):
                ta.keys_per_step = lambda _dev, _d, n=keys: n
                ta.pipeline_stages = lambda *_a, s=stages: s
                try:
                    out = run()
                    ms = do_bench(run, warmup=25, rep=200)
                    line = {"shape": name, "head_dim": d, "window": window, "keys_per_step": keys, "stages": stages,
                            "ms": round(ms, 4), "max_abs_diff_vs_engine": float((out.float() - ref.float()).abs().max())}
                except Exception as e:  # noqa: BLE001 - out of shared memory: report it, go on
                    line = {"shape": name, "head_dim": d, "keys_per_step": keys, "stages": stages, "error": str(e)[:200]}
                finally:
                    ta.keys_per_step, ta.pipeline_stages = engine_keys, engine_stages
                line["engine"] = (keys, stages) == (engine_keys(dev, d), engine_stages(dev, d, 2))
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
