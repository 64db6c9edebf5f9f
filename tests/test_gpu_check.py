"""bench/gpu_check.py — the script run on a GPU machine — runs end to end here on a tiny shape
through Triton's interpreter (``--tiny``), with only what a bare GPU image has: torch, triton,
transformers (pydantic, orjson, platformdirs, aiokafka, interegular are hidden from it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

HIDDEN = ["pydantic", "pydantic_settings", "orjson", "platformdirs", "aiokafka", "opentelemetry", "interegular",
          "PIL", "av"]  # not in the GPU image
RUN = (
    "import sys, runpy\n"
    f"for m in {HIDDEN!r}: sys.modules[m] = None\n"
    "sys.argv = ['bench/gpu_check.py', '--tiny', '--profile', '--sweep', '--out', sys.argv[1]]\n"
    "runpy.run_path('bench/gpu_check.py', run_name='__main__')\n"
)


def test_gpu_check_runs_end_to_end_on_a_tiny_shape_without_the_service_dependencies(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    checks = {line.get("check"): line for line in lines if "check" in line}
    assert checks["parity_fp32_triton_vs_torch"]["ok"], checks["parity_fp32_triton_vs_torch"]
    assert checks["vision"]["digests_equal"] and checks["vision"]["images_per_s"] > 0, checks["vision"]
    assert "done" in checks
    # --profile: the pass op by op, every op's time counted once (the ops and the gaps between
    # them add up to the pass), each GEMM alone
    profile = [line for line in lines if line.get("check") == "profile"]
    assert {p["dtype"] for p in profile} == {"float32"}  # --tiny profiles its one float32 setting
    (whole,) = [p for p in profile if p["op"] == "pass"]
    ops = {p["op"]: p for p in profile if p["op"] != "pass"}
    assert {"qkv", "o", "gate_up", "down", "attention", "input_norm", "lm_head"} <= set(ops)
    assert abs(sum(p["ms"] for p in ops.values()) - whole["ms"]) <= 1e-3 * whole["ms"] + 0.05
    assert ops["gate_up"]["calls"] == ops["qkv"]["calls"] and all(p["floor_ms"] is not None for p in ops.values()
                                                                  if p["op"] != "other")
    assert [g["gemm"] for g in lines if g.get("check") == "gemm_alone"] == ["qkv", "o", "gate_up", "down"]
    # --sweep: every candidate measured passes parity and invariance; the winners are written
    sweep = [line for line in lines if line.get("check") == "gemm_sweep"]
    assert sweep and all(r.get("invariant") and r["rel_err"] < 1e-4 for r in sweep), sweep
    written = json.loads((tmp_path / "gemm_tiles.json").read_text())
    assert written["tiles"] == checks["gemm_tiles"]["tiles"]
    settings = [line for line in lines if "shape" in line and line.get("check") is None]
    assert {s["dtype"] for s in settings} == {"float32", "fp8", "int8"}
    for s in settings:
        for key in ("questions_per_s", "tokens_per_s", "tflops", "mfu", "peak_memory_gib", "digests_equal",
                    "ratio_vs_kv_reuse", "ratio_vs_prompt_per_question", "hf_kv_reuse_qps"):
            assert key in s, key
        assert s["digests_equal"] is True, s
        assert s["passes"] > s["documents"]  # the tiny budget splits every document over passes
    (x,) = [s["extraction"] for s in settings if s["extraction"]]  # issue 19's workload, once under --tiny
    assert x["digests_equal"] is True and x["extracted_tokens"] == x["hf_extracted_tokens"] == 3 * 2 * 3, x
    assert x["decode_passes"] == x["longest_extraction"] - 1 == 2, x  # one pass per step, all documents' tips
