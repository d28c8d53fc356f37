from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from export.checkpoint import Checkpoint, read_pooling, read_query_prompt, resolve_checkpoint
from export.config import ONNX_CONFIGS, Pooling, onnx_config_for
from export.errors import CheckpointError, UnsupportedModelError
from export.pipeline import effective_max_length


def write_pooling(path: Path, **modes: bool) -> Path:
    (path / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (path / "modules.json").write_text(
        json.dumps([{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **modes}))
    return path


def test_default_checkpoint_is_the_packaged_minilm(minilm: Checkpoint) -> None:
    assert minilm.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert (minilm.model_type, minilm.hidden_size, minilm.pooling) == ("bert", 384, Pooling.MEAN)
    assert minilm.revision.startswith("sha256-") and len(minilm.revision) == len("sha256-") + 16


def test_revision_is_stable_across_reads(minilm: Checkpoint) -> None:
    assert resolve_checkpoint(str(minilm.path)).revision == minilm.revision


@pytest.mark.parametrize(
    ("modes", "expected"),
    [({"pooling_mode_cls_token": True}, Pooling.CLS), ({"pooling_mode_mean_tokens": True}, Pooling.MEAN)],
)
def test_pooling_follows_sentence_transformers_config(
    tmp_path: Path, modes: dict[str, bool], expected: Pooling
) -> None:
    assert read_pooling(write_pooling(tmp_path, **modes), hidden_size=8) is expected


def test_no_sentence_transformers_config_means_mean_pooling(tmp_path: Path) -> None:
    assert read_pooling(tmp_path, hidden_size=8) is Pooling.MEAN


def test_unsupported_pooling_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="pooling"):
        read_pooling(write_pooling(tmp_path, pooling_mode_max_tokens=True), hidden_size=8)


def test_pooling_dimension_must_match_encoder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="8-dim token embeddings but the encoder has 16"):
        read_pooling(write_pooling(tmp_path, pooling_mode_cls_token=True), hidden_size=16)


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a directory"):
        resolve_checkpoint(str(tmp_path / "nowhere"))


def test_unknown_hub_id_offline_is_a_clear_error() -> None:
    with pytest.raises(CheckpointError, match="cannot fetch 'BAAI/no-such-model'"):
        resolve_checkpoint("BAAI/no-such-model")


def test_corrupt_config_is_a_clear_error(tmp_path: Path, minilm: Checkpoint) -> None:
    shutil.copytree(minilm.path, tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
        resolve_checkpoint(str(tmp_path / "m"))


def test_missing_weights_are_a_clear_error(tmp_path: Path, minilm: Checkpoint) -> None:
    shutil.copytree(minilm.path, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(CheckpointError, match="has no weights"):
        resolve_checkpoint(str(tmp_path / "m"))


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="'gpt2' has no export config; supported: bert"):
        onnx_config_for("gpt2")


def test_export_configs_use_opset_17_or_newer_with_dynamic_axes() -> None:
    for config in ONNX_CONFIGS.values():
        assert config.opset >= 17
        assert config.dynamic_axes["INPUT_IDS"] == {0: "batch", 1: "sequence"}
        assert config.dynamic_axes["EMBEDDING"] == {0: "batch"}


def test_max_length_is_capped_by_position_embeddings(minilm: Checkpoint) -> None:
    assert effective_max_length(minilm, onnx_config_for("bert"), 512) == 512
    assert effective_max_length(minilm, onnx_config_for("bert"), 4096) == 512
    assert effective_max_length(minilm, onnx_config_for("xlm-roberta"), 4096) == 510
    with pytest.raises(ValueError, match=">= 2 tokens"):
        effective_max_length(minilm, onnx_config_for("bert"), 1)


def test_query_prompt_comes_from_the_sentence_transformers_config(tmp_path: Path, minilm: Checkpoint) -> None:
    assert minilm.query_instruction == ""  # all-MiniLM-L6-v2 names no prompts
    (tmp_path / "config_sentence_transformers.json").write_text(
        '{"prompts": {"query": "Represent this sentence for searching relevant passages: ", "document": ""}}'
    )
    assert read_query_prompt(tmp_path) == "Represent this sentence for searching relevant passages: "
    (tmp_path / "config_sentence_transformers.json").write_text('{"prompts": {}}')
    assert read_query_prompt(tmp_path) == ""
