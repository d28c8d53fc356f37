"""The GPU check: what one short run on a lent GPU machine without network measures of the GPU path.

`python3 -m bench.gpu_check` runs with the machine's own Python (torch, transformers, numpy, onnx, onnxruntime,
nvidia-ml-py), not this checkout's virtual environment; the wheels it lacks travel as parts made by
`bench/gpu_check/carry.sh`. docs/benchmarks.md ("The GPU check on a lent machine") says how to run it and what
each step measures; `--dry-run` runs every step that needs no GPU here, on the CPU with a tiny model.
"""
