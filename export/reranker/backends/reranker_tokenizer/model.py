"""reranker_tokenizer: QUERY, DOCUMENT [n, 1] bytes -> INPUT_IDS, ATTENTION_MASK[, TOKEN_TYPE_IDS] [n, longest]
int64, TOKEN_COUNT [n, 1] int32, TRUNCATED [n, 1] bool.

Every pair of a dynamic batch is tokenised in one call; each request is padded to its own longest pair.
TOKEN_TYPE_IDS is produced when the config declares it (BERT-style models). A bad text fails its request only.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from pair_tokenization import PairBatch, PairTokenizer
from tokenization import InvalidTextError, decode_texts

OUTPUTS = {
    "INPUT_IDS": np.int64,
    "ATTENTION_MASK": np.int64,
    "TOKEN_TYPE_IDS": np.int64,
    "TOKEN_COUNT": np.int32,
    "TRUNCATED": np.bool_,
}
REQUIRED = ("INPUT_IDS", "ATTENTION_MASK", "TOKEN_COUNT", "TRUNCATED")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        declared = {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]}
        problems = [f"{n} missing" for n in REQUIRED if n not in declared]
        problems += [f"{n} unknown" for n in declared if n not in OUTPUTS]
        problems += [
            f"{n} must be {np.dtype(OUTPUTS[n])}"
            for n, t in declared.items()
            if n in OUTPUTS and np.dtype(t) != np.dtype(OUTPUTS[n])  # TYPE_BOOL reads as Python's bool
        ]
        if problems:
            raise pb_utils.TritonModelException(f"{config['name']}: outputs {', '.join(problems)}")
        self.outputs = [name for name in OUTPUTS if name in declared]
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        parallel = params.get("parallel_tokenization", "false").lower() in ("1", "true", "yes")
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
        tokenizer_file = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        self.tokenizer = PairTokenizer(tokenizer_file, int(params["max_sequence_length"]))

    def execute(self, requests: list[Any]) -> list[Any]:
        pairs: list[tuple[list[str], list[str]] | str] = [self._pairs(request) for request in requests]
        valid = [p for p in pairs if not isinstance(p, str)]
        encodings = self.tokenizer.encode(
            [q for queries, _ in valid for q in queries], [d for _, documents in valid for d in documents]
        )
        responses, start = [], 0
        for pair in pairs:
            if isinstance(pair, str):
                error = pb_utils.TritonError(pair, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            batch = self.tokenizer.pack(encodings[start : start + len(pair[0])])
            start += len(pair[0])
            responses.append(pb_utils.InferenceResponse(output_tensors=self._tensors(batch)))
        return responses

    def _pairs(self, request: Any) -> tuple[list[str], list[str]] | str:
        """The request's queries and documents, or why they cannot be scored."""
        texts = {}
        for name in ("QUERY", "DOCUMENT"):
            try:
                texts[name] = decode_texts(pb_utils.get_input_tensor_by_name(request, name).as_numpy())
            except InvalidTextError as exc:
                return f"{name} {exc}"  # "DOCUMENT text 2 is empty or only whitespace"
        # Triton has already held QUERY and DOCUMENT to one row count (the model is batched).
        return texts["QUERY"], texts["DOCUMENT"]

    def _tensors(self, batch: PairBatch) -> list[Any]:
        arrays = {
            "INPUT_IDS": batch.input_ids,
            "ATTENTION_MASK": batch.attention_mask,
            "TOKEN_TYPE_IDS": batch.token_type_ids,
            "TOKEN_COUNT": batch.token_count,
            "TRUNCATED": batch.truncated,
        }
        return [pb_utils.Tensor(name, arrays[name]) for name in self.outputs]
