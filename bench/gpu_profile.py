"""Where a pass's time goes on the GPU, op by op, beside the time model's floors
(``bench/gpu_time.py``). Run by ``bench/gpu_check.py --profile``; ``--tiny`` runs the same code on
the CPU through Triton's interpreter (CI).

Each back-end op of the engine's pass (every linear layer, norm, the gated MLP, attention) is
timed with CUDA events recorded around it on the stream (the CPU clock under ``--tiny``); the
time between two timed ops (rotary, copies, residual adds, an unfused activation, the LM head's
log-sum-exp) is charged to the op of the time model it belongs to. Lines:

- ``profile``: per op, calls, ms, share of the pass, achieved TFLOP/s and GB/s on the time
  model's FLOPs and fewest bytes, the floor and measured / floor;
- ``gemm_alone``: each GEMM shape of the pass alone, the engine's kernel against ``torch.mm``
  (bf16) or ``torch._scaled_mm`` with row and column scales (fp8), at the pass's rows;
- ``kernels``: the pass's kernels by name from ``torch.profiler`` (CUDA only).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import torch

#: Time between two timed ops, charged by the op it follows: which time-model op it belongs to.
GAP_OF = {
    "embed": "embed", "input_norm": "input_norm", "qkv": "rotary", "qk_norm": "rotary", "attention": "attention",
    "o": "attn_residual", "post_attn_norm": "attn_residual", "mlp_norm": "attn_residual", "gate_up": "activation",
    "down": "mlp_residual", "post_mlp_norm": "mlp_residual", "final_norm": "final_norm", "lm_head": "logsumexp",
}
#: The back end's methods timed, and which argument is the weight that names the op.
WEIGHT_ARG = {"linear": 1, "rms_norm": 1, "norm_into": 1, "gated_linear": 1, "add_linear": 2, "add_norm": 2}
#: A timed op's time-model op (the norms around the residual adds are one op there).
OP_OF = {"post_attn_norm": "attn_residual", "mlp_norm": "attn_residual", "post_mlp_norm": "mlp_residual"}


class Clock:
    """Marks on the device's stream (CUDA events) or the host clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a


def _names(decoder: Any) -> dict[int, str]:
    """Storage address of each weight (and the up half of gate/up) → the op it belongs to."""
    out: dict[int, str] = {}

    def add(w: Any, name: str) -> None:
        if w is None:
            return
        t = getattr(w, "data", w) if not isinstance(w, torch.Tensor) else w
        out[t.data_ptr()] = name

    for lw in decoder.layers:
        for name in ("qkv", "o", "down", "input_norm", "q_norm", "k_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"):
            add(getattr(lw, name), "qk_norm" if name in ("q_norm", "k_norm") else name)
        add(lw.gate_up, "gate_up")
        gu = getattr(lw.gate_up, "data", lw.gate_up)
        out[gu[gu.shape[0] // 2:].data_ptr()] = "gate_up"
    add(decoder.final_norm, "final_norm")
    add(decoder.lm_head, "lm_head")
    return out


class Profiler:
    """Wraps a decoder's back end so each op's time is recorded (one instance per decoder)."""

    def __init__(self, decoder: Any, device: torch.device) -> None:
        self.clock = Clock(device)
        self.names = _names(decoder)
        self.marks: list[tuple[str, Any, Any]] = []
        self.on = False
        b = decoder.backend
        for method in WEIGHT_ARG:
            setattr(b, method, self._timed(getattr(b, method), method))
        attention = b.attention

        def timed_attention(*a: Any, **k: Any) -> Any:
            attend = attention(*a, **k)
            return lambda *x, **y: self._span("attention", attend, x, y)

        b.attention = timed_attention
        self.backend = b

    def close(self) -> None:
        """Give the back end its own methods back."""
        for method in (*WEIGHT_ARG, "attention"):
            self.backend.__dict__.pop(method, None)

    def _label(self, method: str, args: tuple[Any, ...]) -> str:
        w = args[WEIGHT_ARG[method]]
        t = getattr(w, "data", w) if not isinstance(w, torch.Tensor) else w
        return "gate_up" if method == "gated_linear" else self.names.get(t.data_ptr(), method)

    def _timed(self, fn: Any, method: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            return self._span(self._label(method, args), fn, args, kwargs)
        return run

    def _span(self, label: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.on:
            return fn(*args, **kwargs)
        a = self.clock.mark()
        out = fn(*args, **kwargs)
        self.marks.append((label, a, self.clock.mark()))
        return out

    def measure(self, run: Any) -> tuple[float, dict[str, list[float]]]:
        """Run ``run()`` once with every op timed: (its seconds, op → [seconds per call])."""
        self.marks.clear()
        self.on = True
        start = self.clock.mark()
        run()
        end = self.clock.mark()
        self.on = False
        total = self.clock.seconds(start, end)
        per: dict[str, list[float]] = defaultdict(list)
        prev_label, prev_end = "embed", start
        for label, a, b in self.marks:
            per[GAP_OF.get(prev_label, "other")].append(self.clock.seconds(prev_end, a))
            per[OP_OF.get(label, label)].append(self.clock.seconds(a, b))
            prev_label, prev_end = label, b
        per[GAP_OF.get(prev_label, "other")].append(self.clock.seconds(prev_end, end))
        return total, per


def profile(shape: str, dtype: str, decoder: Any, prepared: list[Any], budget: int, device: torch.device,
            ceilings: dict[str, float]) -> list[dict[str, Any]]:
    """The ``profile`` lines of one (shape, dtype): the seed workload scored once, op by op."""
    from gpu_time import floor_s, ops, plan_of

    from spinf_stream.engine.runner import score_passes

    n_choices = [2] * len(prepared[0].branches)
    prof = Profiler(decoder, device)
    score_passes(decoder, prepared[:1], budget, None, 0, n_choices)  # compiled before timing
    try:
        total, per = prof.measure(lambda: score_passes(decoder, prepared, budget, None, 0, n_choices))
    finally:
        prof.close()
    spec = decoder.spec
    p = plan_of(prepared, budget, {ls.window for ls in spec.layers})
    model = {o.name: o for o in ops(spec, p, "fp8" if dtype == "fp8" else "bfloat16")}
    lines = []
    for op in sorted(per, key=lambda k: -sum(per[k])):
        s = sum(per[op])
        m = model.get(op)
        floor = floor_s(m, dtype, ceilings) if m is not None else None
        lines.append({
            "check": "profile", "shape": shape, "dtype": dtype, "op": op, "calls": len(per[op]), "ms": round(s * 1e3, 3),
            "share": round(s / total, 4), "tflops": round(m.flops / s / 1e12, 1) if m and m.flops and s else None,
            "gbps": round(m.bytes / s / 1e9, 1) if m and s else None,
            "floor_ms": None if floor is None else round(floor * 1e3, 3),
            "measured_over_floor": round(s / floor, 2) if floor else None,
        })
    lines.append({"check": "profile", "shape": shape, "dtype": dtype, "op": "pass", "calls": 1,
                  "ms": round(total * 1e3, 3), "share": 1.0})
    return lines


def gemm_alone(shape: str, dtype: str, decoder: Any, m: int, device: torch.device, reps: int = 5) -> list[dict[str, Any]]:
    """Each distinct GEMM of the pass at ``m`` rows: the engine's kernel against the library's."""
    from gpu_sweep import _time

    from spinf_stream.kernels import quantize_rows_triton
    from spinf_stream.models.ops import QuantizedWeight

    b = decoder.backend
    lw = decoder.layers[0]
    act = decoder.spec.activation
    out = []
    for name, w in (("qkv", lw.qkv), ("o", lw.o), ("gate_up", lw.gate_up), ("down", lw.down)):
        n, k = w.shape
        x = torch.randn(m, k, device=device, dtype=decoder.dtype)
        if name == "gate_up":
            ours = lambda: b.gated_linear(x, w, act)  # noqa: E731
        else:
            ours = lambda: b.linear(x, w)  # noqa: E731
        if isinstance(w, QuantizedWeight) and w.data.dtype == torch.float8_e4m3fn and device.type == "cuda":
            x8, sx = quantize_rows_triton(x)
            wt, sa, sb = w.data.t(), sx[:, None].contiguous(), w.scale.float()[None, :].contiguous()
            lib = lambda: torch._scaled_mm(x8, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
            lib_name = "torch._scaled_mm (row/column scales)"
        elif isinstance(w, QuantizedWeight):
            lib, lib_name = None, None
        else:
            lib, lib_name = (lambda: torch.mm(x, w.t())), "torch.mm"  # noqa: E731
        t_ours = _time(ours, device, reps)
        row = {"check": "gemm_alone", "shape": shape, "dtype": dtype, "gemm": name, "m": m, "n": n, "k": k,
               "ms": round(t_ours * 1e3, 4), "tflops": round(2 * m * n * k / t_ours / 1e12, 1),
               "gated": name == "gate_up"}
        if lib is not None:
            try:
                t_lib = _time(lib, device, reps)
                row.update(library=lib_name, library_ms=round(t_lib * 1e3, 4),
                           library_tflops=round(2 * m * n * k / t_lib / 1e12, 1), ours_over_library=round(t_lib / t_ours, 3))
            except Exception as e:  # noqa: BLE001 - a library without this variant: say so
                row.update(library=lib_name, library_error=f"{type(e).__name__}: {str(e)[:160]}")
        out.append(row)
    return out


def kernels(decoder: Any, prepared: list[Any], budget: int, device: torch.device, top: int = 15) -> dict[str, Any]:
    """The pass's kernels by name (``torch.profiler``, CUDA activity): calls and ms, the top ``top``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from spinf_stream.engine.runner import score_passes

    n_choices = [2] * len(prepared[0].branches)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        score_passes(decoder, prepared, budget, None, 0, n_choices)
        torch.cuda.synchronize(device)
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append({"kernel": e.key[:90], "calls": e.count, "ms": round(t / 1e3, 3)})
    rows.sort(key=lambda r: -r["ms"])
    return {"check": "kernels", "kernels": rows[:top], "total_ms": round(sum(r["ms"] for r in rows), 3)}


def table(lines: list[dict[str, Any]]) -> str:
    """The ``profile`` lines as a markdown table."""
    out = ["| shape | dtype | op | calls | ms | share | TFLOP/s | GB/s | floor ms | measured / floor |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in lines:
        cells = [r["shape"], r["dtype"], r["op"], r["calls"], r["ms"], f"{r['share']:.1%}", r.get("tflops"), r.get("gbps"),
                 r.get("floor_ms"), r.get("measured_over_floor")]
        out.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return "\n".join(out)


def emit(lines: list[dict[str, Any]]) -> None:
    for r in lines:
        print(json.dumps(r), flush=True)
