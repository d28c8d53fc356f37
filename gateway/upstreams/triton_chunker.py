"""The `bge_chunker` model (installed by `make export` beside `bge`) through Triton's client: the spans of a
document's chunks, counted in the served model's own tokens."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc.aio as grpcaio

from gateway.errors import UpstreamUnavailableError
from gateway.settings import TritonSettings
from gateway.upstreams.triton import TritonClient, none_if_unknown, text_input


class ChunkerNotServedError(UpstreamUnavailableError):
    """An upsert into a chunked collection on a gateway whose Triton serves no chunker (a model repository exported
    before chunking).

    Do: operator: export the model again (`make export`: it installs `bge_chunker` beside the model) and restart
    Triton; `TRITON_CHUNKER_MODEL` names it.
    """

    code = "chunker_not_served"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"no chunker is served: Triton has no model {model!r} (export the model again with `make export`)",
            param="chunking",
        )


class TritonChunker:
    def __init__(self, client: TritonClient, settings: TritonSettings) -> None:
        self._client = client
        self._settings = settings

    async def chunk(self, text: str, max_tokens: int, overlap: int) -> list[tuple[int, int]]:
        """The spans ([start, end) in code points) of `text`'s chunks of at most `max_tokens` of the served model's
        tokens (its special tokens included), each overlapping the one before by `overlap` tokens."""
        model = self._settings.chunker_model
        inputs = [text_input("TEXT", [text], shape=[1])]
        for name, value in (("MAX_TOKENS", max_tokens), ("OVERLAP", overlap)):
            tensor = grpcaio.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            inputs.append(tensor)

        outputs = [grpcaio.InferRequestedOutput("SPANS")]
        result = await self._client.call(
            none_if_unknown(lambda c, seconds: c.infer(model, inputs, outputs=outputs, client_timeout=seconds)),
            self._settings.timeout_seconds,
        )
        if result is None:
            raise ChunkerNotServedError(model)
        return [(int(start), int(end)) for start, end in np.asarray(result.as_numpy("SPANS")).reshape(-1, 2)]
