#!/usr/bin/env bash
# The one prepared call for a lent GPU machine (issue 53): installs nothing, needs no weights
# (random weights of real shapes), writes under $OUT and fits one 8-minute call: the sweep, the
# profile and the check, each part skipped (a 'skipped' line) once 380 s are spent (the 12B shape
# first; the transformers baselines over 4 documents: a rate per question).
#   run: bash bench/gpu_run.sh      (timeout_s 540; copy $OUT/gpu-*.jsonl to bench/gpu/, and
#        $OUT/gemm_tiles.json to spinf_stream/kernels/gemm_tiles.json when the sweep found winners)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/spinf-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}  # the GPU machine's own torch and Triton (never a CPU build's .venv)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
log="$OUT/gpu-${card:-gpu}-$(date -u +%F).jsonl"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | head -1)"
  $PY -c 'import torch, triton, transformers; print("#", torch.__version__, triton.__version__, transformers.__version__)'
  echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$log"
timeout 500 $PY bench/gpu_check.py --sweep --profile --non-invariant --budget-s 380 --baseline-docs 4 --out "$OUT" 2>"$OUT/stderr.txt" | tee -a "$log"
echo "# exit ${PIPESTATUS[0]}, load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
tail -5 "$OUT/stderr.txt"
