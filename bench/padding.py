"""The exported encoder's inputs for a batch of token id rows of different lengths."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]


def padded_inputs(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, Int64Array]:
    """INPUT_IDS right-padded with `pad_id` to the longest row, and the ATTENTION_MASK marking the real tokens."""
    width = max(len(ids) for ids in rows)
    input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), width), dtype=np.int64)
    for row, ids in enumerate(rows):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    return {"INPUT_IDS": input_ids, "ATTENTION_MASK": attention_mask}
