from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from export.checkpoint import Checkpoint
from export.pipeline import DEFAULT_MAX_LENGTH
from export.repository import ServedModel, parse, rendered_configs
from tests.helpers.checkout import TRACKED_REPOSITORY

# The reranker's folders, where one was exported, are generated whole and never tracked.
CONFIG_FILES = sorted(
    p
    for p in TRACKED_REPOSITORY.rglob("*.pbtxt")
    if not p.relative_to(TRACKED_REPOSITORY).parts[0].startswith("reranker")
)


def default_model(minilm: Checkpoint) -> ServedModel:
    return ServedModel(minilm.name, minilm.revision, minilm.hidden_size, DEFAULT_MAX_LENGTH)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(TRACKED_REPOSITORY)))
def test_every_tracked_config_parses_as_triton_model_config(path: Path) -> None:
    config = parse(path.read_text())
    assert config.name == path.parent.name if path.parent.name != "configs" else path.parent.parent.name


def test_all_five_configs_are_tracked() -> None:
    assert [str(p.relative_to(TRACKED_REPOSITORY)) for p in CONFIG_FILES] == [
        "bge/config.pbtxt",
        "bge_chunker/config.pbtxt",
        "bge_onnx/config.pbtxt",
        "bge_onnx/configs/onnxruntime_gpu.pbtxt",
        "bge_tokenizer/config.pbtxt",
    ]


def test_tracked_configs_are_what_the_export_renders_for_the_default_model(minilm: Checkpoint) -> None:
    for relative, text in rendered_configs(default_model(minilm)).items():
        assert (TRACKED_REPOSITORY / relative).read_text() == text, f"{relative} drifted: run `make export`"


def test_bad_config_text_is_rejected() -> None:
    with pytest.raises(text_format.ParseError):
        parse('name: "bge"\nmax_batch_size: "many"\n')


def test_ensemble_contract(minilm: Checkpoint) -> None:
    config = parse(rendered_configs(default_model(minilm))["bge/config.pbtxt"])
    assert config.platform == "ensemble" and config.max_batch_size >= 64
    (text,) = config.input
    assert (text.name, text.data_type, list(text.dims)) == ("TEXT", mc.TYPE_STRING, [1])
    embedding = config.output[0]
    assert (embedding.name, embedding.data_type, list(embedding.dims)) == ("EMBEDDING", mc.TYPE_FP32, [384])
    assert [step.model_name for step in config.ensemble_scheduling.step] == ["bge_tokenizer", "bge_onnx"]
    assert config.parameters["model_revision"].string_value == minilm.revision


def test_chunker_contract(minilm: Checkpoint) -> None:
    config = parse(rendered_configs(default_model(minilm))["bge_chunker/config.pbtxt"])
    assert (config.backend, config.max_batch_size) == ("python", 0)  # one text per request
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("TEXT", mc.TYPE_STRING, [1]),
        ("MAX_TOKENS", mc.TYPE_INT32, [1]),
        ("OVERLAP", mc.TYPE_INT32, [1]),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("SPANS", mc.TYPE_INT32, [-1, 2])]
    (group,) = config.instance_group
    assert (group.kind, group.count) == (mc.ModelInstanceGroup.KIND_CPU, 1)
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "model_name": minilm.name,
        "model_revision": minilm.revision,
        "max_sequence_length": str(DEFAULT_MAX_LENGTH),
    }


def test_encoder_batches_ragged_requests_with_warmup(minilm: Checkpoint) -> None:
    config = parse(rendered_configs(default_model(minilm))["bge_onnx/config.pbtxt"])
    assert all(i.allow_ragged_batch for i in config.input)
    # Batched dynamically, with no timer: a free instance takes every queued request at once.
    batching = config.dynamic_batching
    assert config.HasField("dynamic_batching")
    assert not batching.preferred_batch_size and batching.max_queue_delay_microseconds == 0
    assert config.model_warmup and config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.parameters["model_revision"].string_value == minilm.revision


def test_native_variant_uses_tensorrt_fp16_on_gpu(minilm: Checkpoint) -> None:
    configs = rendered_configs(default_model(minilm))
    config = parse(configs["bge_onnx/configs/onnxruntime_gpu.pbtxt"])
    python_backend = parse(configs["bge_onnx/config.pbtxt"])
    # Same tensors as the python-backend config, so the one `bge` ensemble serves either.
    assert [(t.name, t.data_type) for t in config.input] == [(t.name, t.data_type) for t in python_backend.input]
    assert [(t.name, list(t.dims)) for t in config.output] == [(t.name, list(t.dims)) for t in python_backend.output]
    assert config.platform == "onnxruntime_onnx" and config.default_model_filename == "model.onnx"
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU


def test_tokenizer_warmup_file_is_serialised_bytes() -> None:
    config = parse((TRACKED_REPOSITORY / "bge_tokenizer" / "config.pbtxt").read_text())
    (warmup,) = config.model_warmup
    data = (TRACKED_REPOSITORY / "bge_tokenizer" / "warmup" / warmup.inputs["TEXT"].input_data_file).read_bytes()
    assert int.from_bytes(data[:4], "little") == len(data) - 4
    assert data[4:].decode("utf-8").strip()


def test_the_query_instruction_is_a_parameter_of_the_ensemble_only_when_there_is_one(minilm: Checkpoint) -> None:
    plain = parse(rendered_configs(default_model(minilm))["bge/config.pbtxt"])
    assert "query_instruction" not in plain.parameters
    instructed = ServedModel(minilm.name, minilm.revision, 384, DEFAULT_MAX_LENGTH, query_instruction="query: ")
    config = parse(rendered_configs(instructed)["bge/config.pbtxt"])
    assert config.parameters["query_instruction"].string_value == "query: "


def test_every_gpu_config_caps_onnx_runtimes_cuda_arena(minilm: Checkpoint) -> None:
    """The arena keeps what it grew to: capped, the GPU policy has a budget to judge memory against."""
    configs = rendered_configs(default_model(minilm))
    native = parse(configs["bge_onnx/configs/onnxruntime_gpu.pbtxt"]).parameters
    assert native["gpu_mem_limit"].string_value == str(8 << 30)
    assert native["arena_extend_strategy"].string_value == "1"  # kSameAsRequested, as the native backend reads it
    python_backend = parse(configs["bge_onnx/config.pbtxt"]).parameters
    assert python_backend["gpu_mem_limit"].string_value == str(8 << 30)
    assert python_backend["arena_extend_strategy"].string_value == "kSameAsRequested"
