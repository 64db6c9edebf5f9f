"""The time model of the engine's GPU pass: every op of one layer and of the head, its FLOPs, the
fewest bytes it must move, and its floor on measured ceilings. No GPU, no weights: arithmetic on
the seed workload's plan (``bench/gpu_check.py``'s: 24 documents of 470 tokens, 56 questions of
13 tokens, budget 16,384) at the real model shapes.

    python bench/gpu_time.py                          # the tables, on stdout
    python bench/gpu_time.py --write docs/gpu-time.md # regenerate the doc (between its markers)
    python bench/gpu_time.py --json                   # one JSON line per (shape, dtype, op)

An op's floor is ``max(FLOPs / GEMM peak, bytes / copy bandwidth)``: what it costs if it ran at
the tensor cores' measured peak or moved its fewest bytes at the measured copy rate, whichever is
slower. "Fewest bytes" is what the op must read and write once fused as far as the engine's
design allows: a linear layer reads its input and weight once and writes its output once; a norm,
an activation or a residual add fused into a neighbour moves nothing of its own (``fused`` below
says into what). ``bench/gpu_check.py --profile`` prints each op's measured time beside this floor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

#: The H200's ceilings measured on 2026-12-04 (bench/gpu/h200-2026-12-04.jsonl: peak_tflops of
#: the bf16 and fp8 lines; copy bandwidth ~4.3 TB/s, ../shared/MACHINES.md).
H200 = {"bf16_tflops": 745.506, "fp8_tflops": 1325.956, "copy_tbps": 4.3}
#: The seed workload (bench/gpu_check.py): documents, tokens each, questions, tokens each, budget.
SEED = (24, 470, 56, 13, 16384)
#: Read rows whose logits one LM-head GEMM holds (spinf_stream.models.ops.HEAD_GROUP).
HEAD_GROUP = 256


@dataclasses.dataclass(frozen=True)
class Op:
    """One op of the pass, summed over every layer and every pass of the workload."""

    name: str  #: the name the profile uses (bench/gpu_profile.py)
    what: str
    calls: int  #: launches over the workload if unfused
    flops: float
    bytes: float  #: fewest bytes moved
    gemm: bool  #: whether its FLOPs run on the tensor cores (floor on the GEMM peak)
    fused: str = ""  #: where its traffic goes once fused ("": an op of its own)


@dataclasses.dataclass(frozen=True)
class Passes:
    """What the workload's plan holds, summed over its passes."""

    passes: int
    rows: int  #: rows computed (content + branch tokens)
    reads: int  #: rows whose logits are read
    head_groups: int  #: LM-head GEMM launches (HEAD_GROUP read rows each)
    keys: dict[int | None, int]  #: per window (None: full), keys seen summed over rows
    questions: int


def plan(vocab: int, windows: set[int | None], seed: tuple[int, ...] = SEED) -> Passes:
    """Rows, read rows and keys seen of the seed workload as the engine lays it out."""
    from gpu_check import workload

    docs, doc_len, questions, q_len, budget = seed
    return plan_of(workload(vocab, docs, doc_len, questions, q_len), budget, windows)


def plan_of(prepared: list[Any], budget: int, windows: set[int | None]) -> Passes:
    """:func:`plan` of given prepared messages."""
    from spinf_stream.engine.layout import plan_passes

    passes = plan_passes(prepared, budget)
    rows = reads = groups = 0
    keys = {w: 0 for w in windows}
    for works in passes:
        seen: list[int] = []
        pass_reads = 0
        for w in works:
            m = w.message
            n = len(m.content)
            if w.with_content:
                seen.extend(m.prefix_len + j + 1 for j in range(n))
            for bi in w.branches:
                b = m.branches[bi]
                seen.extend(m.prefix_len + n + d + 1 for d in b.depths)
                pass_reads += len(b.reads)
        rows += len(seen)
        reads += pass_reads
        groups += math.ceil(pass_reads / HEAD_GROUP)
        for win in windows:
            keys[win] += sum(seen) if win is None else sum(min(k, win) for k in seen)
    return Passes(len(passes), rows, reads, groups, keys, sum(len(m.branches) for m in prepared))


def ops(spec: Any, p: Passes, dtype: str) -> list[Op]:
    """The pass's ops for ``spec`` in ``dtype`` (``bfloat16`` or ``fp8``: fp8 weights, activations
    quantized per row where they are produced, bf16 elsewhere)."""
    a = 2  # bytes of an activation element (bf16)
    wb = 1 if dtype == "fp8" else 2  # bytes of a weight element
    xb = 1 if dtype == "fp8" else 2  # bytes of a GEMM input element (fp8: quantized by its producer)
    m, h, i, d = p.rows, spec.hidden_size, spec.intermediate_size, spec.head_dim
    hq, hkv, L = spec.num_heads, spec.num_kv_heads, spec.num_layers
    qkv_n = (hq + 2 * hkv) * d
    sand = spec.sandwich_norms
    scale_b = 4 * m if dtype == "fp8" else 0  # one fp32 scale per row of a quantized input

    def gemm(name: str, what: str, n: int, k: int, rows: int, reps: int, calls: int, in_b: int = xb,
             out_b: int = a, weight_reads: int = 1) -> Op:
        return Op(name, what, calls, 2.0 * rows * n * k * reps,
                  reps * (rows * k * in_b + weight_reads * n * k * wb + rows * n * out_b + (4 * rows if in_b == 1 else 0)),
                  True)

    seen = {ls.window for ls in spec.layers}
    per_window = {w: sum(1 for ls in spec.layers if ls.window == w) for w in seen}
    attn_flops = sum(4.0 * hq * d * p.keys[w] * n for w, n in per_window.items())
    out: list[Op] = [
        Op("embed", "embedding gather (x embed scale) + rotary tables", 1, 0.0, m * h * a + m * h * a, False),
        Op("input_norm", "RMSNorm before attention" + (" (+ fp8 quantize)" if dtype == "fp8" else ""), L * p.passes,
           0.0, L * (m * h * a + m * h * xb + scale_b), False),
        gemm("qkv", f"q/k/v projection [M, {h}] @ [{h}, {qkv_n}]", qkv_n, h, m, L, L * p.passes, out_b=a),
    ]
    if spec.qk_norm:
        out.append(Op("qk_norm", "q and k RMSNorm per head", 2 * L * p.passes, 0.0, 0.0, False,
                      fused="the q/k/v GEMM's epilogue or the rotary pass"))
    out += [
        Op("rotary", "rotary on q and k, v copied beside them", 2 * L * p.passes, 0.0,
           L * (2 * m * (hq + hkv) * d * a + m * d * 4), False),
        Op("attention", f"tree attention, {hq} query / {hkv} KV heads of {d}", L * p.passes, attn_flops,
           L * (2 * m * hq * d * a + 2 * m * hkv * d * a), True),
        gemm("o", f"attention output [M, {hq * d}] @ [{hq * d}, {h}]", h, hq * d, m, L, L * p.passes, in_b=xb),
        Op("attn_residual", ("post-attention RMSNorm, residual add, " if sand else "residual add, ")
           + "pre-MLP RMSNorm" + (" (+ fp8 quantize)" if dtype == "fp8" else ""),
           (3 if sand else 2) * L * p.passes, 0.0, L * (m * h * a * 3 + m * h * xb + scale_b), False),
        gemm("gate_up", f"gate and up [M, {h}] @ [{h}, 2 x {i}], writing {spec.activation}(gate) * up"
             + (" in fp8" if dtype == "fp8" else ""), 2 * i, h, m, L, 2 * L * p.passes, out_b=0),
        Op("activation", f"{spec.activation}(gate) * up" + (" (+ fp8 quantize)" if dtype == "fp8" else ""),
           L * p.passes, 0.0, 0.0, False, fused="the gate/up GEMM's epilogue"),
        gemm("down", f"down [M, {i}] @ [{i}, {h}]", h, i, m, L, L * p.passes, in_b=xb),
        Op("mlp_residual", ("post-MLP RMSNorm, " if sand else "") + "residual add", (2 if sand else 1) * L * p.passes,
           0.0, L * m * h * a * 3, False),
        Op("final_norm", "final RMSNorm at the read rows", p.passes, 0.0, 2 * p.reads * h * a, False),
        gemm("lm_head", f"LM head [reads, {h}] @ [{h}, {spec.vocab_size}] (fp32 logits)", spec.vocab_size, h, p.reads, 1,
             p.head_groups, in_b=a, out_b=4, weight_reads=0),
        Op("logsumexp", "log-sum-exp over the vocabulary at each read row", p.head_groups, 0.0,
           p.reads * spec.vocab_size * 4, False),
    ]
    # the gate/up GEMM writes only the product (one [M, I] tensor); the LM head reads its (bf16)
    # weight once per group of HEAD_GROUP read rows
    k = next(j for j, o in enumerate(out) if o.name == "gate_up")
    out[k] = dataclasses.replace(out[k], bytes=out[k].bytes + L * (m * i * xb + scale_b))
    head = out[-2]
    out[-2] = dataclasses.replace(head, bytes=head.bytes + p.head_groups * spec.vocab_size * h * a)
    return out


def floor_s(op: Op, dtype: str, ceilings: dict[str, float]) -> float:
    """Seconds the op takes at least on ``ceilings`` (fused ops: only their own bytes)."""
    peak = ceilings["fp8_tflops" if dtype == "fp8" and op.name not in ("attention", "lm_head") else "bf16_tflops"]
    return max(op.flops / (peak * 1e12) if op.gemm else 0.0, op.bytes / (ceilings["copy_tbps"] * 1e12))


def measured(path: Path) -> dict[tuple[str, str, str], float]:
    """Seconds of the seed workload measured by a gpu_check run: (shape, dtype, kernels) -> s."""
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                if "shape" in r and "seconds" in r and "kernels" in r:
                    out[(r["shape"], r["dtype"], r["kernels"])] = r["seconds"]
    return out


def tables(ceilings: dict[str, float], runs: dict[tuple[str, str, str], float]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown tables and the same as JSON rows."""
    from gpu_check import configs

    from spinf_stream.models import spec_for

    md: list[str] = []
    rows: list[dict[str, Any]] = []
    for shape, config in configs(False).items():
        spec = spec_for(config)
        p = plan(spec.vocab_size, {ls.window for ls in spec.layers})
        md += [f"### {shape}", "",
               f"{p.passes} passes, {p.rows:,} rows computed, {p.reads:,} read rows ({p.head_groups} LM-head groups), "
               f"{p.questions:,} questions; {spec.num_layers} layers, hidden {spec.hidden_size}, MLP "
               f"{spec.intermediate_size}, {spec.num_heads}/{spec.num_kv_heads} heads of {spec.head_dim}, "
               f"vocabulary {spec.vocab_size:,}.", "",
               "| op | what | launches unfused | GFLOP | fewest MB | floor bf16 ms | floor fp8 ms | share of the fp8 floor |",
               "|---|---|---:|---:|---:|---:|---:|---:|"]
        per = {dt: ops(spec, p, dt) for dt in ("bfloat16", "fp8")}
        totals = {dt: sum(floor_s(o, dt, ceilings) for o in per[dt]) for dt in per}
        for ob, o8 in zip(per["bfloat16"], per["fp8"]):
            fb, f8 = floor_s(ob, "bfloat16", ceilings), floor_s(o8, "fp8", ceilings)
            what = ob.what + (f" — fused into {ob.fused}: moves nothing of its own" if ob.fused else "")
            md.append(f"| `{ob.name}` | {what} | {ob.calls:,} | {ob.flops / 1e9:,.0f} | {ob.bytes / 1e6:,.0f} | "
                      f"{fb * 1e3:,.2f} | {f8 * 1e3:,.2f} | {f8 / totals['fp8']:.1%} |")
            for dt, o, f in (("bfloat16", ob, fb), ("fp8", o8, f8)):
                rows.append({"shape": shape, "dtype": dt, "op": o.name, "calls": o.calls, "flops": o.flops,
                             "bytes": o.bytes, "floor_ms": round(f * 1e3, 4), "fused": bool(o.fused)})
        useful = sum(o.flops for o in per["bfloat16"])
        md += ["", "| dtype | floor s | q/s at the floor | useful TFLOP/s at the floor | measured s (H200, 2026-12-04) | "
               "measured / floor |", "|---|---:|---:|---:|---:|---:|"]
        for dt, label in (("bfloat16", "bf16"), ("fp8", "fp8")):
            t = totals[dt]
            got = runs.get((shape, dt, "triton"))
            md.append(f"| {label} | {t:.3f} | {p.questions / t:,.0f} | {useful / t / 1e12:,.0f} | "
                      f"{'' if got is None else f'{got:.3f}'} | {'' if got is None else f'{got / t:.2f}'} |")
        got = runs.get((shape, "bfloat16", "cublas"))
        if got is not None:
            md.append(f"| bf16, cuBLAS GEMMs | {totals['bfloat16']:.3f} | | | {got:.3f} | {got / totals['bfloat16']:.2f} |")
        md.append("")
    return "\n".join(md), rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", type=Path, metavar="DOC", help="replace the tables between DOC's gpu_time markers")
    ap.add_argument("--json", action="store_true", help="JSON lines instead of markdown")
    ap.add_argument("--bf16-tflops", type=float, default=H200["bf16_tflops"])
    ap.add_argument("--fp8-tflops", type=float, default=H200["fp8_tflops"])
    ap.add_argument("--copy-tbps", type=float, default=H200["copy_tbps"])
    ap.add_argument("--measured", type=Path, default=REPO / "bench" / "gpu" / "h200-2026-12-04.jsonl",
                    help="a gpu_check output whose seconds are shown beside the floors")
    args = ap.parse_args(argv)
    ceilings = {"bf16_tflops": args.bf16_tflops, "fp8_tflops": args.fp8_tflops, "copy_tbps": args.copy_tbps}
    md, rows = tables(ceilings, measured(args.measured))
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    head = (f"Ceilings: bf16 GEMM {ceilings['bf16_tflops']:,.0f} TFLOP/s, fp8 GEMM {ceilings['fp8_tflops']:,.0f} "
            f"TFLOP/s, copy {ceilings['copy_tbps']} TB/s.\n\n")
    if args.write is None:
        print(head + md)
        return 0
    doc = args.write.read_text()
    new, n = re.subn(r"(<!-- gpu_time -->\n).*?(<!-- /gpu_time -->)", lambda mt: mt[1] + head + md + mt[2], doc,
                     flags=re.S)
    if n != 1:
        print(f"{args.write}: no <!-- gpu_time --> ... <!-- /gpu_time --> markers", file=sys.stderr)
        return 2
    args.write.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
