#!/usr/bin/env bash
# The GPU check on a lent GPU machine without network (docs/benchmarks.md, "The GPU check on a lent machine"):
# python3 -m bench.gpu_check under `timeout`, with the machine's own Python. Results, log and the Prometheus texts
# go to $OUT where it is set (the folder a lent machine's run brings back), else .run/gpu-check/out.
#
#   bench/gpu_check/run.sh [--wheels .run/gpu-check/carry] [--steps nvml,model,torch] [--dry-run]
#   BUDGET_SECONDS=540 (default): the outer timeout; the check itself plans for 20 s less and stops its steps there
#   PYTHON=python3 (default); `make gpu-check` passes this checkout's .venv/bin/python and --dry-run
set -uo pipefail
cd "$(dirname "$0")/../.."

out="${OUT:-.run/gpu-check/out}"
budget="${BUDGET_SECONDS:-540}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout --kill-after=15 "$budget" "${PYTHON:-python3}" -m bench.gpu_check --out "$out" --budget "$((budget - 20))" "$@" \
  2>&1 | tee "$out/gpu_check.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 124 ] && echo "run.sh: stopped by timeout after $budget s; $out/gpu_check.json holds the steps done" >&2
exit "$status"
