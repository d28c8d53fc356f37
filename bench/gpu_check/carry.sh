#!/usr/bin/env bash
# The wheels the GPU check needs on a lent machine that reaches no package index (its Python is 3.12, with torch,
# transformers, numpy, onnx, onnxruntime's CPU build, nvidia-ml-py and prometheus-client): downloaded here for
# CPython 3.12 on manylinux x86_64, packed by `python -m bench.gpu_check.wheels pack` into
# .run/gpu-check/carry/part-N/ folders of at most PART_MIB MiB (git-ignored), one folder per call.
#
#   bench/gpu_check/carry.sh     parts of PART_MIB MiB: by default 60, or less where the working tree (which
#                                travels with every call) leaves less of a call's 64 MiB (63.5 - tree)
#
# The wheels, at the versions this checkout's pyproject.toml pins or its .venv runs (the versions the tests pass
# with): onnxruntime-gpu (the `gpu` extra; built for CUDA 13, whose runtime, cuBLAS and cuDNN the machine's torch
# wheels already bring), nvidia-pytriton (the tritonserver binary), and what the gateway's Triton client imports
# that the machine lacks or may hold too old a version of. Each call carries one part, to the same warm machine,
# which keeps the ignored files of earlier calls:
#
#   call 1:        carry .run/gpu-check/carry/part-1, command: bench/gpu_check/run.sh --steps nvml,model,torch
#                  (the steps that need nothing carried)
#   calls 2..N-1:  carry .run/gpu-check/carry/part-k, command: true
#   call N:        carry .run/gpu-check/carry/part-N, command:
#                  bench/gpu_check/run.sh --wheels .run/gpu-check/carry --steps nvml,wheels,model,onnx,triton
#
# run.sh joins part-1..N in order, checks the manifest's SHA-256, unpacks and runs
# `pip install --no-index --no-deps --target`; by hand the same is
#   cat .run/gpu-check/carry/part-*/wheels.tar.xz.* | xz -d | tar -x -C /tmp/wheels &&
#   python3 -m pip install --no-index --no-deps --target /tmp/site /tmp/wheels/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."

dest=.run/gpu-check
py=.venv/bin/python
[ -x "$py" ] || { echo "carry.sh: no .venv here: run 'make setup' first (the versions come from it)" >&2; exit 2; }

version() { "$py" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"; }
pins=("$(sed -n 's/^gpu = \["\(.*\)"\]/\1/p' pyproject.toml)")
# The gateway's Triton client: tritonclient and gRPC; pydantic(-settings), FastAPI and Starlette (gateway.settings
# and gateway.errors import them); OpenTelemetry's API (the client propagates traces); typing-extensions and
# annotated-doc at versions pydantic and FastAPI accept. numpy (this checkout's 1.26) is for Triton's python-backend
# stubs alone, installed apart from the rest (wheels.py: STUB_ONLY says why).
for name in nvidia-pytriton tritonclient grpcio protobuf python-rapidjson pydantic pydantic-core pydantic-settings \
  python-dotenv typing-inspection annotated-types annotated-doc typing-extensions fastapi starlette \
  opentelemetry-api orjson numpy; do
  pins+=("$name==$(version "$name")")
done

rm -rf "$dest/wheels"
mkdir -p "$dest/wheels"
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 \
  manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --platform any -d "$dest/wheels" "${pins[@]}"

tree_mib=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
  | awk '{s += $1} END {printf "%.1f", s / 1048576}')
# Half a MiB is left for the manifest and what the transfer adds to the tree's file sizes.
part_mib="${PART_MIB:-$(awk -v t="$tree_mib" 'BEGIN {p = 63.5 - t; printf "%.1f", (p > 60 ? 60 : p)}')}"
"$py" -m bench.gpu_check.wheels pack --wheels "$dest/wheels" --carry "$dest/carry" --part-mib "$part_mib"
echo "working tree: $tree_mib MiB; a call carries it and one part of <= $part_mib MiB (64 MiB at most)"
