"""bge_onnx: INPUT_IDS, ATTENTION_MASK [n, len] int64 -> EMBEDDING [n, dim] fp32 (L2-normalised).

Inputs allow ragged batching, so the dynamic batcher groups requests of any
token length; here their rows are sorted by length and run in chunks of similar
length, each padded only to its own longest row (`encoder.encode_by_length`).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from encoder import PADDING_RATIO, create_session, encode_by_length, plan_session, shape_error


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "EMBEDDING")
        if pb_utils.triton_string_to_numpy(output["data_type"]) != np.float32:
            raise pb_utils.TritonModelException(f"{config['name']}: EMBEDDING must be TYPE_FP32")
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        cpu_instances = sum(int(g.get("count", 1)) for g in config["instance_group"] if g.get("kind") == "KIND_CPU")
        plan = plan_session(
            args["model_instance_kind"],
            int(args["model_instance_device_id"]),
            params,
            params.get("trt_engine_cache_path", os.path.join(version_dir, "trt")),
            cpu_instances,
        )
        self.session = create_session(os.path.join(version_dir, plan.model_file), plan)
        # Chunks of a batch run side by side on these threads (ONNX Runtime releases the GIL while it runs).
        self.workers = plan.parallel_runs
        self.executor = ThreadPoolExecutor(self.workers, "bge_onnx-run") if self.workers > 1 else None
        self.padding_ratio = float(params.get("padding_ratio", PADDING_RATIO))
        self.dimension = int(output["dims"][-1])
        produced = self.session.get_outputs()[0].shape[-1]
        if produced != self.dimension:
            raise pb_utils.TritonModelException(
                f"{config['name']}: {plan.model_file} outputs {produced} dims, config says {self.dimension}"
            )

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        ids, masks, valid = [], [], []
        for index, request in enumerate(requests):
            pair = [pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in ("INPUT_IDS", "ATTENTION_MASK")]
            error = shape_error(*pair)
            if error:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)
                )
                continue
            ids.append(pair[0])
            masks.append(pair[1])
            valid.append(index)
        if valid:
            parts = encode_by_length(self._run, ids, masks, self.padding_ratio, self.executor, self.workers)
            for index, part in zip(valid, parts, strict=True):
                responses[index] = pb_utils.InferenceResponse(
                    [pb_utils.Tensor("EMBEDDING", part.astype(np.float32, copy=False))]
                )
        return responses

    def finalize(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    def _run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        (embeddings,) = self.session.run(None, {"INPUT_IDS": input_ids, "ATTENTION_MASK": attention_mask})
        return embeddings
