"""bge_tokenizer: TEXT [n, 1] bytes -> INPUT_IDS, ATTENTION_MASK [n, longest] int64,
TOKEN_COUNT [n, 1] int32, TRUNCATED [n, 1] bool.

All texts of a dynamic batch are tokenised in one call; each request is padded
to its own longest text. A bad text fails its request only.
"""

from __future__ import annotations

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenization import InvalidTextError, TextTokenizer, decode_texts

OUTPUTS = {"INPUT_IDS": np.int64, "ATTENTION_MASK": np.int64, "TOKEN_COUNT": np.int32, "TRUNCATED": np.bool_}


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        for name, dtype in OUTPUTS.items():
            declared = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
            if np.dtype(declared) != np.dtype(dtype):
                raise pb_utils.TritonModelException(
                    f"{config['name']}: output {name} must be {dtype}, config says {declared}"
                )
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        max_length = int(params["max_sequence_length"])
        # TOKENIZERS_PARALLELISM is read by the Rust tokenizer at each call; this stub process holds only this model.
        parallel = params.get("parallel_tokenization", "false").lower() in ("1", "true", "yes")
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
        tokenizer_file = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        self.tokenizer = TextTokenizer(tokenizer_file, max_length)

    def execute(self, requests: list) -> list:
        texts: list[list[str] | None] = []
        errors: dict[int, str] = {}
        for index, request in enumerate(requests):
            try:
                texts.append(decode_texts(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()))
            except InvalidTextError as exc:
                texts.append(None)
                errors[index] = str(exc)
        encodings = self.tokenizer.encode([t for group in texts if group for t in group])
        responses, start = [], 0
        for index, group in enumerate(texts):
            if group is None:
                error = pb_utils.TritonError(errors[index], pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            batch = self.tokenizer.pack(encodings[start : start + len(group)])
            start += len(group)
            tensors = [
                pb_utils.Tensor("INPUT_IDS", batch.input_ids),
                pb_utils.Tensor("ATTENTION_MASK", batch.attention_mask),
                pb_utils.Tensor("TOKEN_COUNT", batch.token_count),
                pb_utils.Tensor("TRUNCATED", batch.truncated),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
