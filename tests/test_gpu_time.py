"""bench/gpu_time.py, the GPU pass's time model (docs/gpu-time.md): its counts against the seed
workload's definition, its floors against the formula, and the doc as the command writes it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))


@pytest.fixture(scope="module")
def twelve_b():
    from gpu_check import configs
    from gpu_time import plan

    from spinf_stream.models import spec_for

    spec = spec_for(configs(False)["gemma3-12b"])
    return spec, plan(spec.vocab_size, {None, 1024})


def test_rows_reads_and_keys_are_the_seed_workloads(twelve_b) -> None:
    """24 documents of 470 tokens, 56 questions of 13 tokens: every content token j sees j + 1
    keys, a question's token at depth d sees 470 + d + 1 (its document and its own branch)."""
    _, p = twelve_b
    assert p.rows == 24 * 470 + 24 * 56 * 13
    assert p.reads == p.questions == 24 * 56
    content = sum(j + 1 for j in range(470))
    branch = 56 * sum(470 + d + 1 for d in range(13))
    assert p.keys[None] == 24 * (content + branch)
    assert p.keys[1024] == p.keys[None]  # no document is longer than the window
    per_pass = 16384 // (470 + 56 * 13)  # whole documents per pass under the budget: 13, then 11
    assert p.passes == 2 and p.head_groups == -(-per_pass * 56 // 256) + -(-(24 - per_pass) * 56 // 256)


def test_gemm_flops_and_floors_follow_their_definitions(twelve_b) -> None:
    from gpu_time import H200, floor_s, ops

    spec, p = twelve_b
    by = {o.name: o for o in ops(spec, p, "bfloat16")}
    h, i, L = spec.hidden_size, spec.intermediate_size, spec.num_layers
    qkv_n = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    assert by["qkv"].flops == 2.0 * p.rows * h * qkv_n * L
    assert by["gate_up"].flops == 2.0 * p.rows * h * 2 * i * L
    assert by["down"].flops == 2.0 * p.rows * i * h * L
    o = by["down"]
    assert floor_s(o, "bfloat16", H200) == max(o.flops / (H200["bf16_tflops"] * 1e12), o.bytes / (H200["copy_tbps"] * 1e12))
    fp8 = {o.name: o for o in ops(spec, p, "fp8")}
    assert floor_s(fp8["down"], "fp8", H200) < floor_s(o, "bfloat16", H200)  # fp8's peak and bytes
    assert by["activation"].bytes == 0 and by["qk_norm"].bytes == 0  # fused: nothing of their own


def test_the_doc_is_what_the_command_writes(tmp_path) -> None:
    doc = REPO / "docs" / "gpu-time.md"
    copy = tmp_path / "gpu-time.md"
    copy.write_text(doc.read_text())
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_time.py"), "--write", str(copy)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert copy.read_text() == doc.read_text(), "docs/gpu-time.md is stale: python bench/gpu_time.py --write docs/gpu-time.md"
