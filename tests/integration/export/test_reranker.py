"""The real reranker export on two tiny random cross-encoders, a BERT one (token types) and an XLM-RoBERTa one
(none, the shape of bge-reranker-v2-m3), then the real Triton serving what it installed.

No reranker weights are reachable offline, so each checkpoint is built here: a randomly initialised
`*ForSequenceClassification` with one label (weights drawn wider than transformers' default, so that the logits
spread over a few units as a trained reranker's do rather than all sitting near 0), with the packaged MiniLM's
BERT tokenizer or a small Unigram tokenizer in XLM-RoBERTa's layout trained on the texts the tests send.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from export.checkpoint import Checkpoint
from export.config import Precision
from export.errors import UnsupportedModelError
from export.pipeline import main_export as export_embedding
from export.repository import copy_with_config, parse
from export.reranker.config import DEFAULT_LOGIT_TOLERANCES, LogitTolerance
from export.reranker.parity import PARITY_PAIRS
from export.reranker.pipeline import main_export
from localtriton.server import TritonProcess
from tests.helpers.checkout import ROOT, copy_tracked_repository
from tests.helpers.cross_encoders import INIT_RANGE, bert_cross_encoder
from tests.helpers.triton_configs import run_fp32

pytestmark = pytest.mark.slow

MAX_LENGTH = 128
RERANKER_MODELS = ("reranker", "reranker_tokenizer", "reranker_onnx")
INT8 = DEFAULT_LOGIT_TOLERANCES[Precision.INT8]
FP32 = DEFAULT_LOGIT_TOLERANCES[Precision.FP32]
LONG_DOCUMENT = "Rerankers read long documents only up to their maximum length. " * 400
SERVED_PAIRS = [
    ("How do I reset my password?", "Open Settings, choose Account and click 'Reset password'."),
    ("How do I reset my password?", "Our stores open at nine in the morning."),
    ("中国的首都是哪里？", "北京是中华人民共和国的首都。"),
    ("中国的首都是哪里？", "今天天气很好，我们去公园散步吧。"),
    ("What is semantic search?", "语义搜索根据查询的含义而不是关键词来排序文档。"),
    ("python list comprehension", "A list comprehension builds a list from an iterable in one expression."),
]


def xlm_roberta_cross_encoder(path: Path) -> Path:
    """XLM-RoBERTa's tokenizer layout as transformers builds it (Unigram, whitespace split then metaspace, `<s> A
    </s></s> B </s>`), so that the CrossEncoder reference and Triton tokenise alike."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaTokenizerFast

    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # XLM-R's ids 0-3, mask after the pieces
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(prepend_scheme="always")]
    )
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="always")
    texts = [text for pair in (*PARITY_PAIRS, *SERVED_PAIRS) for text in pair]
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=special, unk_token="<unk>", show_progress=False)
    tokenizer.train_from_iterator(texts * 4, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    # The special tokens' names are XLMRobertaTokenizerFast's defaults.
    XLMRobertaTokenizerFast(tokenizer_object=tokenizer).save_pretrained(path)
    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_LENGTH + 2,  # positions start after the padding id, as in XLM-R
        type_vocab_size=1,
        num_labels=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        initializer_range=INIT_RANGE,
    )
    XLMRobertaForSequenceClassification(config).save_pretrained(path)
    return path


def snapshot(repository: Path, models: tuple[str, ...]) -> dict[str, str]:
    return {
        str(p.relative_to(repository)): hashlib.sha256(p.read_bytes()).hexdigest()
        for model in models
        for p in sorted((repository / model).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@dataclass(frozen=True)
class Export:
    checkpoint: Path
    repository: Path
    report: dict[str, Any]
    embedding_before: dict[str, str]  # the bge models' files before the reranker was exported


@pytest.fixture(scope="module")
def bert_export(tmp_path_factory: pytest.TempPathFactory, tiny_cls_checkpoint: Path, minilm: Checkpoint) -> Export:
    """The BERT reranker exported into a repository that already serves an (tiny) embedding model."""
    checkpoint = bert_cross_encoder(tmp_path_factory.mktemp("bert-reranker"), minilm, MAX_LENGTH)
    repository = copy_tracked_repository(tmp_path_factory.mktemp("bert") / "model_repository")
    work = tmp_path_factory.mktemp("work")
    export_embedding(str(tiny_cls_checkpoint), repository, max_length=MAX_LENGTH, work_dir=work)
    before = snapshot(repository, ("bge", "bge_tokenizer", "bge_onnx"))
    report = main_export(str(checkpoint), repository, max_length=MAX_LENGTH, work_dir=work)
    return Export(checkpoint, repository, report, before)


@pytest.fixture(scope="module")
def xlmr_export(tmp_path_factory: pytest.TempPathFactory) -> Export:
    """The XLM-RoBERTa reranker exported into an empty repository: the reranker alone."""
    checkpoint = xlm_roberta_cross_encoder(tmp_path_factory.mktemp("xlmr-reranker"))
    repository = tmp_path_factory.mktemp("xlmr") / "model_repository"
    report = main_export(str(checkpoint), repository, max_length=MAX_LENGTH, work_dir=tmp_path_factory.mktemp("w"))
    return Export(checkpoint, repository, report, {})


@pytest.fixture(params=["bert", "xlmr"])
def exported(request: pytest.FixtureRequest) -> Export:
    export: Export = request.getfixturevalue(f"{request.param}_export")
    return export


@pytest.fixture(scope="module")
def bert_triton(
    bert_export: Export, triton_factory: Callable[[Path], TritonProcess], tmp_path_factory: pytest.TempPathFactory
) -> TritonProcess:
    """bge and the BERT reranker together, the reranker on its FP32 graph: Triton's scores can be held to the FP32
    parity bound, which any slip in token types, padding or batching would break."""
    fp32 = tmp_path_factory.mktemp("bert-fp32") / "model_repository"
    return triton_factory(copy_with_config(bert_export.repository, fp32, run_fp32, model="reranker_onnx"))


@pytest.fixture(scope="module")
def xlmr_triton(xlmr_export: Export, triton_factory: Callable[[Path], TritonProcess]) -> TritonProcess:
    """The XLM-RoBERTa reranker as exported: INT8 on the CPU."""
    return triton_factory(xlmr_export.repository)


@pytest.fixture(params=[("bert", FP32), ("xlmr", INT8)], ids=["bert-fp32", "xlmr-int8"])
def served(request: pytest.FixtureRequest) -> tuple[TritonProcess, Export, LogitTolerance]:
    name, tolerance = request.param
    return request.getfixturevalue(f"{name}_triton"), request.getfixturevalue(f"{name}_export"), tolerance


def cross_encoder_logits(checkpoint: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(checkpoint), device="cpu", max_length=MAX_LENGTH)
    return np.asarray(model.predict(pairs, activation_fn=torch.nn.Identity(), show_progress_bar=False))


def hf_token_counts(checkpoint: Path, pairs: list[tuple[str, str]]) -> list[int]:
    """What transformers' own tokenizer makes of each pair, truncated as CrossEncoder truncates."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    return [len(tokenizer(q, d, truncation="longest_first", max_length=MAX_LENGTH)["input_ids"]) for q, d in pairs]


def pair_inputs(pairs: list[tuple[str, str]], module: Any = grpcclient) -> list[Any]:
    tensors = []
    for index, name in enumerate(("QUERY", "DOCUMENT")):
        raw = np.array([[pair[index].encode("utf-8")] for pair in pairs], dtype=object)
        tensor = module.InferInput(name, list(raw.shape), "BYTES")
        tensor.set_data_from_numpy(raw)
        tensors.append(tensor)
    return tensors


def rerank(triton: TritonProcess, pairs: list[tuple[str, str]]) -> grpcclient.InferResult:
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        return client.infer("reranker", pair_inputs(pairs))


def test_export_passes_parity_and_installs_the_reranker_group(exported: Export) -> None:
    report, repository = exported.report, exported.repository
    for precision, bounds in DEFAULT_LOGIT_TOLERANCES.items():
        parity = report["parity"][precision.value]
        if parity["checked"]:
            assert parity["passed"] and parity["max_abs_diff"] <= bounds.max_abs_diff, parity
            assert parity["spearman"] >= bounds.min_spearman, parity
        else:
            assert precision is Precision.FP16 and parity["reason"]
    files = repository / "reranker_onnx" / "1"
    assert {p.name for p in files.glob("*.onnx")} == {"model.onnx", "model_fp16.onnx", "model_int8.onnx"}
    assert json.loads((files / "parity.json").read_text()) == json.loads(json.dumps(report))
    assert {p.name for p in files.glob("*.py")} == {"model.py", "scorer.py", "encoder.py"}
    tokenizer_files = {p.name for p in (repository / "reranker_tokenizer" / "1").iterdir()}
    assert {"model.py", "pair_tokenization.py", "tokenization.py", "tokenizer.json"} <= tokenizer_files
    assert (repository / "reranker" / "1").is_dir() and not list(repository.rglob(".*.tmp"))


@pytest.mark.parametrize(
    ("name", "inputs"),
    [("bert", ["INPUT_IDS", "ATTENTION_MASK", "TOKEN_TYPE_IDS"]), ("xlmr", ["INPUT_IDS", "ATTENTION_MASK"])],
)
def test_token_type_ids_flow_only_where_the_model_has_them(
    name: str, inputs: list[str], request: pytest.FixtureRequest
) -> None:
    import onnx

    export: Export = request.getfixturevalue(f"{name}_export")
    graph = onnx.load(str(export.repository / "reranker_onnx" / "1" / "model.onnx"))
    assert [i.name for i in graph.graph.input] == inputs
    (output,) = graph.graph.output
    assert output.name == "SCORE"
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 1]
    tokenizer = parse((export.repository / "reranker_tokenizer" / "config.pbtxt").read_text())
    scorer = parse((export.repository / "reranker_onnx" / "config.pbtxt").read_text())
    assert [o.name for o in tokenizer.output] == [*inputs, "TOKEN_COUNT", "TRUNCATED"]
    assert [i.name for i in scorer.input] == inputs
    assert export.report["inputs"] == inputs


def test_the_embedding_models_are_untouched(bert_export: Export) -> None:
    assert bert_export.embedding_before
    assert snapshot(bert_export.repository, ("bge", "bge_tokenizer", "bge_onnx")) == bert_export.embedding_before


def test_a_checkpoint_with_several_labels_is_refused_and_nothing_changes(bert_export: Export, tmp_path: Path) -> None:
    several = shutil.copytree(bert_export.checkpoint, tmp_path / "three-labels")
    config = json.loads((several / "config.json").read_text())
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(3)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(3)}
    (several / "config.json").write_text(json.dumps(config))
    before = snapshot(bert_export.repository, ("bge", "bge_onnx", "bge_tokenizer", *RERANKER_MODELS))
    with pytest.raises(UnsupportedModelError, match="3 labels"):
        main_export(str(several), bert_export.repository, max_length=MAX_LENGTH, work_dir=tmp_path)
    assert snapshot(bert_export.repository, ("bge", "bge_onnx", "bge_tokenizer", *RERANKER_MODELS)) == before


def test_cli_reports_failure_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "export.reranker", "--model", str(tmp_path / "missing"), "--repository", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "reranker export failed, the served models are unchanged" in result.stderr
    assert "Traceback" not in result.stderr


def test_scores_match_the_cross_encoder_logits(served: tuple[TritonProcess, Export, LogitTolerance]) -> None:
    triton, export, tolerance = served
    result = rerank(triton, SERVED_PAIRS)
    scores = result.as_numpy("SCORE")
    assert scores.shape == (len(SERVED_PAIRS), 1) and scores.dtype == np.float32
    reference = cross_encoder_logits(export.checkpoint, SERVED_PAIRS)
    np.testing.assert_allclose(scores.ravel(), reference, rtol=0, atol=tolerance.max_abs_diff)
    # The order of every two pairs the reference sets further apart than twice the bound: closer ones may swap
    # within it (6 pairs are too few for the export gate's Spearman, which 2 close INT8 logits swapped can sink).
    served, apart = scores.ravel(), 2 * tolerance.max_abs_diff
    for i in range(len(reference)):
        for j in range(len(reference)):
            if reference[i] - reference[j] > apart:
                assert served[i] > served[j], (i, j, served, reference)


def test_token_counts_are_what_the_model_saw(served: tuple[TritonProcess, Export, LogitTolerance]) -> None:
    triton, export, _ = served
    result = rerank(triton, SERVED_PAIRS)
    assert result.as_numpy("TOKEN_COUNT").dtype == np.int32
    assert result.as_numpy("TOKEN_COUNT").ravel().tolist() == hf_token_counts(export.checkpoint, SERVED_PAIRS)
    assert not result.as_numpy("TRUNCATED").any()


def test_a_long_document_is_truncated_not_refused(served: tuple[TritonProcess, Export, LogitTolerance]) -> None:
    triton, export, tolerance = served
    pairs = [("Why are long documents cut?", LONG_DOCUMENT), SERVED_PAIRS[0]]
    result = rerank(triton, pairs)
    assert result.as_numpy("TRUNCATED").ravel().tolist() == [True, False]
    assert result.as_numpy("TOKEN_COUNT").ravel().tolist() == hf_token_counts(export.checkpoint, pairs)
    assert result.as_numpy("TOKEN_COUNT")[0, 0] == MAX_LENGTH
    reference = cross_encoder_logits(export.checkpoint, pairs)
    np.testing.assert_allclose(result.as_numpy("SCORE").ravel(), reference, rtol=0, atol=tolerance.max_abs_diff)


def test_the_ensemble_names_the_model_for_the_gateway(served: tuple[TritonProcess, Export, LogitTolerance]) -> None:
    triton, export, _ = served
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        config = client.get_model_config("reranker").config
    params = {key: value.string_value for key, value in config.parameters.items()}
    assert params == {
        "model_name": export.report["model"],
        "model_revision": export.report["revision"],
        "max_sequence_length": str(MAX_LENGTH),
    }
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("SCORE", mc.TYPE_FP32, [1]),
        ("TOKEN_COUNT", mc.TYPE_INT32, [1]),
        ("TRUNCATED", mc.TYPE_BOOL, [1]),
    ]


def test_bge_is_served_beside_the_reranker(bert_triton: TritonProcess) -> None:
    with grpcclient.InferenceServerClient(bert_triton.grpc_url) as client:
        assert all(client.is_model_ready(name) for name in ("bge", *RERANKER_MODELS))
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"still embedding"]], dtype=object))
        assert client.infer("bge", [text]).as_numpy("EMBEDDING").shape == (1, 64)


async def test_concurrent_pairs_of_different_lengths_batch_together(
    bert_triton: TritonProcess, bert_export: Export
) -> None:
    # Single-pair requests of distinct token lengths: only ragged batching can group them.
    pairs = [(f"query {i}", " ".join(["passage"] * (i + 1)) + f" number {i}") for i in range(24)]
    client = grpcaio.InferenceServerClient(bert_triton.grpc_url)
    try:
        before = await client.get_inference_statistics("reranker_onnx", as_json=True)
        results = await asyncio.gather(*(client.infer("reranker", pair_inputs([p], grpcaio)) for p in pairs))
        after = await client.get_inference_statistics("reranker_onnx", as_json=True)
    finally:
        await client.close()
    counts = [
        (int(s["model_stats"][0].get("inference_count", 0)), int(s["model_stats"][0].get("execution_count", 0)))
        for s in (before, after)
    ]
    assert counts[1][0] - counts[0][0] == len(pairs)
    assert counts[1][1] - counts[0][1] < len(pairs)
    scores = np.array([r.as_numpy("SCORE")[0, 0] for r in results])
    reference = cross_encoder_logits(bert_export.checkpoint, pairs)
    np.testing.assert_allclose(scores, reference, rtol=0, atol=FP32.max_abs_diff)


@pytest.mark.parametrize(
    ("query", "document", "message"),
    [
        (b"a query", b"  ", "DOCUMENT text 0 is empty or only whitespace"),
        (b"\xff", b"a document", "QUERY text 0 is not valid UTF-8"),
    ],
    ids=["blank-document", "invalid-query"],
)
def test_a_bad_pair_gets_a_clear_error_and_the_server_stays_up(
    query: bytes, document: bytes, message: str, xlmr_triton: TritonProcess
) -> None:
    with grpcclient.InferenceServerClient(xlmr_triton.grpc_url) as client:
        inputs = []
        for name, raw in (("QUERY", query), ("DOCUMENT", document)):
            tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[raw]], dtype=object))
            inputs.append(tensor)
        with pytest.raises(InferenceServerException, match=message) as error:
            client.infer("reranker", inputs)
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert client.infer("reranker", pair_inputs(SERVED_PAIRS[:1])).as_numpy("SCORE").shape == (1, 1)


def test_queries_and_documents_of_different_counts_are_refused(xlmr_triton: TritonProcess) -> None:
    with grpcclient.InferenceServerClient(xlmr_triton.grpc_url) as client:
        inputs = pair_inputs(SERVED_PAIRS[:2])
        document = grpcclient.InferInput("DOCUMENT", [1, 1], "BYTES")
        document.set_data_from_numpy(np.array([[b"one document"]], dtype=object))
        # Triton itself holds every input of a batched model to one row count.
        with pytest.raises(InferenceServerException, match="'QUERY' batch size does not match") as error:
            client.infer("reranker", [inputs[0], document])
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"


async def test_one_bad_pair_fails_only_its_own_request(xlmr_triton: TritonProcess) -> None:
    client = grpcaio.InferenceServerClient(xlmr_triton.grpc_url)

    async def one(pairs: list[tuple[str, str]]) -> object:
        try:
            return (await client.infer("reranker", pair_inputs(pairs, grpcaio))).as_numpy("SCORE")
        except InferenceServerException as exc:
            return exc

    try:
        requests = [[pair] for pair in SERVED_PAIRS]
        requests.insert(3, [SERVED_PAIRS[0], ("a query", "")])
        results = list(await asyncio.gather(*(one(r) for r in requests)))
    finally:
        await client.close()
    assert isinstance(results[3], InferenceServerException) and "DOCUMENT text 1 is empty" in str(results[3])
    assert all(isinstance(r, np.ndarray) and r.shape == (1, 1) for i, r in enumerate(results) if i != 3)
