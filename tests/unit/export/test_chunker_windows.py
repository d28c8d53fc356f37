"""`bge_chunker`'s window arithmetic and validation, without Triton (model_repository/bge_chunker/1/chunking.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from export.checkpoint import Checkpoint
from tests.helpers.model_modules import load_model_module

chunking = load_model_module("bge_chunker", "chunking")

# Ten one-character tokens separated by single spaces: token i spans [2i, 2i + 1).
TEN_TOKENS = [(2 * i, 2 * i + 1) for i in range(10)]


def spans(offsets: list[tuple[int, int]], text_length: int, width: int, overlap: int) -> list[list[int]]:
    result = chunking.chunk_spans(offsets, text_length, width, overlap)
    assert result.dtype == np.int32 and result.shape[1:] == (2,)
    return [[int(start), int(end)] for start, end in result]


@pytest.mark.parametrize(
    ("count", "width", "overlap", "windows"),
    [
        (10, 4, 0, [[0, 4], [4, 8], [8, 10]]),
        (10, 4, 2, [[0, 4], [2, 6], [4, 8], [6, 10]]),  # the last window ends at the last token, nothing after it
        (11, 4, 2, [[0, 4], [2, 6], [4, 8], [6, 10], [8, 11]]),
        (8, 4, 0, [[0, 4], [4, 8]]),  # no empty window after a full one
        (4, 4, 3, [[0, 4]]),  # exactly one window's worth
        (3, 4, 1, [[0, 3]]),
        (10, 4, 3, [[0, 4], [1, 5], [2, 6], [3, 7], [4, 8], [5, 9], [6, 10]]),  # the largest overlap: step 1
        (5, 1, 0, [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]),
    ],
)
def test_windows_start_every_width_less_overlap_tokens(
    count: int, width: int, overlap: int, windows: list[list[int]]
) -> None:
    assert chunking.token_windows(count, width, overlap).tolist() == windows


@pytest.mark.parametrize("width", [1, 3, 7, 16])
def test_windows_cover_every_token_overlap_exactly_and_never_repeat(width: int) -> None:
    for count, overlap in itertools.product(range(1, 3 * width + 5), range(width)):
        windows = chunking.token_windows(count, width, overlap)
        assert windows[0, 0] == 0 and windows[-1, 1] == count
        assert ((windows[:, 1] - windows[:, 0] <= width) & (windows[:, 1] > windows[:, 0])).all()
        for (first, end), (next_first, next_end) in itertools.pairwise(windows):
            assert end - first == width  # only the last window may be short
            assert end - next_first == overlap and next_end > end


def test_spans_run_from_the_first_tokens_start_to_the_last_tokens_end() -> None:
    assert spans(TEN_TOKENS, 20, 4, 0) == [[0, 7], [8, 15], [16, 19]]
    assert spans(TEN_TOKENS, 20, 4, 2) == [[0, 7], [4, 11], [8, 15], [12, 19]]
    # Word pieces and a gap of dropped characters: a span starts and ends on tokens, never on what lies between.
    pieces = [(0, 4), (4, 7), (9, 10), (10, 15), (20, 21)]  # "play" "##ing" ... "a" ...
    assert spans(pieces, 25, 2, 1) == [[0, 7], [4, 10], [9, 15], [10, 21]]


def test_a_text_of_at_most_width_tokens_is_one_chunk() -> None:
    assert spans(TEN_TOKENS, 20, 10, 0) == [[0, 19]]
    assert spans(TEN_TOKENS, 20, 510, 100) == [[0, 19]]
    assert spans([(3, 5)], 9, 1, 0) == [[3, 5]]


@pytest.mark.parametrize("length", [0, 1, 7])
def test_a_text_without_tokens_is_one_span_over_the_whole_text(length: int) -> None:
    assert spans([], length, 4, 1) == [[0, length]]


@pytest.mark.parametrize(
    ("max_tokens", "overlap", "message"),
    [
        (2, 0, "MAX_TOKENS must be from 3 to 512, got 2"),
        (0, 0, "MAX_TOKENS must be from 3 to 512, got 0"),
        (-5, 0, "MAX_TOKENS must be from 3 to 512, got -5"),
        (513, 0, "MAX_TOKENS must be from 3 to 512, got 513"),
        (3, 1, r"OVERLAP must be from 0 to 0 \(MAX_TOKENS 3 less 2 special tokens, less 1\), got 1"),
        (512, 510, r"OVERLAP must be from 0 to 509 .*, got 510"),
        (512, -1, r"OVERLAP must be from 0 to 509 .*, got -1"),
    ],
)
def test_inputs_out_of_range_are_refused_naming_the_input_and_its_range(
    max_tokens: int, overlap: int, message: str
) -> None:
    with pytest.raises(chunking.ChunkRequestError, match=f"^{message}$"):
        chunking.WindowLimits(2, 512).width(max_tokens, overlap)


@pytest.mark.parametrize(("max_tokens", "overlap", "width"), [(3, 0, 1), (512, 509, 510), (256, 32, 254)])
def test_the_width_leaves_room_for_the_special_tokens(max_tokens: int, overlap: int, width: int) -> None:
    assert chunking.WindowLimits(2, 512).width(max_tokens, overlap) == width


def test_text_must_be_utf8_but_may_be_whitespace() -> None:
    assert chunking.decode_text(np.array([b" \t\n"], dtype=object)) == " \t\n"
    assert chunking.decode_text(np.array(["你好 🙂".encode()], dtype=object)) == "你好 🙂"
    with pytest.raises(chunking.ChunkRequestError, match=r"^TEXT is not valid UTF-8 \(byte 2\)$"):
        chunking.decode_text(np.array([b"ok\xff"], dtype=object))


def test_the_chunker_counts_every_token_of_minilm_in_code_points(minilm: Checkpoint) -> None:
    """MiniLM's normalizer lowercases and strips accents; the offsets still index the original text."""
    chunker = chunking.TextChunker(str(minilm.path / "tokenizer.json"), 512)
    assert chunker.limits == chunking.WindowLimits(2, 512)
    text = "Café 你好🙂 naïve"  # cafe [UNK] [UNK] [UNK] naive
    assert chunker.spans(text, 4, 1).tolist() == [[0, 6], [5, 7], [6, 8], [7, 14]]
    assert chunker.spans(text, 7, 0).tolist() == [[0, 14]]
    # The packaged tokenizer.json pads and truncates at 128 tokens: the chunker sees past both.
    long_text = "word " * 300
    assert chunker.spans(long_text, 102, 0).tolist() == [[0, 499], [500, 999], [1000, 1499]]
    assert chunker.spans(" \n\t ", 16, 0).tolist() == [[0, 4]]
    with pytest.raises(chunking.ChunkRequestError, match="MAX_TOKENS must be from 3 to 512, got 600"):
        chunker.spans(long_text, 600, 0)
