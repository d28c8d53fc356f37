"""The real export pipeline on a tiny random CLS-pooled BERT and on the real MiniLM checkpoint."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from tokenizers import Tokenizer

from export.checkpoint import Checkpoint
from export.config import Precision, Tolerance
from export.errors import CheckpointError, ToleranceError
from export.pipeline import main_export
from export.precision import LOWEST, MASK_FLOOR, replace_scalar_constants
from export.repository import parse
from tests.helpers.checkout import ROOT, copy_tracked_repository
from tests.helpers.model_modules import load_model_module
from tests.helpers.sentences import CHINESE, ENGLISH, mixed_texts

pytestmark = pytest.mark.slow


def snapshot(repository: Path) -> dict[str, str]:
    return {
        str(p.relative_to(repository)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(repository.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory, tiny_cls_checkpoint: Path) -> tuple[Path, dict[str, object]]:
    repository = copy_tracked_repository(tmp_path_factory.mktemp("tiny") / "model_repository")
    report = main_export(str(tiny_cls_checkpoint), repository, max_length=128, work_dir=tmp_path_factory.mktemp("w"))
    return repository, report


def assert_parity_holds(report: dict[str, object]) -> None:
    parity = report["parity"]
    assert isinstance(parity, dict)
    assert parity["fp32"]["min_cosine"] >= 0.9999
    assert parity["int8"]["min_cosine"] >= 0.96 and parity["int8"]["mean_cosine"] >= 0.99
    assert parity["fp16"]["min_cosine"] >= 0.999 if parity["fp16"]["checked"] else parity["fp16"]["reason"]
    assert all(v["passed"] in (True, None) for v in parity.values())


def test_tiny_cls_model_exports_within_tolerance(tiny_export: tuple[Path, dict[str, object]]) -> None:
    repository, report = tiny_export
    assert (report["pooling"], report["dimension"], report["max_sequence_length"]) == ("cls", 64, 128)
    assert_parity_holds(report)
    files = repository / "bge_onnx" / "1"
    assert {p.name for p in files.glob("*.onnx")} == {"model.onnx", "model_fp16.onnx", "model_int8.onnx"}
    assert json.loads((files / "parity.json").read_text()) == json.loads(json.dumps(report))
    assert (repository / "bge_tokenizer" / "1" / "tokenizer.json").is_file()
    assert not list(repository.rglob(".*.tmp"))


def test_graph_has_dynamic_axes_pooling_and_passes_the_checker(tiny_export: tuple[Path, dict[str, object]]) -> None:
    model = onnx.load(str(tiny_export[0] / "bge_onnx" / "1" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert [i.name for i in model.graph.input] == ["INPUT_IDS", "ATTENTION_MASK"]
    for graph_input in model.graph.input:
        dims = [d.dim_param for d in graph_input.type.tensor_type.shape.dim]
        assert dims == ["batch", "sequence"]
    (output,) = model.graph.output
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 64]


def test_configs_carry_dimension_revision_and_max_length(tiny_export: tuple[Path, dict[str, object]]) -> None:
    repository, report = tiny_export
    ensemble = parse((repository / "bge" / "config.pbtxt").read_text())
    assert list(ensemble.output[0].dims) == [64]
    for name in ("bge", "bge_onnx", "bge_tokenizer"):
        params = parse((repository / name / "config.pbtxt").read_text()).parameters
        assert params["model_revision"].string_value == report["revision"]
        assert params["max_sequence_length"].string_value == "128"


def test_real_minilm_checkpoint_exports_within_tolerance(minilm_repository: Path, minilm: Checkpoint) -> None:
    report = json.loads((minilm_repository / "bge_onnx" / "1" / "parity.json").read_text())
    assert (report["model"], report["revision"], report["pooling"]) == (minilm.name, minilm.revision, "mean")
    assert report["max_sequence_length"] == 512 and report["dimension"] == 384
    assert_parity_holds(report)


def test_int8_mask_floor_keeps_the_vectors_of_batches_padded_as_bge_onnx_pads_them(
    minilm_repository: Path, tmp_path: Path
) -> None:
    """The INT8 graph adds MASK_FLOOR, not float32's lowest, to a padded key's score. Run as `bge_onnx` runs it
    (each batch sorted by length, in chunks of similar length), its vectors are those of the same graph with
    the exporter's own mask."""
    served = minilm_repository / "bge_onnx" / "1" / "model_int8.onnx"
    graph = onnx.load(str(served))
    assert replace_scalar_constants(graph, LOWEST, MASK_FLOOR) == 0  # no float32-lowest mask left in it
    assert replace_scalar_constants(graph, MASK_FLOOR, LOWEST) == 1  # the exporter's own mask put back
    exporters = tmp_path / "exporters_mask.onnx"
    onnx.save(graph, str(exporters))

    encoder = load_model_module("bge_onnx", "encoder")
    plan = encoder.plan_session("CPU", 0, {"parallel_runs": "1", "intra_op_threads": "1"}, "")
    tokenizer = Tokenizer.from_file(str(minilm_repository / "bge_tokenizer" / "1" / "tokenizer.json"))
    encodings = tokenizer.encode_batch([*ENGLISH, *CHINESE, *mixed_texts(26, "mask")])
    ids = [np.array([e.ids], dtype=np.int64) for e in encodings]
    vectors = []
    for path in (served, exporters):
        session = encoder.create_session(str(path), plan)

        def run(input_ids: np.ndarray, mask: np.ndarray, session: Any = session) -> np.ndarray:
            return np.asarray(session.run(None, {"INPUT_IDS": input_ids, "ATTENTION_MASK": mask})[0])

        vectors.append(np.concatenate(encoder.encode_by_length(run, ids, [np.ones_like(i) for i in ids])))
    np.testing.assert_allclose(vectors[0], vectors[1], rtol=0, atol=1e-6)


def test_corrupt_weights_fail_clearly_and_keep_the_served_model(
    tiny_export: tuple[Path, dict[str, object]], tiny_cls_checkpoint: Path, tmp_path: Path
) -> None:
    broken = shutil.copytree(tiny_cls_checkpoint, tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    before = snapshot(tiny_export[0])
    with pytest.raises(CheckpointError, match="cannot load weights from"):
        main_export(str(broken), tiny_export[0], work_dir=tmp_path)
    assert snapshot(tiny_export[0]) == before


def test_weights_that_do_not_fit_the_config_fail_clearly(tiny_cls_checkpoint: Path, tmp_path: Path) -> None:
    mismatched = shutil.copytree(tiny_cls_checkpoint, tmp_path / "mismatched")
    config = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    with pytest.raises(CheckpointError, match="weights"):
        main_export(str(mismatched), copy_tracked_repository(tmp_path / "repo"), work_dir=tmp_path)


def test_tokenizer_from_another_checkpoint_fails_clearly(tiny_cls_checkpoint: Path, tmp_path: Path) -> None:
    mismatched = shutil.copytree(tiny_cls_checkpoint, tmp_path / "mismatched")
    config = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    with pytest.raises(CheckpointError, match="different checkpoints"):
        main_export(str(mismatched), copy_tracked_repository(tmp_path / "repo"), work_dir=tmp_path)


def test_parity_below_threshold_fails_and_keeps_the_served_model(
    tiny_export: tuple[Path, dict[str, object]], tiny_cls_checkpoint: Path, tmp_path: Path
) -> None:
    before = snapshot(tiny_export[0])
    # A cosine cannot exceed 1: no variant can meet this threshold.
    unreachable = {Precision.INT8: Tolerance(min_cosine=1.001, mean_cosine=1.001)}
    with pytest.raises(ToleranceError, match=r"int8: min cosine [01]\.\d+ \(needs >= 1\.001\)"):
        main_export(str(tiny_cls_checkpoint), tiny_export[0], max_length=128, work_dir=tmp_path, tolerances=unreachable)
    assert snapshot(tiny_export[0]) == before


def test_cli_reports_failure_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "export", "--model", str(tmp_path / "missing"), "--repository", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "export failed, the served model is unchanged" in result.stderr
    assert "Traceback" not in result.stderr
