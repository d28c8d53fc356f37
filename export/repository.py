"""Render the Triton configs for an exported model and install its files.

Configs are built as `ModelConfig` protobuf messages (the schema Triton
parses) and written in text format, so a config the export writes is valid
by construction. The tracked `config.pbtxt` files are exactly what this module
renders for the default checkpoint.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

# TensorRT engines are built at the first load and kept here: the chart mounts a writable volume at this path
# (the image's root filesystem is read-only).
TENSORRT_CACHE_PATH = "/var/cache/tensorrt"

ENSEMBLE = "bge"
TOKENIZER = "bge_tokenizer"
ENCODER = "bge_onnx"
CHUNKER = "bge_chunker"
# Alternate config for NVIDIA's GPU server images (native onnxruntime backend,
# TensorRT FP16): select it with `tritonserver --model-config-name=onnxruntime_gpu`.
NATIVE_CONFIG_NAME = "onnxruntime_gpu"
WARMUP_TEXT_FILE = "sample_text"

# Texts per batch, in every model. Under a bulk load the gateway merges requests up to this many texts per call,
# and `bge_onnx` sorts each batch by length before cutting it into runs: the more texts it sorts at once, the less
# it pads and the fewer runs it makes (docs/benchmarks.md, "Batches of up to 256"). A single text never waits
# for a batch to fill: batches only grow from what is queued.
MAX_BATCH_SIZE = 256
# The native GPU config waits up to 2 ms to gather a preferred batch: a GPU run of 8 costs about what a run of 1 does.
PREFERRED_BATCH_SIZES = (8, 16, 32, 64)
MAX_QUEUE_DELAY_US = 2000
# Triton's queue in front of each batching model is bounded, so that an overloaded Triton refuses at once (the
# gateway answers 429 `overloaded` with Retry-After) instead of holding calls until their deadline. The gateway
# bounds its own queue by time (TRITON_MAX_QUEUE_SECONDS, 2 s by default), so these bounds catch what it cannot
# see: many gateway replicas or other clients on one Triton. A request is rejected when MAX_QUEUE_SIZE requests wait
# already, or when it has waited QUEUE_TIMEOUT_US: far above the gateway's bound plus one full batch's encoding
# (256 texts: 0.43 s on 2 CPU cores, docs/benchmarks.md), so that a gateway-bounded load is not rejected here even
# on busy cores, and well below the gateway's 30 s deadline (TRITON_TIMEOUT_SECONDS), which it would only waste.
MAX_QUEUE_SIZE = 64
QUEUE_TIMEOUT_US = 10_000_000
WARMUP_TOKENS = 128
# ONNX Runtime's CUDA memory arena grows to the largest batch it has run and keeps that memory, so that the GPU's
# used memory stays high once a big batch has passed. Each model's arena is capped at GPU_MEMORY_LIMIT_BYTES, and
# grows by what a run asks for (kSameAsRequested) rather than to the next power of two: one model cannot take the
# whole GPU, and the gateway's GPU policy, which judges used memory against GPU_MEMORY_BUDGET_BYTES, sees arenas
# that stay within their caps (docs/operations.md, "GPU states"). 8 GiB holds a run of 256 texts of 512 tokens
# through a BGE-large FP16 encoder; a run that needs more fails alone instead of the process.
GPU_MEMORY_LIMIT_BYTES = 8 << 30
TOKEN_INPUTS = ("INPUT_IDS", "ATTENTION_MASK")


@dataclass(frozen=True)
class ServedModel:
    """What the configs need to know about the exported model."""

    name: str
    revision: str
    dimension: int
    max_sequence_length: int
    cpu_precision: str = "int8"
    query_instruction: str = ""  # put before search queries (the gateway reads it from the ensemble's config)


def set_parameters(config: mc.ModelConfig, values: dict[str, str]) -> None:
    for key, value in values.items():
        config.parameters[key].string_value = value


def model_parameters(name: str, revision: str, max_sequence_length: int) -> dict[str, str]:
    """What every config of a served model names (the gateway reads them from the ensemble's, caches key on them)."""
    return {"model_name": name, "model_revision": revision, "max_sequence_length": str(max_sequence_length)}


def _model_params(model: ServedModel) -> dict[str, str]:
    return model_parameters(model.name, model.revision, model.max_sequence_length)


def bound_queue(config: mc.ModelConfig) -> None:
    """Reject, rather than hold, what would wait too long in `config`'s dynamic batching queue (`MAX_QUEUE_SIZE`)."""
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = MAX_QUEUE_SIZE
    policy.timeout_action = mc.ModelQueuePolicy.REJECT
    policy.default_timeout_microseconds = QUEUE_TIMEOUT_US


def token_tensors(ragged: bool, names: tuple[str, ...] = TOKEN_INPUTS) -> list[mc.ModelInput]:
    """[-1] int64 inputs; `ragged`: requests of any token length batch together (python backend)."""
    return [mc.ModelInput(name=name, data_type=mc.TYPE_INT64, dims=[-1], allow_ragged_batch=ragged) for name in names]


def tokenizer_config(model: ServedModel) -> mc.ModelConfig:
    config = mc.ModelConfig(name=TOKENIZER, backend="python", max_batch_size=MAX_BATCH_SIZE)
    config.input.append(mc.ModelInput(name="TEXT", data_type=mc.TYPE_STRING, dims=[1]))
    config.output.extend(
        [
            mc.ModelOutput(name="INPUT_IDS", data_type=mc.TYPE_INT64, dims=[-1]),
            mc.ModelOutput(name="ATTENTION_MASK", data_type=mc.TYPE_INT64, dims=[-1]),
            mc.ModelOutput(name="TOKEN_COUNT", data_type=mc.TYPE_INT32, dims=[1]),
            mc.ModelOutput(name="TRUNCATED", data_type=mc.TYPE_BOOL, dims=[1]),
        ]
    )
    config.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1))
    config.dynamic_batching.max_queue_delay_microseconds = 500
    bound_queue(config)
    # One thread: beside bge_onnx's CPU runs, which keep every core busy, the Rust tokenizer's thread pool buys no
    # time and adds its threads' wake-ups (docs/benchmarks.md). "true" pays where the cores are otherwise idle.
    set_parameters(config, {**_model_params(model), "parallel_tokenization": "false"})
    warmup = config.model_warmup.add(name="sample_text", batch_size=8)
    warmup.inputs["TEXT"].CopyFrom(
        mc.ModelWarmup.Input(data_type=mc.TYPE_STRING, dims=[1], input_data_file=WARMUP_TEXT_FILE)
    )
    return config


def chunker_config(model: ServedModel) -> mc.ModelConfig:
    """TEXT, MAX_TOKENS, OVERLAP -> SPANS: a text cut into windows of the served tokenizer's tokens (the gateway
    chunks long documents with it). One text per request: the gateway sends concurrent requests."""
    config = mc.ModelConfig(name=CHUNKER, backend="python", max_batch_size=0)
    config.input.extend(
        [
            mc.ModelInput(name="TEXT", data_type=mc.TYPE_STRING, dims=[1]),
            mc.ModelInput(name="MAX_TOKENS", data_type=mc.TYPE_INT32, dims=[1]),
            mc.ModelInput(name="OVERLAP", data_type=mc.TYPE_INT32, dims=[1]),
        ]
    )
    config.output.append(mc.ModelOutput(name="SPANS", data_type=mc.TYPE_INT32, dims=[-1, 2]))
    # One instance: a request is one tokenizer call (about 45 ms for 100,000 characters on one core) and integer
    # arithmetic, while embedding the chunks it returns costs far more in bge_onnx, which wants the cores. More
    # instances only pay where many long documents arrive at once (each one is a stub process holding a tokenizer).
    config.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1))
    set_parameters(config, _model_params(model))
    return config


def encoder_config(model: ServedModel) -> mc.ModelConfig:
    """Python-backend ONNX Runtime model; requests of any token length batch together."""
    config = mc.ModelConfig(name=ENCODER, backend="python", max_batch_size=MAX_BATCH_SIZE)
    config.input.extend(token_tensors(ragged=True))
    config.output.append(mc.ModelOutput(name="EMBEDDING", data_type=mc.TYPE_FP32, dims=[model.dimension]))
    config.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1))
    # No queue delay and no preferred sizes: a free instance takes every queued request at once (up to
    # MAX_BATCH_SIZE). Under load requests queue while a batch runs, so batches grow by themselves; a timer
    # would hold a lone request back by its whole delay and, with batches already growing under load, gain nothing.
    bound_queue(config)
    set_parameters(config, {**_model_params(model), **runtime_parameters(model.cpu_precision)})
    add_token_warmup(config)
    return config


def runtime_parameters(cpu_precision: str) -> dict[str, str]:
    """How a python-backend ONNX Runtime model runs its graph (read by `encoder.plan_session`, which `bge_onnx` and
    `reranker_onnx` share)."""
    return {
        "cpu_precision": cpu_precision,  # int8 | fp32 on KIND_CPU instances
        "gpu_execution_provider": "cuda",  # cuda (FP16 graph) | tensorrt (FP32 graph, FP16 engine)
        "parallel_runs": "0",  # 0: on KIND_CPU, one single-threaded run per core (encoder.plan_session)
        "intra_op_threads": "0",  # 0: the cores this process may use, shared by the CPU instances and runs
        "allow_spinning": "false",  # idle ONNX Runtime workers sleep: the cores are shared
        "padding_ratio": "1.15",  # a chunk's padded area over its real tokens (encoder.chunk_sizes)
        "gpu_mem_limit": str(GPU_MEMORY_LIMIT_BYTES),  # the CUDA provider's arena cap on KIND_GPU instances
        "arena_extend_strategy": "kSameAsRequested",
    }


def native_encoder_config(model: ServedModel) -> mc.ModelConfig:
    """The same model for Triton's native onnxruntime backend with TensorRT FP16 (GPU images)."""
    config = mc.ModelConfig(
        name=ENCODER, platform="onnxruntime_onnx", max_batch_size=MAX_BATCH_SIZE, default_model_filename="model.onnx"
    )
    # The native backend needs equal shapes in a batch, so no ragged batching here.
    config.input.extend(token_tensors(ragged=False))
    config.output.append(mc.ModelOutput(name="EMBEDDING", data_type=mc.TYPE_FP32, dims=[model.dimension]))
    config.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_GPU, count=1))
    config.dynamic_batching.preferred_batch_size.extend(PREFERRED_BATCH_SIZES)
    config.dynamic_batching.max_queue_delay_microseconds = MAX_QUEUE_DELAY_US
    bound_queue(config)
    accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
    accelerator.parameters.update(
        {
            "precision_mode": "FP16",
            "max_workspace_size_bytes": str(2 << 30),
            "trt_engine_cache_enable": "1",
            "trt_engine_cache_path": TENSORRT_CACHE_PATH,
        }
    )
    # The backend's CUDA provider (what TensorRT leaves to it, and the tensors it hands TensorRT) takes its arena
    # settings as model parameters; 1 is kSameAsRequested.
    arena = {"gpu_mem_limit": str(GPU_MEMORY_LIMIT_BYTES), "arena_extend_strategy": "1"}
    set_parameters(config, {**_model_params(model), **arena})
    add_token_warmup(config)
    return config


def add_token_warmup(
    config: mc.ModelConfig, names: tuple[str, ...] = TOKEN_INPUTS, tokens: int = WARMUP_TOKENS
) -> None:
    warmup = config.model_warmup.add(name=f"batch8_len{tokens}", batch_size=8)
    for name in names:
        # Token id 0 is in every vocabulary (and a valid token type); an all-zero mask still runs every kernel.
        warmup.inputs[name].CopyFrom(mc.ModelWarmup.Input(data_type=mc.TYPE_INT64, dims=[tokens], zero_data=True))


def ensemble_config(model: ServedModel) -> mc.ModelConfig:
    """`bge`: TEXT -> tokenizer -> encoder -> EMBEDDING (plus token counts for usage reporting)."""
    config = mc.ModelConfig(name=ENSEMBLE, platform="ensemble", max_batch_size=MAX_BATCH_SIZE)
    config.input.append(mc.ModelInput(name="TEXT", data_type=mc.TYPE_STRING, dims=[1]))
    config.output.extend(
        [
            mc.ModelOutput(name="EMBEDDING", data_type=mc.TYPE_FP32, dims=[model.dimension]),
            mc.ModelOutput(name="TOKEN_COUNT", data_type=mc.TYPE_INT32, dims=[1]),
            mc.ModelOutput(name="TRUNCATED", data_type=mc.TYPE_BOOL, dims=[1]),
        ]
    )
    tokenize = config.ensemble_scheduling.step.add(model_name=TOKENIZER, model_version=-1)
    tokenize.input_map["TEXT"] = "TEXT"
    tokenize.output_map.update(
        {
            "INPUT_IDS": "input_ids",
            "ATTENTION_MASK": "attention_mask",
            "TOKEN_COUNT": "TOKEN_COUNT",
            "TRUNCATED": "TRUNCATED",
        }
    )
    encode = config.ensemble_scheduling.step.add(model_name=ENCODER, model_version=-1)
    encode.input_map.update({"INPUT_IDS": "input_ids", "ATTENTION_MASK": "attention_mask"})
    encode.output_map["EMBEDDING"] = "EMBEDDING"
    set_parameters(config, _model_params(model))
    if model.query_instruction:  # a model without one keeps the configs it had
        set_parameters(config, {"query_instruction": model.query_instruction})
    return config


def render(config: mc.ModelConfig) -> str:
    return str(text_format.MessageToString(config))


def parse(text: str) -> mc.ModelConfig:
    """Parse config.pbtxt text the way Triton does; raises `text_format.ParseError` on a bad config."""
    return text_format.Parse(text, mc.ModelConfig())


def copy_with_config(source: Path, dest: Path, change: Callable[[mc.ModelConfig], None], model: str = ENCODER) -> Path:
    """A copy of the repository `source` (files hard-linked where the file system allows) whose `model`
    config is changed by `change`: a variant to serve (another precision, GPU instances) without re-exporting."""
    shutil.copytree(source, dest, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("__pycache__"))
    config_file = dest / model / "config.pbtxt"
    config = parse(config_file.read_text())
    change(config)
    config_file.unlink()  # may be a link to the source's: write a file of its own
    config_file.write_text(render(config))
    return dest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def rendered_configs(model: ServedModel) -> dict[str, str]:
    """Relative path inside the repository -> config text."""
    return {
        f"{ENSEMBLE}/config.pbtxt": render(ensemble_config(model)),
        f"{TOKENIZER}/config.pbtxt": render(tokenizer_config(model)),
        f"{ENCODER}/config.pbtxt": render(encoder_config(model)),
        f"{ENCODER}/configs/{NATIVE_CONFIG_NAME}.pbtxt": render(native_encoder_config(model)),
        f"{CHUNKER}/config.pbtxt": render(chunker_config(model)),
    }


def install(repository: Path, model: ServedModel, encoder_files: list[Path], tokenizer_file: Path) -> None:
    """Move the checked files into `repository` and write the configs.

    Every file is staged beside its target and swapped in with `os.replace`,
    so a server reading the repository never sees a half-written file. `bge_chunker` gets its own copy of the
    tokenizer file, from the same staged file as `bge_tokenizer`'s: a model reads only its own folder (Triton
    may hand each model a copy of just that folder, as it does from object storage).
    """
    replace_file(repository / CHUNKER / "1" / "tokenizer.json", partial(shutil.copyfile, tokenizer_file))
    targets = {f: repository / ENCODER / "1" / f.name for f in encoder_files}
    targets[tokenizer_file] = repository / TOKENIZER / "1" / "tokenizer.json"
    for source, target in targets.items():
        replace_file(target, partial(shutil.move, source))
    for relative, text in rendered_configs(model).items():
        replace_file(repository / relative, partial(write_text, text))
    (repository / ENSEMBLE / "1").mkdir(parents=True, exist_ok=True)


def write_text(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")


def replace_file(target: Path, write: Callable[[Path], object]) -> None:
    """`write` a file beside `target`, then rename it over `target`: a reader sees the old file or the new one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    write(tmp)
    os.replace(tmp, target)
