"""Render the reranker's Triton configs and install its three models beside `bge` in the same repository.

`reranker` (ensemble): QUERY, DOCUMENT -> SCORE (raw relevance logit), TOKEN_COUNT, TRUNCATED;
`reranker_tokenizer` (python): pair tokenization; `reranker_onnx` (python, ONNX Runtime): the scorer graph.
Only folders with these names are written, so the embedding models are never touched; their shared python
modules (`tokenization.py`, `encoder.py`) are copied from the checkout's tracked `bge_*` folders, not rewritten.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from export.errors import ExportError
from export.repository import (
    MAX_BATCH_SIZE,
    WARMUP_TOKENS,
    add_token_warmup,
    bound_queue,
    model_parameters,
    render,
    replace_file,
    runtime_parameters,
    set_parameters,
    token_tensors,
    write_text,
)

ENSEMBLE = "reranker"
TOKENIZER = "reranker_tokenizer"
SCORER = "reranker_onnx"
VERSION = "1"
BACKENDS = Path(__file__).resolve().parent / "backends"
CHECKOUT_REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
# Modules of the embedding models that the reranker's run unchanged, copied at install (Triton puts only a model's
# own version folder on its import path): text decoding and errors, and the ONNX Runtime session plan and batching.
SHARED_MODULES = {TOKENIZER: "bge_tokenizer/1/tokenization.py", SCORER: "bge_onnx/1/encoder.py"}
WARMUP_FILES = {"QUERY": "sample_query", "DOCUMENT": "sample_document"}
WARMUP_TEXTS = {
    "QUERY": "How do I reset my password? 如何重置我的密码？",
    "DOCUMENT": "Open Settings, choose Account and click 'Reset password'. 打开设置，选择账户，然后点击“重置密码”。",
}


@dataclass(frozen=True)
class ServedReranker:
    """What the configs need to know about the exported cross-encoder."""

    name: str
    revision: str
    max_sequence_length: int
    token_inputs: tuple[str, ...]  # the graph's inputs: TOKEN_TYPE_IDS only where the model has token types
    cpu_precision: str = "int8"

    def parameters(self) -> dict[str, str]:
        return model_parameters(self.name, self.revision, self.max_sequence_length)


def _string_input(name: str) -> mc.ModelInput:
    return mc.ModelInput(name=name, data_type=mc.TYPE_STRING, dims=[1])


def _counts() -> list[mc.ModelOutput]:
    return [
        mc.ModelOutput(name="TOKEN_COUNT", data_type=mc.TYPE_INT32, dims=[1]),
        mc.ModelOutput(name="TRUNCATED", data_type=mc.TYPE_BOOL, dims=[1]),
    ]


def tokenizer_config(model: ServedReranker) -> mc.ModelConfig:
    config = mc.ModelConfig(name=TOKENIZER, backend="python", max_batch_size=MAX_BATCH_SIZE)
    config.input.extend([_string_input("QUERY"), _string_input("DOCUMENT")])
    config.output.extend(
        [mc.ModelOutput(name=name, data_type=mc.TYPE_INT64, dims=[-1]) for name in model.token_inputs] + _counts()
    )
    config.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1))
    config.dynamic_batching.max_queue_delay_microseconds = 500
    bound_queue(config)
    # One thread, as bge_tokenizer: the scorer's CPU runs keep the cores busy (docs/model.md).
    set_parameters(config, {**model.parameters(), "parallel_tokenization": "false"})
    warmup = config.model_warmup.add(name="sample_pair", batch_size=8)
    for name, file in WARMUP_FILES.items():
        warmup.inputs[name].CopyFrom(mc.ModelWarmup.Input(data_type=mc.TYPE_STRING, dims=[1], input_data_file=file))
    return config


def scorer_config(model: ServedReranker) -> mc.ModelConfig:
    """Python-backend ONNX Runtime, run as bge_onnx runs (ragged batches sorted by length, INT8 on the CPU, FP16
    on GPUs); no queue delay: a free instance takes every queued request at once."""
    config = mc.ModelConfig(name=SCORER, backend="python", max_batch_size=MAX_BATCH_SIZE)
    config.input.extend(token_tensors(ragged=True, names=model.token_inputs))
    config.output.append(mc.ModelOutput(name="SCORE", data_type=mc.TYPE_FP32, dims=[1]))
    config.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1))
    bound_queue(config)
    set_parameters(config, {**model.parameters(), **runtime_parameters(model.cpu_precision)})
    add_token_warmup(config, model.token_inputs, min(WARMUP_TOKENS, model.max_sequence_length))
    return config


def ensemble_config(model: ServedReranker) -> mc.ModelConfig:
    """`reranker`: QUERY, DOCUMENT -> tokenizer -> scorer -> SCORE (plus token counts for billing)."""
    config = mc.ModelConfig(name=ENSEMBLE, platform="ensemble", max_batch_size=MAX_BATCH_SIZE)
    config.input.extend([_string_input("QUERY"), _string_input("DOCUMENT")])
    config.output.append(mc.ModelOutput(name="SCORE", data_type=mc.TYPE_FP32, dims=[1]))
    config.output.extend(_counts())
    tokenize = config.ensemble_scheduling.step.add(model_name=TOKENIZER, model_version=-1)
    tokenize.input_map.update({"QUERY": "QUERY", "DOCUMENT": "DOCUMENT"})
    tokenize.output_map.update({name: name.lower() for name in model.token_inputs})
    tokenize.output_map.update({"TOKEN_COUNT": "TOKEN_COUNT", "TRUNCATED": "TRUNCATED"})
    score = config.ensemble_scheduling.step.add(model_name=SCORER, model_version=-1)
    score.input_map.update({name: name.lower() for name in model.token_inputs})
    score.output_map["SCORE"] = "SCORE"
    set_parameters(config, model.parameters())
    return config


def rendered_configs(model: ServedReranker) -> dict[str, str]:
    """Relative path inside the repository -> config text."""
    return {
        f"{ENSEMBLE}/config.pbtxt": render(ensemble_config(model)),
        f"{TOKENIZER}/config.pbtxt": render(tokenizer_config(model)),
        f"{SCORER}/config.pbtxt": render(scorer_config(model)),
    }


def serialized_string(text: str) -> bytes:
    """One TYPE_STRING element as Triton reads a warmup file: its length (uint32, little endian), then UTF-8."""
    data = text.encode("utf-8")
    return len(data).to_bytes(4, "little") + data


def backend_sources(model: str) -> dict[Path, str]:
    """Source file -> name in `<model>/1/`: the model's own modules and the embedding model's it shares."""
    sources = {path: path.name for path in sorted((BACKENDS / model).glob("*.py")) if path.name != "__init__.py"}
    shared = CHECKOUT_REPOSITORY / SHARED_MODULES[model]
    if not shared.is_file():
        raise ExportError(f"{shared} is missing: the reranker's {model} runs it (export from a checkout)")
    sources[shared] = shared.name
    return sources


def install(repository: Path, model: ServedReranker, scorer_files: list[Path], tokenizer_file: Path) -> None:
    """Move the checked files into `repository`, copy the python backends and write the configs last, each with
    an atomic rename (`replace_file`): a server reading the repository never sees a half-written file."""
    sources = {name: backend_sources(name) for name in (TOKENIZER, SCORER)}  # all found before anything moves
    targets = {f: repository / SCORER / VERSION / f.name for f in scorer_files}
    targets[tokenizer_file] = repository / TOKENIZER / VERSION / "tokenizer.json"
    for source, target in targets.items():
        replace_file(target, partial(shutil.move, source))
    for name, files in sources.items():
        for source, file_name in files.items():
            replace_file(repository / name / VERSION / file_name, partial(shutil.copyfile, source))
    for input_name, file_name in WARMUP_FILES.items():
        data = serialized_string(WARMUP_TEXTS[input_name])
        replace_file(repository / TOKENIZER / "warmup" / file_name, partial(Path.write_bytes, data=data))
    for relative, text in rendered_configs(model).items():
        replace_file(repository / relative, partial(write_text, text))
    (repository / ENSEMBLE / VERSION).mkdir(parents=True, exist_ok=True)
