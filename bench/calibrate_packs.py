"""Fit and ship the calibrations of the pack library: for each pack with a ``data.yaml`` and each
model, run ``spinf-stream calibrate`` with every fitted method and keep the one with the lowest
cross-validated log loss (a proper scoring rule) as ``packs/<pack>/calibrations/<model>.json``, its
report as ``packs/<pack>/reports/<model>.json``. The decision target of binary questions is the
``target`` of the pack's ``data.yaml`` (default ``accuracy``); each of its ``variants``
(``name: target``) ships the same method with another target as
``packs/<pack>/calibrations/<name>/<model>.json`` (``--calibration <name>``). An extraction question
labelled with and without values gets a map of its none decision, always decided by accuracy;
its report then adds ``calibrated_cv``: the extraction numbers when each fold's rows are scored
with a calibration fitted on the other folds (the decision changes what is written, so this
scores those rows again).

    spinf-stream labels --pack P   # for each pack P with a data.yaml
    python bench/calibrate_packs.py [--pack P ...] [--model M ...] [--cache .cache/logprobs] [--plots DIR]

A ``data.yaml`` with ``labelled_only: true`` scores its rows with only the labelled questions
(``calibrate --labelled-only``: a pack of ~100 questions that labels 4). With ``--cache`` (the
default) every row is scored once per model and pack version; the other
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
MODELS = ("qwen2.5-coder-0.5b", "gemma-3-270m", "smollm2-135m")
METHODS = ("platt", "vector", "temperature", "matrix")


def _cv_log_loss(report: dict) -> float:
    """Mean cross-validated log loss over the labelled questions and the extraction questions' none
    decisions (inf when one has none)."""
    qs = [*report["questions"].values(),
          *(e["none_decision"] for e in report.get("extractions", {}).values() if "none_decision" in e)]
    values = [q["calibrated"]["log_loss"] if q["calibrated"] else float("inf") for q in qs]
    return sum(values) / len(values)


def cv_extractions(pack: str, model: str, method: str, labelled: Path, cache: str, folds: int = 5) -> dict[str, dict]:
    """Cross-validated numbers of the extraction questions that get a none map: each fold's rows
    are scored (``spinf-stream score``) with a calibration fitted on the other folds' rows, and
    the answers so decided are measured (``spinf_stream.quality.extraction_metrics``)."""
    sys.path.insert(0, str(REPO))
    from spinf_stream.labelled import read_labelled
    from spinf_stream.packs import load_pack
    from spinf_stream.quality import extraction_metrics

    questions = load_pack(REPO / "packs" / f"{pack}.yaml").expand()
    extract = {q.id for q in questions if q.extract is not None and q.extract.none is not None}
    lines = [orjson.loads(x) for x in labelled.read_bytes().splitlines() if x.strip()]
    rows = [{**r, "labels": {k: v for k, v in r["labels"].items() if k in extract}} for r in lines]
    rows = [r for r in rows if r["labels"]]
    if not rows:
        return {}
    tmp = Path(tempfile.mkdtemp(prefix="cv-extractions-"))
    expected: dict[str, list] = {}
    got: dict[str, list] = {}
    for f in range(folds):
        train = [r for i, r in enumerate(rows) if i % folds != f]
        test = [r for i, r in enumerate(rows) if i % folds == f]
        for name, part in (("train", train), ("test", test)):
            (tmp / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in part))
        run = [sys.executable, "-m", "spinf_stream.cli"]
        subprocess.run([*run, "calibrate", "--pack", pack, "--model", model, "--input", str(tmp / "train.jsonl"),
                        "--method", method, "--output", str(tmp / "cal.json"), "--cache", cache, "--no-progress"],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([*run, "score", "--pack", pack, "--model", model, "--input", str(tmp / "test.jsonl"),
                        "--output", str(tmp / "scores.jsonl"), "--calibration", str(tmp / "cal.json"), "--no-progress"],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        records = {r["id"]: r["scores"] for r in map(orjson.loads, (tmp / "scores.jsonl").read_bytes().splitlines())}
        for row in read_labelled(tmp / "test.jsonl", questions).rows:
            for qid, e in row.expected.items():
                expected.setdefault(qid, []).append(e)
                got.setdefault(qid, []).append(records[row.message.id][qid])
    shutil.rmtree(tmp)
    return {qid: extraction_metrics(expected[qid], got[qid]) for qid in expected
            if any("none_calibrated" in s for s in got[qid])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", action="append", help="pack name (repeatable; default: every pack with a data.yaml)")
    ap.add_argument("--model", action="append", help="model (repeatable; default: the three shipped models)")
    ap.add_argument("--labelled", type=Path, default=REPO / ".cache" / "labelled", help="spinf-stream labels output folder")
    ap.add_argument("--cache", default=str(REPO / ".cache" / "logprobs"), help="logprob cache folder")
    ap.add_argument("--plots", type=Path, help="write the default model's plots into DIR/<pack>/")
    args = ap.parse_args(argv)
    packs = args.pack or sorted(p.parent.name for p in (REPO / "packs").glob("*/data.yaml"))
    for pack in packs:
        mapping = yaml.safe_load((REPO / "packs" / pack / "data.yaml").read_text(encoding="utf-8"))
        target = str(mapping.get("target", "accuracy"))
        only = ["--labelled-only"] if mapping.get("labelled_only") else []  # data.yaml: score only the labelled questions
        for model in args.model or MODELS:
            best: tuple[float, str, Path, Path] | None = None
            tmp = Path(tempfile.mkdtemp(prefix="calibrate-"))
            for method in METHODS:
                cal, rep = tmp / f"{method}.json", tmp / f"{method}.report.json"
                cmd = [sys.executable, "-m", "spinf_stream.cli", "calibrate", "--pack", pack, "--model", model,
                       "--input", str(args.labelled / f"{pack}.jsonl"), "--method", method, "--target", target, "--output", str(cal),
                       "--report", str(rep), "--cache", args.cache, "--no-progress", *only]
                if args.plots and model == MODELS[0]:
                    cmd += ["--plots", str(tmp / f"plots-{method}")]
                subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                loss = _cv_log_loss(orjson.loads(rep.read_bytes()))
                print(f"{pack} {model} {method}: cross-validated log loss {loss:.4f}", file=sys.stderr)
                if best is None or loss < best[0]:
                    best = (loss, method, cal, rep)
            assert best is not None
            doc = orjson.loads(best[3].read_bytes())
            if any("none_decision" in e for e in doc.get("extractions", {}).values()):
                for qid, m in cv_extractions(pack, model, best[1], args.labelled / f"{pack}.jsonl", args.cache).items():
                    doc["extractions"][qid]["calibrated_cv"] = m
                best[3].write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
            for sub, src in (("calibrations", best[2]), ("reports", best[3])):
                (REPO / "packs" / pack / sub).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, REPO / "packs" / pack / sub / f"{model}.json")
            for variant, variant_target in (mapping.get("variants") or {}).items():
                # the same method and map, another decision target: calibrations/<variant>/<model>.json
                cal, rep = tmp / f"{variant}.json", tmp / f"{variant}.report.json"
                subprocess.run([sys.executable, "-m", "spinf_stream.cli", "calibrate", "--pack", pack, "--model", model,
                                "--input", str(args.labelled / f"{pack}.jsonl"), "--method", best[1],
                                "--target", str(variant_target), "--output", str(cal), "--report", str(rep),
                                "--cache", args.cache, "--no-progress", *only],
                               cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for sub, src in (("calibrations", cal), ("reports", rep)):
                    (REPO / "packs" / pack / sub / variant).mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, REPO / "packs" / pack / sub / variant / f"{model}.json")
                print(f"{pack} {model}: shipped variant {variant} ({variant_target})", file=sys.stderr)
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
