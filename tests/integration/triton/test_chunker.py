"""`bge_chunker` on the real Triton: a text's windows of the served tokenizer's tokens, as code-point spans."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Encoding, Tokenizer
from tritonclient.utils import InferenceServerException

from tests.helpers.sentences import CHINESE, ENGLISH
from tests.helpers.triton_embeddings import grpc_embed, text_batch

pytestmark = pytest.mark.slow

MODEL = "bge_chunker"
# Words WordPiece cuts into several pieces, accents the normalizer strips (a combining one too), Chinese and emoji.
WORDS = [
    *" ".join(ENGLISH).split(),
    *CHINESE,
    "tokenization",
    "multilingual",
    "Triton's",
    "naïve",
    "cafe\u0301",
    "Ünïcödé",
    "🙂",
    "👍🏽",
    "👨\u200d👩\u200d👧",
    "深度学习🚀",
    "2026-12-05",
    "\n\n",
]
MIXED = "Café 你好，世界！🙂 naïve 👍🏽 深度学习模型。 " * 3


def document(characters: int, seed: int = 0) -> str:
    """Deterministic text of `characters` code points drawn from WORDS."""
    rng = np.random.default_rng(seed)
    words, size = [], 0
    while size < characters:
        words.append(WORDS[rng.integers(len(WORDS))])
        size += len(words[-1]) + 1
    return " ".join(words)[:characters]


@pytest.fixture(scope="module")
def tokenizer(minilm_repository: Path) -> Tokenizer:
    """The tokenizer bge serves, counting every token (its tokenizer.json pads and truncates at 128)."""
    served = Tokenizer.from_file(str(minilm_repository / "bge_tokenizer" / "1" / "tokenizer.json"))
    served.no_padding()
    served.no_truncation()
    return served


def chunk(client: grpcclient.InferenceServerClient, text: str | bytes, max_tokens: int, overlap: int) -> np.ndarray:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    inputs = [
        grpcclient.InferInput("TEXT", [1], "BYTES"),
        grpcclient.InferInput("MAX_TOKENS", [1], "INT32"),
        grpcclient.InferInput("OVERLAP", [1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([raw], dtype=object))
    inputs[1].set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([overlap], dtype=np.int32))
    spans = client.infer(MODEL, inputs).as_numpy("SPANS")
    assert spans is not None and spans.dtype == np.int32 and spans.ndim == 2 and spans.shape[1] == 2
    return spans


def expected_spans(tokenizer: Tokenizer, text: str, max_tokens: int, overlap: int) -> list[list[int]]:
    """The contract, computed here from HF `tokenizers` alone."""
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    width = max_tokens - tokenizer.num_special_tokens_to_add(False)
    if not offsets:
        return [[0, len(text)]]
    spans, first = [], 0
    while True:
        end = min(first + width, len(offsets))
        spans.append([offsets[first][0], offsets[end - 1][1]])
        if end == len(offsets):
            return spans
        first += width - overlap


def token_ranges(encoding: Encoding, spans: np.ndarray) -> list[tuple[int, int]]:
    """Each span's tokens [first, end) in the document's tokenization."""
    starts = [start for start, _ in encoding.offsets]
    ends = [end for _, end in encoding.offsets]
    return [(starts.index(int(start)), len(ends) - ends[::-1].index(int(end))) for start, end in spans]


@pytest.mark.parametrize(("max_tokens", "overlap"), [(16, 4), (34, 0), (130, 32), (512, 100)])
def test_spans_are_the_served_tokenizers_windows(
    max_tokens: int, overlap: int, grpc_client: grpcclient.InferenceServerClient, tokenizer: Tokenizer
) -> None:
    text = document(6_000, seed=max_tokens)
    spans = chunk(grpc_client, text, max_tokens, overlap)
    assert spans.tolist() == expected_spans(tokenizer, text, max_tokens, overlap)

    encoding = tokenizer.encode(text, add_special_tokens=False)
    ranges = token_ranges(encoding, spans)
    width = max_tokens - 2  # [CLS] ... [SEP]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(encoding.ids)  # every token is in a chunk
    assert all(0 < end - first <= width for first, end in ranges)
    for (_, end), (next_first, next_end) in itertools.pairwise(ranges):
        assert end - next_first == overlap and next_end > end  # overlap exactly, no repeated last window
    for (start, end), (first, _) in zip(spans, ranges, strict=True):
        alone = len(tokenizer.encode(text[start:end]).ids)  # embedded alone, with [CLS] and [SEP]
        # A chunk starting inside a word re-tokenizes that word's tail from scratch ("##ls" -> "l", "##s"), which
        # may take a token more (docs/model.md); every other chunk fits.
        inside_a_word = first > 0 and encoding.word_ids[first] == encoding.word_ids[first - 1]
        assert alone <= max_tokens or inside_a_word, (text[start:end], alone)


def test_offsets_are_code_points_into_the_original_text(
    grpc_client: grpcclient.InferenceServerClient, tokenizer: Tokenizer
) -> None:
    spans = chunk(grpc_client, MIXED, 6, 1)  # four tokens a chunk
    assert spans.tolist() == expected_spans(tokenizer, MIXED, 6, 1)
    assert spans[-1, 1] == len(MIXED.rstrip()) < len(MIXED.encode("utf-8"))
    assert [MIXED[start:end] for start, end in spans[:3]] == ["Café 你好，", "，世界！", "！🙂 naïve 👍🏽"]
    # The normalizer lowercases and strips accents; spans still cut the text as it was sent. A combining mark the
    # normalizer drops after a word's last letter belongs to no token, so it lies outside a span ending there.
    assert chunk(grpc_client, "Cafe\u0301 Ünïcödé", 3, 0).tolist() == [[0, 4], [6, 13]]


def test_a_100000_character_text(grpc_client: grpcclient.InferenceServerClient, tokenizer: Tokenizer) -> None:
    text = document(100_000, seed=7)
    spans = chunk(grpc_client, text, 256, 32)
    assert spans.tolist() == expected_spans(tokenizer, text, 256, 32)
    assert len(spans) > 100 and spans[-1, 1] == len(text.rstrip())


@pytest.mark.parametrize(
    "text", ["", " ", " \t\n  \u3000", "\u200b\u0301"], ids=["empty", "space", "spaces", "dropped"]
)
def test_a_text_without_tokens_is_one_span_over_it(text: str, grpc_client: grpcclient.InferenceServerClient) -> None:
    assert chunk(grpc_client, text, 16, 4).tolist() == [[0, len(text)]]


def test_a_short_text_is_one_chunk(grpc_client: grpcclient.InferenceServerClient) -> None:
    text = ENGLISH[1]  # 13 tokens
    assert chunk(grpc_client, text, 15, 14 - 2 - 1).tolist() == [[0, len(text)]]
    assert len(chunk(grpc_client, text, 14, 0)) == 2


@pytest.mark.parametrize(
    ("text", "max_tokens", "overlap", "message"),
    [
        ("hello", 2, 0, r"MAX_TOKENS must be from 3 to 512, got 2"),
        ("hello", 513, 0, r"MAX_TOKENS must be from 3 to 512, got 513"),
        ("hello", 16, 14, r"OVERLAP must be from 0 to 13 .*, got 14"),
        ("hello", 16, -1, r"OVERLAP must be from 0 to 13 .*, got -1"),
        (b"caf\xe9 \xff", 16, 0, r"TEXT is not valid UTF-8 \(byte 3\)"),
    ],
    ids=["max-tokens-low", "max-tokens-high", "overlap-high", "overlap-negative", "invalid-utf8"],
)
def test_bad_requests_fail_with_invalid_arg_naming_the_input(
    text: str | bytes, max_tokens: int, overlap: int, message: str, grpc_client: grpcclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match=message) as refused:
        chunk(grpc_client, text, max_tokens, overlap)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert chunk(grpc_client, "still serving", 16, 0).tolist() == [[0, 13]]


def test_concurrent_requests_each_get_their_own_spans(
    grpc_client: grpcclient.InferenceServerClient, tokenizer: Tokenizer
) -> None:
    texts = [document(2_000, seed=seed) for seed in range(8)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda text: chunk(grpc_client, text, 64, 8).tolist(), texts))
    assert answers == [expected_spans(tokenizer, text, 64, 8) for text in texts]


def test_the_chunker_serves_the_tokenizer_and_revision_bge_serves(
    grpc_client: grpcclient.InferenceServerClient, minilm_repository: Path
) -> None:
    served = (minilm_repository / "bge_tokenizer" / "1" / "tokenizer.json").read_bytes()
    assert (minilm_repository / MODEL / "1" / "tokenizer.json").read_bytes() == served
    ours = grpc_client.get_model_config(MODEL, as_json=True)["config"]["parameters"]
    bge = grpc_client.get_model_config("bge", as_json=True)["config"]["parameters"]
    for name in ("model_name", "model_revision", "max_sequence_length"):
        assert ours[name]["string_value"] == bge[name]["string_value"]
    assert grpc_embed(grpc_client, text_batch(["bge still answers"])).as_numpy("EMBEDDING").shape == (1, 384)
