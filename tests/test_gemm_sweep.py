"""The GEMM sweep's candidates (``bench/gpu_sweep.py``), compiled with no GPU for Hopper (sm_90) and
datacenter Blackwell (sm_100) on every GEMM of both GPU-check models, plain, gated and adding
into the residual, bf16 and fp8: whichever one a GPU run picks is known to fit. Checked per compiled kernel: shared memory
within the architecture's limit, no register spills, the architecture's tensor-core family, fp8
operands on the tensor cores exactly in the fp8 GEMMs, and the persistent kernel's loads through
the tensor memory accelerator (``cp.async.bulk.tensor``) on both architectures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("triton")


@pytest.fixture(scope="module", params=[90, 100])
def compiled(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(REPO / ".cache" / "triton-aot")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_sweep.py"), "--compile", str(request.param)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, [json.loads(line) for line in done.stdout.splitlines()]


def _where(r: dict) -> str:
    return f"{r['kernel']} sm_{r['sm']} {r['dtype']} {r['candidate']} {r['constexprs']} ({', '.join(r['gemms'][:3])})"


def test_every_candidate_was_compiled_plain_and_gated(compiled: tuple[int, list[dict]]) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_sweep import CANDIDATES, candidates

    sm, rows = compiled
    got = {(r["dtype"], json.dumps(r["candidate"], sort_keys=True), r["constexprs"]["ACTIVATION"]) for r in rows}
    want = {(d, json.dumps(c.__dict__, sort_keys=True), a) for d, cs in candidates(sm).items() for c in cs for a in (0, 1)}
    assert got == want
    assert {r["constexprs"].get("RESIDUAL", False) for r in rows} == {False, True}
    # every dtype keeps the persistent kernel and at least one tile besides the fallback rule's
    for dtype, cs in candidates(sm).items():
        assert any(c.kernel == "tma" for c in cs) and len(cs) >= 3, (dtype, cs)
    assert set(CANDIDATES) == {"bfloat16", "fp8"}


def test_candidates_fit_shared_memory_and_registers(compiled: tuple[int, list[dict]]) -> None:
    from spinf_stream.kernels.aot import ARCHS

    sm, rows = compiled
    bad = [f"{_where(r)}: {r['shared']} B shared, {r['spill_bytes']} B spilled" for r in rows
           if r["shared"] > ARCHS[sm].shared_limit or r["spill_bytes"]]
    assert not bad, "\n".join(bad)


def test_candidates_use_the_architectures_tensor_cores_and_fp8_exactly_in_fp8(compiled: tuple[int, list[dict]]) -> None:
    from spinf_stream.kernels.aot import ARCHS

    sm, rows = compiled
    for r in rows:
        assert r["mma"] == ARCHS[sm].mma, _where(r)
        assert r["fp8_mma"] == (r["dtype"] == "fp8"), _where(r)


def test_the_persistent_kernel_loads_through_the_tensor_memory_accelerator(compiled: tuple[int, list[dict]]) -> None:
    sm, rows = compiled
    for r in rows:
        assert r["tma"] == (r["kernel"] == "_matmul_tma_kernel"), _where(r)
    assert any(r["tma"] for r in rows)
