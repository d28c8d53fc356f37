"""reranker_onnx: INPUT_IDS, ATTENTION_MASK[, TOKEN_TYPE_IDS] [n, len] int64 -> SCORE [n, 1] fp32 (raw logit).

Inputs allow ragged batching, so the dynamic batcher groups requests of any token length; here their rows are
sorted by length and run in chunks of similar length (`scorer.score_by_length`). The session is planned as
bge_onnx plans its own (`encoder.plan_session`: INT8 or FP32 on KIND_CPU, FP16 on CUDA or TensorRT on KIND_GPU).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from encoder import PADDING_RATIO, create_session, plan_session
from scorer import Features, Scores, score_by_length, shape_error


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "SCORE")
        if pb_utils.triton_string_to_numpy(output["data_type"]) != np.float32 or list(output["dims"]) != [1]:
            raise pb_utils.TritonModelException(f"{config['name']}: SCORE must be TYPE_FP32 with dims [1]")
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
        self.inputs = [i["name"] for i in config["input"]]
        graph_inputs = [i.name for i in self.session.get_inputs()]
        if sorted(graph_inputs) != sorted(self.inputs):
            raise pb_utils.TritonModelException(
                f"{config['name']}: {plan.model_file} takes {graph_inputs}, the config declares {self.inputs}"
            )
        self.workers = plan.parallel_runs
        self.executor = ThreadPoolExecutor(self.workers, "reranker_onnx-run") if self.workers > 1 else None
        self.padding_ratio = float(params.get("padding_ratio", PADDING_RATIO))

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        features: list[Features] = []
        valid: list[int] = []
        for index, request in enumerate(requests):
            arrays = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            error = shape_error(arrays)
            if error:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)
                )
                continue
            features.append(arrays)
            valid.append(index)
        parts = score_by_length(self._run, features, self.padding_ratio, self.executor, self.workers)
        for index, part in zip(valid, parts, strict=True):
            responses[index] = pb_utils.InferenceResponse([pb_utils.Tensor("SCORE", part)])
        return responses

    def finalize(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    def _run(self, features: Features) -> Scores:
        (scores,) = self.session.run(None, features)
        return np.asarray(scores, dtype=np.float32)
