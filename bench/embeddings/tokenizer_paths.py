"""Where the tokenizer runs: the `bge` ensemble, token ids from the client to `bge_onnx`, or one fused model.

`python -m bench.embeddings.tokenizer_paths` starts real Triton on a temporary copy of the exported repository
with `bge_fused` added (`fused_model`) and drives each path as the gateway does: `concurrency` callers of one
text each, merged by the gateway's own `CoalescingEmbedder` into calls over one tritonclient gRPC asyncio
channel. The paths:

- `ensemble`: `bge` with TEXT (tokenizer stub -> ensemble hop -> encoder stub), the gateway's path today;
- `client_ids`: the client tokenizes each coalesced batch with the same `tokenizers` tokenizer.json and the
  same `tokenization` module, and sends INPUT_IDS / ATTENTION_MASK to `bge_onnx` directly;
- `fused`: `bge_fused` with TEXT, tokenizing and encoding in one python-backend stub.

The paths take turns in rounds (ABCABC...), so that other jobs on a shared machine weigh on each alike; each
round reports texts/s and the CPU seconds per text of the client and of each Triton process (from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio

from bench import stack, workload
from bench.cpu import process_cpu_seconds, settle_heap, tree_cpu_split
from bench.embeddings.fused_model import FUSED, write_fused_repository
from bench.embeddings.repository import max_sequence_length, model_module, require_export
from bench.processes import running
from bench.triton_stats import ModelCounters
from export.repository import MAX_BATCH_SIZE
from gateway.services.coalescing import CoalescingEmbedder
from gateway.upstreams.triton import CHANNEL_ARGS, ModelInfo, TritonEmbeddings

PATHS = ("ensemble", "client_ids", "fused")
# Which Triton process a command line is, by the model directory its python-backend stub serves.
STUBS = {"/bge_tokenizer/": "tokenizer_stub", "/bge_onnx/": "encoder_stub", f"/{FUSED}/": "fused_stub"}
DIMENSION = 384
ENCODERS = {"ensemble": "bge_onnx", "client_ids": "bge_onnx", "fused": FUSED}  # where each path's batches form


def triton_process(command: str) -> str:
    """The part of Triton a process of its tree is: a model's python-backend stub, or the frontend."""
    for marker, part in STUBS.items():
        if marker in command:
            return part
    return "frontend"


def round_order(paths: Sequence[str], rounds: int) -> list[str]:
    """Every path once per round, in the same order each round (ABCABC): noise from other jobs spreads evenly."""
    return [path for _ in range(rounds) for path in paths]


@dataclass
class PathRuns:
    """One path's rounds: texts, seconds, and CPU seconds per process."""

    texts: int = 0
    seconds: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    encoder: ModelCounters = field(default_factory=ModelCounters)

    def add(self, texts: int, seconds: float, cpu: dict[str, float], encoder: ModelCounters) -> None:
        self.texts += texts
        self.encoder += encoder
        self.seconds.append(seconds)
        self.rates.append(texts / seconds)
        for name, used in cpu.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + used

    def summary(self) -> dict[str, Any]:
        """Median and worst texts/s over the rounds; CPU ms per text by process, the encoding model's mean
        batch and its busy time per text (execution wall time, tokenization included where it tokenizes)."""
        per_text = {name: 1000 * used / self.texts for name, used in sorted(self.cpu.items())}
        encoder = self.encoder
        return {
            "texts_per_second_median": statistics.median(self.rates),
            "texts_per_second_min": min(self.rates),
            "cpu_ms_per_text": per_text,
            "cpu_ms_per_text_total": sum(per_text.values()),
            "encoder_batch": encoder.rows / encoder.executions if encoder.executions else math.nan,
            "encoder_busy_ms_per_text": encoder.busy_ns / encoder.rows / 1e6 if encoder.rows else math.nan,
            "texts": self.texts,
            "rounds": len(self.rates),
        }


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process spent between two readings (a process new since `before` from zero)."""
    return {name: after[name] - before.get(name, 0.0) for name in after}


class ModelEmbedder:
    """A model that takes TEXT and answers EMBEDDING, TOKEN_COUNT, TRUNCATED (`bge`, `bge_fused`)."""

    def __init__(self, client: grpcaio.InferenceServerClient, model: str) -> None:
        self._client = client
        self._model = model
        self._outputs = [grpcaio.InferRequestedOutput(name) for name in ("EMBEDDING", "TOKEN_COUNT", "TRUNCATED")]

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return ModelInfo(self._model, "bench", MAX_BATCH_SIZE, 512, DIMENSION)

    async def ready(self) -> bool:
        return True

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        raw = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        text = grpcaio.InferInput("TEXT", list(raw.shape), "BYTES")
        text.set_data_from_numpy(raw)
        result = await self._client.infer(self._model, [text], outputs=self._outputs, client_timeout=120)
        return TritonEmbeddings(
            vectors=np.asarray(result.as_numpy("EMBEDDING"), dtype=np.float32),
            token_counts=np.asarray(result.as_numpy("TOKEN_COUNT"), dtype=np.int32).reshape(-1),
            truncated=np.asarray(result.as_numpy("TRUNCATED"), dtype=np.bool_).reshape(-1),
        )


class TokenIdsEmbedder(ModelEmbedder):
    """Tokenizes in this process (`bge_tokenizer`'s own module and tokenizer.json) and calls `bge_onnx`."""

    def __init__(self, client: grpcaio.InferenceServerClient, repository: Path) -> None:
        super().__init__(client, "bge_onnx")
        tokenization = model_module(repository, "bge_tokenizer", "tokenization")
        tokenizer_file = repository / "bge_tokenizer" / "1" / "tokenizer.json"
        self._tokenizer = tokenization.TextTokenizer(str(tokenizer_file), max_sequence_length(repository))
        self._outputs = [grpcaio.InferRequestedOutput("EMBEDDING")]

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        batch = self._tokenizer.pack(self._tokenizer.encode(texts))
        inputs = []
        for name, array in (("INPUT_IDS", batch.input_ids), ("ATTENTION_MASK", batch.attention_mask)):
            tensor = grpcaio.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = await self._client.infer(self._model, inputs, outputs=self._outputs, client_timeout=120)
        return TritonEmbeddings(
            vectors=np.asarray(result.as_numpy("EMBEDDING"), dtype=np.float32),
            token_counts=batch.token_count.reshape(-1),
            truncated=batch.truncated.reshape(-1),
        )


async def drive(embedder: CoalescingEmbedder, texts: Sequence[str], concurrency: int) -> None:
    """`concurrency` callers, one text per call, until every text is embedded."""
    pending = iter(texts)

    async def caller() -> None:
        for text in pending:
            result = await embedder.embed([text])
            if result.vectors.shape != (1, DIMENSION):
                raise RuntimeError(f"one text gave vectors of shape {result.vectors.shape}")

    await asyncio.gather(*(caller() for _ in range(concurrency)))


def model_counters(base_url: str, model: str) -> ModelCounters:
    """`model`'s statistics so far, from Triton's HTTP endpoint."""
    with urllib.request.urlopen(f"{base_url}/v2/models/{model}/stats", timeout=5) as answer:
        return ModelCounters.from_stats(json.load(answer))


async def measure(
    paths: dict[str, CoalescingEmbedder],
    order: Sequence[str],
    texts: Callable[[int], list[str]],
    concurrency: int,
    triton: stack.Endpoint,
) -> dict[str, PathRuns]:
    runs = {name: PathRuns() for name in paths}
    for index, name in enumerate(order):
        batch = texts(index)
        settle_heap()
        counted = await asyncio.to_thread(model_counters, triton.base_url, ENCODERS[name])
        before = {**tree_cpu_split(triton.server.pid, triton_process), "client": process_cpu_seconds()}
        started = time.perf_counter()
        await drive(paths[name], batch, concurrency)
        elapsed = time.perf_counter() - started
        after = {**tree_cpu_split(triton.server.pid, triton_process), "client": process_cpu_seconds()}
        await asyncio.sleep(0.1)  # Triton counts a request just after its answer leaves
        encoder = await asyncio.to_thread(model_counters, triton.base_url, ENCODERS[name]) - counted
        runs[name].add(len(batch), elapsed, cpu_delta(before, after), encoder)
        print(f"round {index // len(paths) + 1} {name}: {len(batch) / elapsed:.1f} texts/s", flush=True)
    return runs


async def run(repository: Path, texts_per_round: int, rounds: int, concurrency: int, log_dir: Path) -> dict[str, Any]:
    require_export(repository)
    corpus = workload.texts(texts_per_round * (rounds * len(PATHS) + 1))

    def slice_of(index: int) -> list[str]:  # a fresh slice per round: nothing repeats, as with no cache
        start = (index + 1) * texts_per_round
        return corpus[start : start + texts_per_round]

    with tempfile.TemporaryDirectory(prefix="tokenizer-paths-") as scratch:
        copy = write_fused_repository(repository, Path(scratch) / "repository", DIMENSION)
        triton = stack.triton(log_dir, copy)
        with running((triton.server, triton.ready_url)):
            client = grpcaio.InferenceServerClient(triton.grpc_target, channel_args=CHANNEL_ARGS)
            try:
                if not await client.is_model_ready(FUSED):
                    raise RuntimeError(f"{FUSED} is not ready; see {triton.server.log_path}")
                inner = {
                    "ensemble": ModelEmbedder(client, "bge"),
                    "client_ids": TokenIdsEmbedder(client, repository),
                    "fused": ModelEmbedder(client, FUSED),
                }
                paths = {name: CoalescingEmbedder(embedder) for name, embedder in inner.items()}
                for coalescing in paths.values():  # warm-up: sessions, channels, shared memory regions
                    await drive(coalescing, corpus[:texts_per_round], concurrency)
                runs = await measure(paths, round_order(PATHS, rounds), slice_of, concurrency, triton)
            finally:
                await client.close()
    return {
        "concurrency": concurrency,
        "texts_per_request": 1,
        "texts_per_round": texts_per_round,
        "paths": {name: runs[name].summary() for name in PATHS},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=stack.REPOSITORY)
    parser.add_argument("--texts", type=int, default=640, help="texts per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--log-dir", type=Path, default=Path("bench") / "results" / "tokenizer-paths")
    parser.add_argument("--output", type=Path, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.repository, args.texts, args.rounds, args.concurrency, args.log_dir))
    text = json.dumps(result, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
