"""The GEMM sweep: every candidate kernel and tile on every GEMM shape of both GPU-check models,
timed on this GPU; per (architecture, dtype, N, K) the fastest candidate that passes parity and
invariance wins. Run by ``bench/gpu_check.py --sweep`` (it installs the winners before the check
measures the pass, so one GPU call measures them) or alone:

    python bench/gpu_sweep.py [--tiny] [--out DIR]

Prints one JSON line per (shape, candidate) and a ``gemm_tiles`` line with the winners; with
``--out`` (gpu_check passes ``$OUT``) it writes them as ``gemm_tiles.json``, the file the next
commit copies to ``spinf_stream/kernels/gemm_tiles.json``. A shape no candidate passes keeps the
previous rule (``matmul.tile_config``'s fallback). ``--tiny`` runs the same code on small shapes
in Triton's interpreter (CI).

Parity: against the fp32 product of the same (dequantized) operands, max |Δ| / max |y| within
2e-2 (bf16 output) — the same bound for every candidate. Invariance: the rows of ``x[:37]`` and
of ``x`` reversed are bitwise the rows of the full ``x``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from spinf_stream.kernels.matmul import TileConfig, gated_config, install_tiles, launch, tile_config, tile_row  # noqa: E402
from spinf_stream.kernels.matmul_fp8 import FP8_BLOCK_K  # noqa: E402
from spinf_stream.kernels.rmsnorm import quantize_rows_triton  # noqa: E402

#: Candidates per dtype: the tiled kernel's tiles, and the persistent TMA kernel's (Hopper and
#: datacenter Blackwell only). Each an architecture takes (:func:`candidates`) is compiled for
#: sm_90 and sm_100 in CI without spills (tests/test_gemm_sweep.py), so any winner is known to fit.
CANDIDATES: dict[str, list[TileConfig]] = {
    "bfloat16": [
        TileConfig(128, 256, 64, 8, 3),
        TileConfig(128, 128, 64, 8, 4),
        TileConfig(128, 256, 64, 8, 3, "tma"),
        TileConfig(128, 256, 64, 8, 4, "tma"),
        TileConfig(128, 128, 64, 4, 5, "tma"),
        TileConfig(128, 128, 64, 8, 5, "tma", 16),
    ],
    "fp8": [
        TileConfig(128, 256, FP8_BLOCK_K, 8, 3),
        TileConfig(128, 128, FP8_BLOCK_K, 8, 4),
        TileConfig(128, 256, FP8_BLOCK_K, 8, 3, "tma"),
        TileConfig(128, 128, FP8_BLOCK_K, 8, 5, "tma"),
        TileConfig(128, 128, FP8_BLOCK_K, 8, 5, "tma", 16),
        # (128x256, 4 stages) and (128x128, 4 warps) spill 16 bytes in the gated fp8 GEMM on sm_90
    ],
}
#: Candidates an architecture cannot take (compiled with Triton 3.9): what they spill there.
EXCLUDED: dict[int, dict[str, list[TileConfig]]] = {
    100: {"fp8": [TileConfig(128, 256, FP8_BLOCK_K, 8, 3, "tma")]},  # 72 bytes plain, 16 gated
}


def candidates(sm: int) -> dict[str, list[TileConfig]]:
    """The candidates for compute capability ``sm`` (major * 10 + minor): the persistent kernel
    only on 9.x and 10.x, fp8 only from 8.9, less :data:`EXCLUDED`."""
    out = {}
    for dtype, configs in CANDIDATES.items():
        if dtype == "fp8" and sm < 89:
            continue
        skip = EXCLUDED.get(sm, {}).get(dtype, [])
        out[dtype] = [c for c in configs if c not in skip and (c.kernel != "tma" or sm // 10 in (9, 10))]
    return out


#: The interpreter's candidates (--tiny): the same kernels on small tiles.
TINY_CANDIDATES: dict[str, list[TileConfig]] = {
    "float32": [TileConfig(32, 32, 32, 4, 2), TileConfig(32, 64, 32, 4, 2, "tma"), TileConfig(32, 32, 32, 4, 2, "tma", 2)],
}


@dataclasses.dataclass(frozen=True)
class Gemm:
    """One GEMM of a pass: ``[m, k] @ [k, n]``; ``gated``: the gate/up GEMM (n = 2I, writes I)."""

    shape: str
    name: str
    m: int
    n: int
    k: int
    gated: bool = False
    residual: bool = False  #: adds into the residual stream (o and down of families without sandwich norms)


def gemms(tiny: bool) -> list[Gemm]:
    """The GEMMs of both models' passes at the seed workload's first-pass rows."""
    from gpu_check import configs
    from gpu_time import SEED, plan

    from spinf_stream.models import spec_for

    out = []
    for shape, config in configs(tiny).items():
        s = spec_for(config)
        seed = (3, 24, 6, 5, 40) if tiny else SEED
        p = plan(s.vocab_size, {None}, seed)
        m = -(-p.rows // p.passes)
        qkv = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        add = not s.sandwich_norms
        out += [Gemm(shape, "qkv", m, qkv, s.hidden_size),
                Gemm(shape, "o", m, s.hidden_size, s.num_heads * s.head_dim, residual=add),
                Gemm(shape, "gate_up", m, 2 * s.intermediate_size, s.hidden_size, True),
                Gemm(shape, "down", m, s.hidden_size, s.intermediate_size, residual=add)]
    return out


def _time(fn: Any, device: torch.device, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def operands(g: Gemm, dtype: str, device: torch.device, seed: int = 0) -> tuple[Any, ...]:
    """``(x, w, row scales, col scales, reference y in fp32)`` for ``g`` in ``dtype``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(g.m, g.k, generator=gen, device=device)
    w = torch.randn(g.n, g.k, generator=gen, device=device) * g.k**-0.5
    if dtype == "fp8":
        x8, sx = quantize_rows_triton(x.to(torch.bfloat16))
        sw = w.abs().amax(dim=1).clamp(min=1e-12) / 448.0
        w8 = (w / sw[:, None]).to(torch.float8_e4m3fn)
        ref = (x8.float() * sx[:, None]) @ (w8.float() * sw[:, None]).t()
        return x8, w8, sx, sw.float(), ref
    dt = torch.float32 if device.type == "cpu" else torch.bfloat16
    x, w = x.to(dt), w.to(dt)
    return x, w, None, None, x.float() @ w.float().t()


def reference(y: torch.Tensor, g: Gemm, act: str = "silu") -> torch.Tensor:
    """The GEMM's fp32 result as its kernel must write it (gated: silu(gate) * up)."""
    if not g.gated:
        return y
    gate, up = y.chunk(2, dim=1)
    return gate * torch.sigmoid(gate) * up


def run(g: Gemm, dtype: str, cfg: TileConfig, ops: tuple[Any, ...], device: torch.device,
        residual: bool = False) -> torch.Tensor:
    x, w, sx, sw, _ = ops
    out_dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    y = torch.empty(x.shape[0], g.n // 2 if g.gated else g.n, dtype=out_dtype, device=device)
    if residual:  # the residual stream the product is added to: zeros, so the result is the product
        y.zero_()
    launch(x, w, y, gated_config(cfg) if g.gated else cfg, sx, sw, "silu" if g.gated else None, residual=residual)
    return y


def sweep(tiny: bool, device: torch.device, reps: int = 5) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per candidate measured, the winners as ``gemm_tiles.json`` rows)."""
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)
    sm = cap[0] * 10 + cap[1]
    cands = TINY_CANDIDATES if tiny else candidates(sm)
    rows, winners = [], []
    for g in gemms(tiny):
        for dtype, configs in cands.items():
            ops = operands(g, dtype, device)
            want = reference(ops[4], g)
            fallback = tile_config(device, torch.float8_e4m3fn if dtype == "fp8" else ops[1].dtype, g.n,
                                   FP8_BLOCK_K if dtype == "fp8" else 64)
            best = None
            for cfg in [fallback, *[c for c in configs if c != fallback]]:
                try:
                    y = run(g, dtype, cfg, ops, device, g.residual)
                    err = float((y.float() - want).abs().max() / want.abs().max().clamp(min=1e-30))
                    sub = (ops[0][:37], *ops[1:2], None if ops[2] is None else ops[2][:37], ops[3], None)
                    rev = (ops[0].flip(0), *ops[1:2], None if ops[2] is None else ops[2].flip(0), ops[3], None)
                    invariant = (torch.equal(run(g, dtype, cfg, sub, device, g.residual), y[:37])
                                 and torch.equal(run(g, dtype, cfg, rev, device, g.residual).flip(0), y))
                    seconds = _time(lambda: run(g, dtype, cfg, ops, device, g.residual), device, reps)
                    row = {"check": "gemm_sweep", "shape": g.shape, "gemm": g.name, "dtype": dtype, "m": g.m, "n": g.n,
                           "k": g.k, **dataclasses.asdict(cfg), "ms": round(seconds * 1e3, 4),
                           "tflops": round(2 * g.m * g.n * g.k / seconds / 1e12, 2), "rel_err": err,
                           "invariant": invariant, "fallback": cfg == fallback}
                except Exception as e:  # noqa: BLE001 - a candidate that fails to build or run loses
                    row = {"check": "gemm_sweep", "shape": g.shape, "gemm": g.name, "dtype": dtype,
                           **dataclasses.asdict(cfg), "error": f"{type(e).__name__}: {str(e)[:200]}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
                ok = "error" not in row and row["invariant"] and row["rel_err"] <= 2e-2
                if ok and (best is None or row["ms"] < best[1]):
                    best = (cfg, row["ms"])
            if best is not None and best[0] != fallback:
                dt = torch.float8_e4m3fn if dtype == "fp8" else getattr(torch, dtype)
                winners.append(tile_row(sm, dt, g.n, g.k, best[0]))
    return rows, winners


def compile_candidates(sm: int) -> list[dict[str, Any]]:
    """Every candidate compiled for ``sm`` (no GPU: ``kernels.aot.compiling_for``) on every GEMM of
    both models, plain, gated and adding into the residual: one ``KernelReport`` row per distinct kernel variant, with the
    candidate and the shapes it was compiled for (tests/test_gemm_sweep.py reads them)."""
    from spinf_stream.kernels.aot import compiling_for, inspect

    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for dtype, configs in candidates(sm).items():
        for cfg in configs:
            for g in gemms(False):
                dt = torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16
                x = torch.empty(g.m, g.k, dtype=dt)
                w = torch.empty(g.n, g.k, dtype=dt)
                sx = torch.empty(g.m) if dtype == "fp8" else None
                sw = torch.empty(g.n) if dtype == "fp8" else None
                with compiling_for(sm) as compiled:
                    run(g, dtype, cfg, (x, w, sx, sw, None), torch.device("cpu"))
                    if g.name in ("o", "down"):  # as the engine runs them for Llama, Qwen and Mistral
                        run(g, dtype, cfg, (x, w, sx, sw, None), torch.device("cpu"), True)
                for k in compiled:
                    r = dataclasses.asdict(inspect(k))
                    key = (dtype, json.dumps(r, sort_keys=True))
                    row = seen.setdefault(key, {**r, "dtype": dtype, "candidate": dataclasses.asdict(cfg), "gemms": []})
                    row["gemms"].append(f"{g.shape} {g.name}")
    return list(seen.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small shapes in Triton's interpreter (CI)")
    ap.add_argument("--out", type=Path, help="write the winners there as gemm_tiles.json")
    ap.add_argument("--compile", type=int, metavar="SM", help="only compile every candidate for SM (no GPU) and "
                    "print what each kernel uses, one JSON line each")
    args = ap.parse_args(argv)
    if args.compile:
        for row in compile_candidates(args.compile):
            print(json.dumps(row), flush=True)
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    _, winners = sweep(args.tiny, device, 1 if args.tiny else 5)
    install(winners, args.out)
    return 0


def install(winners: list[dict[str, Any]], out: Path | None) -> None:
    """Print the winners, use them in this process, and write them under ``out``."""
    print(json.dumps({"check": "gemm_tiles", "tiles": winners}), flush=True)
    install_tiles(winners)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_tiles.json").write_text(json.dumps({"measured": "bench/gpu_sweep.py", "tiles": winners}, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
