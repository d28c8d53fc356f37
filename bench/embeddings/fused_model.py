"""A candidate `bge_fused`: one python-backend model that tokenizes and encodes, written into a temporary copy
of the exported repository (the tracked `model_repository/` stays as it is) for `tokenizer_paths` to measure.

It reuses the two models' own modules (`bge_tokenizer`'s `tokenization`, `bge_onnx`'s `encoder`) and has the
ensemble's inputs and outputs, so that it could replace `bge` behind the same public contract.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from export.repository import MAX_BATCH_SIZE

FUSED = "bge_fused"
# Files at least this large are linked, not copied: the ONNX graphs are hundreds of MB.
LINK_BYTES = 1 << 20

MODEL_PY = '''"""bge_fused: TEXT [n, 1] bytes -> EMBEDDING [n, dim], TOKEN_COUNT, TRUNCATED [n, 1] in one stub."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

# The tokenizer's own thread pool would compete with the encoder's side-by-side runs for the same cores.
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np
import triton_python_backend_utils as pb_utils
from encoder import PADDING_RATIO, create_session, encode_by_length, plan_session
from tokenization import InvalidTextError, TextTokenizer, decode_texts


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        cpu_instances = sum(int(g.get("count", 1)) for g in config["instance_group"] if g.get("kind") == "KIND_CPU")
        plan = plan_session(
            args["model_instance_kind"], int(args["model_instance_device_id"]), params,
            os.path.join(version_dir, "trt"), cpu_instances,
        )
        self.session = create_session(os.path.join(version_dir, plan.model_file), plan)
        self.workers = plan.parallel_runs
        self.executor = ThreadPoolExecutor(self.workers, "bge_fused-run") if self.workers > 1 else None
        self.padding_ratio = float(params.get("padding_ratio", PADDING_RATIO))
        max_length = int(params["max_sequence_length"])
        self.tokenizer = TextTokenizer(os.path.join(version_dir, "tokenizer.json"), max_length)

    def execute(self, requests):
        responses = [None] * len(requests)
        groups, valid = [], []
        for index, request in enumerate(requests):
            try:
                groups.append(decode_texts(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()))
                valid.append(index)
            except InvalidTextError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses[index] = pb_utils.InferenceResponse(error=error)
        encodings = self.tokenizer.encode([text for group in groups for text in group])
        batches, start = [], 0
        for group in groups:
            batches.append(self.tokenizer.pack(encodings[start : start + len(group)]))
            start += len(group)
        if batches:
            parts = encode_by_length(
                self._run, [b.input_ids for b in batches], [b.attention_mask for b in batches],
                self.padding_ratio, self.executor, self.workers,
            )
            for index, batch, part in zip(valid, batches, parts):
                tensors = [
                    pb_utils.Tensor("EMBEDDING", part.astype(np.float32, copy=False)),
                    pb_utils.Tensor("TOKEN_COUNT", batch.token_count),
                    pb_utils.Tensor("TRUNCATED", batch.truncated),
                ]
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
        return responses

    def finalize(self):
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    def _run(self, input_ids, attention_mask):
        (embeddings,) = self.session.run(None, {"INPUT_IDS": input_ids, "ATTENTION_MASK": attention_mask})
        return embeddings
'''


def fused_config(onnx_config: str, dimension: int) -> str:
    """`bge_fused`'s config.pbtxt: `bge`'s inputs and outputs, `bge_onnx`'s instances, batching and parameters
    (`onnx_config` is its config.pbtxt; its warm-up, on token ids, is dropped)."""
    body = onnx_config.split("model_warmup", 1)[0]
    body = body.split("instance_group", 1)[1]
    return (
        f'name: "{FUSED}"\n'
        f"max_batch_size: {MAX_BATCH_SIZE}\n"
        'input {\n  name: "TEXT"\n  data_type: TYPE_STRING\n  dims: 1\n}\n'
        f'output {{\n  name: "EMBEDDING"\n  data_type: TYPE_FP32\n  dims: {dimension}\n}}\n'
        'output {\n  name: "TOKEN_COUNT"\n  data_type: TYPE_INT32\n  dims: 1\n}\n'
        'output {\n  name: "TRUNCATED"\n  data_type: TYPE_BOOL\n  dims: 1\n}\n'
        f"instance_group{body}"
        'backend: "python"\n'
    )


def copy_repository(source: Path, target: Path) -> None:
    """`source` into `target`: small files copied, large ones (the graphs) linked."""

    def place(src: str, dst: str) -> None:
        if os.path.getsize(src) >= LINK_BYTES:
            os.symlink(os.path.abspath(src), dst)
        else:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=place, ignore=shutil.ignore_patterns("__pycache__", "trt"))


def write_fused_repository(source: Path, target: Path, dimension: int) -> Path:
    """A copy of the exported repository `source` at `target`, with `bge_fused` added beside `bge`."""
    copy_repository(source, target)
    version = target / FUSED / "1"
    version.mkdir(parents=True)
    shutil.copy2(source / "bge_tokenizer" / "1" / "tokenization.py", version / "tokenization.py")
    shutil.copy2(source / "bge_onnx" / "1" / "encoder.py", version / "encoder.py")
    os.symlink((source / "bge_tokenizer" / "1" / "tokenizer.json").resolve(), version / "tokenizer.json")
    for graph in (source / "bge_onnx" / "1").glob("*.onnx"):
        os.symlink(graph.resolve(), version / graph.name)
    (version / "model.py").write_text(MODEL_PY)
    onnx_config = (source / "bge_onnx" / "config.pbtxt").read_text()
    (target / FUSED / "config.pbtxt").write_text(fused_config(onnx_config, dimension))
    return target
