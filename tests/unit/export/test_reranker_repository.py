"""The reranker's Triton configs and install: tensor contracts, parameters, and that only reranker folders change."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from export.repository import MAX_BATCH_SIZE, parse
from export.reranker.repository import (
    CHECKOUT_REPOSITORY,
    WARMUP_FILES,
    WARMUP_TEXTS,
    ServedReranker,
    install,
    rendered_configs,
)

BERT = ServedReranker("tests/tiny-bert-reranker", "sha256-0123", 512, ("INPUT_IDS", "ATTENTION_MASK", "TOKEN_TYPE_IDS"))
XLMR = ServedReranker("BAAI/bge-reranker-v2-m3", "abc123", 512, ("INPUT_IDS", "ATTENTION_MASK"))


def configs(model: ServedReranker) -> dict[str, mc.ModelConfig]:
    return {path.split("/")[0]: parse(text) for path, text in rendered_configs(model).items()}


@pytest.mark.parametrize("model", [BERT, XLMR], ids=["bert", "xlmr"])
def test_the_ensemble_takes_pairs_and_returns_a_logit_and_counts(model: ServedReranker) -> None:
    config = configs(model)["reranker"]
    assert config.platform == "ensemble" and config.max_batch_size == MAX_BATCH_SIZE
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("QUERY", mc.TYPE_STRING, [1]),
        ("DOCUMENT", mc.TYPE_STRING, [1]),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("SCORE", mc.TYPE_FP32, [1]),
        ("TOKEN_COUNT", mc.TYPE_INT32, [1]),
        ("TRUNCATED", mc.TYPE_BOOL, [1]),
    ]
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "model_name": model.name,
        "model_revision": model.revision,
        "max_sequence_length": "512",
    }
    tokenize, score = config.ensemble_scheduling.step
    assert (tokenize.model_name, score.model_name) == ("reranker_tokenizer", "reranker_onnx")
    # Every token tensor the tokenizer makes is one the scorer takes, and no other.
    assert {k: v for k, v in tokenize.output_map.items() if k in model.token_inputs} == dict(score.input_map)
    assert sorted(score.input_map) == sorted(model.token_inputs)


@pytest.mark.parametrize("model", [BERT, XLMR], ids=["bert", "xlmr"])
def test_tokenizer_and_scorer_declare_token_types_only_where_the_model_has_them(model: ServedReranker) -> None:
    tokenizer, scorer = configs(model)["reranker_tokenizer"], configs(model)["reranker_onnx"]
    assert [o.name for o in tokenizer.output] == [*model.token_inputs, "TOKEN_COUNT", "TRUNCATED"]
    assert [(i.name, i.data_type, list(i.dims), i.allow_ragged_batch) for i in scorer.input] == [
        (name, mc.TYPE_INT64, [-1], True) for name in model.token_inputs
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in scorer.output] == [("SCORE", mc.TYPE_FP32, [1])]
    (warmup,) = scorer.model_warmup
    assert sorted(warmup.inputs) == sorted(model.token_inputs)


def test_the_scorer_runs_as_bge_onnx_runs() -> None:
    scorer = configs(XLMR)["reranker_onnx"]
    bge_onnx = parse((CHECKOUT_REPOSITORY / "bge_onnx" / "config.pbtxt").read_text())
    shared = ("cpu_precision", "gpu_execution_provider", "parallel_runs", "intra_op_threads", "allow_spinning")
    assert {k: scorer.parameters[k].string_value for k in shared} == {
        k: bge_onnx.parameters[k].string_value for k in shared
    }
    assert scorer.parameters["cpu_precision"].string_value == "int8"
    assert scorer.HasField("dynamic_batching") and scorer.dynamic_batching.max_queue_delay_microseconds == 0
    assert scorer.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_a_short_maximum_length_shortens_the_warmup() -> None:
    short = ServedReranker("m", "r", 64, ("INPUT_IDS", "ATTENTION_MASK"))
    (warmup,) = configs(short)["reranker_onnx"].model_warmup
    assert {tuple(i.dims) for i in warmup.inputs.values()} == {(64,)}


def test_install_writes_only_the_reranker_folders(tmp_path: Path) -> None:
    repository = tmp_path / "model_repository"
    (repository / "bge_onnx" / "1").mkdir(parents=True)
    (repository / "bge_onnx" / "1" / "model.onnx").write_bytes(b"the embedding graph")
    staged = tmp_path / "staged"
    staged.mkdir()
    files = [staged / name for name in ("model.onnx", "model_fp16.onnx", "model_int8.onnx", "parity.json")]
    for file in files:
        file.write_text(file.name)
    (staged / "tokenizer.json").write_text("{}")

    install(repository, BERT, files, staged / "tokenizer.json")

    assert sorted(p.name for p in repository.iterdir()) == [
        "bge_onnx",
        "reranker",
        "reranker_onnx",
        "reranker_tokenizer",
    ]
    assert (repository / "bge_onnx" / "1" / "model.onnx").read_bytes() == b"the embedding graph"
    scorer = repository / "reranker_onnx" / "1"
    assert sorted(p.name for p in scorer.iterdir()) == sorted(
        ["encoder.py", "model.py", "scorer.py", *(f.name for f in files)]
    )
    assert filecmp.cmp(scorer / "encoder.py", CHECKOUT_REPOSITORY / "bge_onnx" / "1" / "encoder.py", shallow=False)
    tokenizer = repository / "reranker_tokenizer"
    assert sorted(p.name for p in (tokenizer / "1").iterdir()) == [
        "model.py",
        "pair_tokenization.py",
        "tokenization.py",
        "tokenizer.json",
    ]
    for name, file in WARMUP_FILES.items():
        data = (tokenizer / "warmup" / file).read_bytes()
        assert int.from_bytes(data[:4], "little") == len(data) - 4 and data[4:].decode() == WARMUP_TEXTS[name]
    for relative, text in rendered_configs(BERT).items():
        assert (repository / relative).read_text() == text
    assert not list(repository.rglob(".*.tmp")) and not list(staged.iterdir())
