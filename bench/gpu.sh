#!/usr/bin/env bash
# The GPU benchmark, for a machine with an NVIDIA GPU and its driver (it is never run by `make test`):
# sets up the venv with onnxruntime-gpu, exports the model (FP16 for the GPU beside INT8 for CPUs),
# starts Triton with `bge_onnx` as a KIND_GPU instance on ONNX Runtime's CUDA provider and measures
# batches of 1 to 128 texts (bench/gpu.py). Results: bench/results/<time>/ (report.md, gpu.json, plots).
#
#   bench/gpu.sh [RUNS]        RUNS: runs per measurement, medians reported (default 3)
#   MODEL=BAAI/bge-large-zh-v1.5 bench/gpu.sh    another checkpoint (hub id or directory), as `make export`
#
# It needs a package index (`make setup`) and a model hub or the checkpoint on disk. On a GPU machine with neither
# (a lent one: its own Python 3.12 and PyTorch, no network, little carried per call), run the GPU check instead:
# bench/gpu_check/run.sh, with the wheels bench/gpu_check/carry.sh packs (docs/benchmarks.md, "The GPU check on
# a lent machine").
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"

if ! nvidia-smi -L; then
  echo "bench/gpu.sh: no NVIDIA GPU here (nvidia-smi -L failed); nothing measured" >&2
  exit 2
fi
make setup
# onnxruntime-gpu ships the same `onnxruntime` module, with the CUDA provider: one replaces the other
# (the pin is the `gpu` extra of pyproject.toml; the other dependencies are the same as onnxruntime's).
.venv/bin/python -m pip uninstall -y -q onnxruntime
.venv/bin/python -m pip install -q --no-deps "$(sed -n 's/^gpu = \["\(.*\)"\]/\1/p' pyproject.toml)"
.venv/bin/python -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
  || { echo "bench/gpu.sh: onnxruntime-gpu has no CUDA provider here (CUDA/cuDNN libraries?)" >&2; exit 3; }
make export ${MODEL:+MODEL="$MODEL"}
.venv/bin/python -m bench.gpu_readings  # what the gateway's GPU policy reads from live Triton and DCGM endpoints
exec .venv/bin/python -m bench gpu --runs "$runs"
