"""Every Triton kernel the GPU engine launches, compiled for every GPU architecture the product
names (sm_80 to sm_120) at the real shapes of every supported family and shipped model, with no
GPU: Triton's own compiler, driven by the engine itself (``bench/kernel_table.py``).

CI compiles the models of ``COVERING`` (every attention kind of the whole list) in bf16, fp8 and int8
for sm_80, 89, 90, 100 and 120 (``CI_ARCHS``, ``CI_DTYPES``: 410 s of one worker in CI, cold, mostly compiling);
``bench/kernel_table.py`` alone does the whole list, fp16, fp32 and sm_86 too (docs/kernels.md).
Checked for each compiled kernel: shared memory within the architecture's limit; no register
spills (or a spill listed in ``JUSTIFIED`` with its reason); the architecture's tensor-core
instructions in every GEMM and attention kernel (``wgmma`` on Hopper, ``tcgen05`` on datacenter
Blackwell, ``mma.sync`` elsewhere); fp8 tensor-core instructions only where the architecture
has them, and the int8-weight GEMM widening its weights to bf16 tensor cores on every
architecture; FMA contraction as pinned (``FP_FUSION``), whatever Triton's default. And by
construction: the kernels compiled for a document alone, in a batch and split over passes are
the same variants (a second variant would be a second code path for one row).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

#: Spills allowed, by dtype: the reason. Every other kernel must fit its registers.
JUSTIFIED: dict[str, str] = {
    "float32": "parity checks only (head dim 64): IEEE fp32 products on CUDA cores, the widest tiles; "
               "slower, never wrong",
}

#: The kernels that multiply on tensor cores.
DOT_KERNELS = {"_matmul_kernel", "_tree_attention_kernel"}


def _collect(args: list[str], cache: Path) -> list[dict]:
    """``bench/kernel_table.py --json`` in a fresh process (no interpreter), compiled kernels kept
    in ``cache`` (Triton's cache, keyed by source and options: a changed kernel compiles anew)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Triton's default for FMA contraction set against the pinned value: the pin must win
    env.update(TRITON_CACHE_DIR=str(cache), TRITON_DEFAULT_FP_FUSION="0")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "kernel_table.py"), "--json", *args],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture(scope="module")
def reports() -> list[dict]:
    from kernel_table import CI_ARCHS, CI_DTYPES, COVERING

    return _collect(["--models", *COVERING, "--dtypes", *CI_DTYPES, "--archs", *map(str, CI_ARCHS)],
                    REPO / ".cache" / "triton-aot")


def test_the_models_compiled_hold_every_attention_kind_of_every_model() -> None:
    from kernel_table import COVERING, MODELS, attention_kinds

    every = set().union(*map(attention_kinds, MODELS))
    assert set().union(*map(attention_kinds, COVERING)) == every
    assert {d for d, _, _ in every} == {64, 128, 256} and {w for _, _, w in every} == {False, True}


def _where(r: dict) -> str:
    return f"{r['kernel']} sm_{r['sm']} {r['dtype']} {r['model']} {r['constexprs']} warps={r['num_warps']}"


def test_every_architecture_model_and_dtype_was_compiled(reports: list[dict]) -> None:
    from kernel_table import CI_ARCHS, CI_DTYPES, COVERING

    from spinf_stream.kernels.aot import ARCHS

    got = {(r["sm"], r["model"], r["dtype"]) for r in reports}
    want = {(sm, m, d) for sm in CI_ARCHS for m in COVERING for d in CI_DTYPES if d != "fp8" or ARCHS[sm].fp8}
    assert {80, 89, 90, 100, 120} <= set(CI_ARCHS) and {"bfloat16", "fp8", "int8"} <= set(CI_DTYPES)
    assert got == want
    assert {r["kernel"] for r in reports} == {"_matmul_kernel", "_rms_norm_kernel", "_logsumexp_kernel",
                                             "_tree_attention_kernel"}


def test_every_kernel_fuses_multiply_adds_as_pinned_whatever_tritons_default(reports: list[dict]) -> None:
    from spinf_stream.kernels._triton import FP_FUSION

    assert {r["fp_fusion"] for r in reports} == {FP_FUSION}


def test_shared_memory_fits_every_architecture(reports: list[dict]) -> None:
    from spinf_stream.kernels.aot import ARCHS

    over = [f"{_where(r)}: {r['shared']} B > {ARCHS[r['sm']].shared_limit} B" for r in reports
            if r["shared"] > ARCHS[r["sm"]].shared_limit]
    assert not over, "\n".join(over)


def test_no_kernel_spills_registers(reports: list[dict]) -> None:
    spills = [f"{_where(r)}: {r['spill_bytes']} B of local memory" for r in reports
              if r["spill_bytes"] and r["dtype"] not in JUSTIFIED]
    assert not spills, "\n".join(spills)


def test_gemm_and_attention_use_the_architectures_tensor_cores(reports: list[dict]) -> None:
    from spinf_stream.kernels.aot import ARCHS

    wrong = []
    for r in reports:
        if r["kernel"] not in DOT_KERNELS:
            assert r["mma"] == "none", _where(r)
            continue
        # float32 runs only the parity checks, with IEEE products: no tensor core computes those
        want = "none" if r["dtype"] == "float32" else ARCHS[r["sm"]].mma
        if r["mma"] != want:
            wrong.append(f"{_where(r)}: {r['mma']}, want {want}")
    assert not wrong, "\n".join(wrong)


def test_fp8_tensor_cores_exactly_where_the_architecture_has_them(reports: list[dict]) -> None:
    from spinf_stream.kernels.aot import ARCHS

    for r in reports:
        assert not r["fp8_mma"] or ARCHS[r["sm"]].fp8, _where(r)
        fp8_gemm = r["dtype"] == "fp8" and r["kernel"] == "_matmul_kernel" and r["constexprs"].get("ROW_SCALES")
        assert r["fp8_mma"] == bool(fp8_gemm), _where(r)


def test_int8_weights_are_widened_to_bf16_tensor_cores_on_every_architecture(reports: list[dict]) -> None:
    """--dtype int8 (W8A16): its linear layers' GEMM takes int8 weights (WIDEN_W) with per-channel
    scales (COL_SCALES) and no activation scales, on every architecture from sm_80; the MMA
    family is checked above (bf16 operands: no fp8 instructions)."""
    from kernel_table import CI_ARCHS

    int8 = [r for r in reports if r["dtype"] == "int8" and r["kernel"] == "_matmul_kernel"]
    widened = {r["sm"] for r in int8 if r["constexprs"].get("WIDEN_W")}
    assert widened == set(CI_ARCHS)
    for r in int8:
        c = r["constexprs"]
        assert bool(c.get("WIDEN_W")) == bool(c.get("COL_SCALES")) and not c.get("ROW_SCALES"), _where(r)
        assert not r["fp8_mma"], _where(r)


def test_one_variant_per_kernel_whatever_the_batch(reports: list[dict]) -> None:
    """A document alone, in a batch, and split over passes compiles the same kernel variants:
    no argument's value (a row count of 1, a length divisible by 16) picks another."""
    from kernel_table import WORKLOADS

    partial = [f"{_where(r)}: compiled only for {r['workloads']}" for r in reports
               if sorted(r["workloads"]) != sorted(WORKLOADS)]
    assert not partial, "\n".join(partial)
