"""Fit and ship the calibrations of the pack library: for each pack with a ``data.yaml`` and each
model, run ``spinf-stream calibrate`` with every fitted method and keep the one with the lowest
cross-validated log loss (a proper scoring rule) as ``packs/<pack>/calibrations/<model>.json``, its
report as ``packs/<pack>/reports/<model>.json``. The decision target of binary questions is the
``target`` of the pack's ``data.yaml`` (default ``accuracy``). A pack of extraction questions only
has nothing to calibrate: its report is that of ``spinf-stream evaluate``.

    python bench/labelled_data.py
    python bench/calibrate_packs.py [--pack P ...] [--model M ...] [--cache .cache/logprobs] [--plots DIR]

With ``--cache`` (the default) every row is scored once per model and pack version; the other
methods and any rerun read the cache. ``--plots DIR`` writes the default model's diagrams into
``DIR/<pack>/``. Choosing among three methods by the same folds is a little optimistic; the
choice is printed with every method's numbers.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.packs import load_pack  # noqa: E402
MODELS = ("qwen2.5-coder-0.5b", "gemma-3-270m", "smollm2-135m")
METHODS = ("platt", "vector", "temperature", "matrix")


def _cv_log_loss(report: dict) -> float:
    """Mean cross-validated log loss over the labelled questions (inf when one has none)."""
    values = [q["calibrated"]["log_loss"] if q["calibrated"] else float("inf") for q in report["questions"].values()]
    return sum(values) / len(values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", action="append", help="pack name (repeatable; default: every pack with a data.yaml)")
    ap.add_argument("--model", action="append", help="model (repeatable; default: the three shipped models)")
    ap.add_argument("--labelled", type=Path, default=REPO / ".cache" / "labelled", help="bench/labelled_data.py's output folder")
    ap.add_argument("--cache", default=str(REPO / ".cache" / "logprobs"), help="logprob cache folder")
    ap.add_argument("--plots", type=Path, help="write the default model's plots into DIR/<pack>/")
    args = ap.parse_args(argv)
    packs = args.pack or sorted(p.parent.name for p in (REPO / "packs").glob("*/data.yaml"))
    for pack in packs:
        mapping = yaml.safe_load((REPO / "packs" / pack / "data.yaml").read_text(encoding="utf-8"))
        target = str(mapping.get("target", "accuracy"))
        if all(q.extract is not None for q in load_pack(REPO / "packs" / f"{pack}.yaml").expand()):
            for model in args.model or MODELS:  # nothing to calibrate: the report of evaluate
                rep = REPO / "packs" / pack / "reports" / f"{model}.json"
                subprocess.run([sys.executable, "-m", "spinf_stream.cli", "evaluate", "--pack", pack, "--model", model,
                                "--input", str(args.labelled / f"{pack}.jsonl"), "--calibration", "none", "--report", str(rep),
                                "--cache", args.cache, "--no-progress"], cwd=REPO, check=True)
                print(f"{pack} {model}: extraction only, evaluated", file=sys.stderr)
            continue
        for model in args.model or MODELS:
            best: tuple[float, str, Path, Path] | None = None
            tmp = Path(tempfile.mkdtemp(prefix="calibrate-"))
            for method in METHODS:
                cal, rep = tmp / f"{method}.json", tmp / f"{method}.report.json"
                cmd = [sys.executable, "-m", "spinf_stream.cli", "calibrate", "--pack", pack, "--model", model,
                       "--input", str(args.labelled / f"{pack}.jsonl"), "--method", method, "--target", target, "--output", str(cal),
                       "--report", str(rep), "--cache", args.cache, "--no-progress"]
                if args.plots and model == MODELS[0]:
                    cmd += ["--plots", str(tmp / f"plots-{method}")]
                subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                loss = _cv_log_loss(orjson.loads(rep.read_bytes()))
                print(f"{pack} {model} {method}: cross-validated log loss {loss:.4f}", file=sys.stderr)
                if best is None or loss < best[0]:
                    best = (loss, method, cal, rep)
            assert best is not None
            for sub, src in (("calibrations", best[2]), ("reports", best[3])):
                (REPO / "packs" / pack / sub).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, REPO / "packs" / pack / sub / f"{model}.json")
            if args.plots and model == MODELS[0]:
                out = args.plots / pack
                shutil.rmtree(out, ignore_errors=True)
                # the reliability diagrams only: the histograms add little beside them in docs/
                shutil.copytree(tmp / f"plots-{best[1]}", out, ignore=shutil.ignore_patterns("*.histogram.png"))
            shutil.rmtree(tmp)
            print(f"{pack} {model}: shipped {best[1]}", file=sys.stderr)
    # the k8s ConfigMap carries the shipped calibrations of the packs it holds: keep it in step
    subprocess.run([sys.executable, str(REPO / "deploy" / "k8s" / "packs_configmap.py")], cwd=REPO, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
