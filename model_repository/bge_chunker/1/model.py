"""bge_chunker: TEXT [1] bytes, MAX_TOKENS [1] int32, OVERLAP [1] int32 -> SPANS [chunks, 2] int32.

One text per request (max_batch_size 0). SPANS are the [start, end) code-point ranges of TEXT's windows of at most
MAX_TOKENS - (the special tokens the model adds) tokens of the served tokenizer, overlapping by OVERLAP tokens
(`chunking`). An input out of range or TEXT that is not UTF-8 fails its request with INVALID_ARG.
"""

from __future__ import annotations

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from chunking import ChunkRequestError, TextChunker, decode_text

TENSORS = {"TEXT": (np.object_, [1]), "MAX_TOKENS": (np.int32, [1]), "OVERLAP": (np.int32, [1])}
SPANS = (np.int32, [-1, 2])


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        declared = {t["name"]: t for t in (*config["input"], *config["output"])}
        for name, (dtype, dims) in {**TENSORS, "SPANS": SPANS}.items():
            tensor = declared.get(name)
            if tensor is None:
                raise pb_utils.TritonModelException(f"{config['name']}: {name} is not declared")
            found = (np.dtype(pb_utils.triton_string_to_numpy(tensor["data_type"])), [int(d) for d in tensor["dims"]])
            if found != (np.dtype(dtype), dims):
                raise pb_utils.TritonModelException(
                    f"{config['name']}: {name} must be {np.dtype(dtype)} {dims}, config says {found[0]} {found[1]}"
                )
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        # One text per call: the Rust tokenizer's thread pool would have nothing to share out.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        tokenizer_file = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise pb_utils.TritonModelException(f"{config['name']}: {tokenizer_file} is missing: run `make export`")
        try:
            self.chunker = TextChunker(tokenizer_file, int(params["max_sequence_length"]))
        except ValueError as exc:
            raise pb_utils.TritonModelException(f"{config['name']}: {exc}") from exc

    def execute(self, requests: list) -> list:
        return [self._chunk(request) for request in requests]

    def _chunk(self, request: object) -> object:
        def value(name: str) -> np.ndarray:
            return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

        try:
            text = decode_text(value("TEXT"))
            spans = self.chunker.spans(text, int(value("MAX_TOKENS").item()), int(value("OVERLAP").item()))
        except ChunkRequestError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SPANS", spans)])
