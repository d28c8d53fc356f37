"""Embeddings part of `make bench`: texts per second and latency of each way to embed the same texts.

One workload (`bench.workload.texts`: 2,000 English and Chinese texts of 5 to 60 words) and one
checkpoint (the one the model repository was exported from) for every system:

- in this process: the naive loop (sentence-transformers `encode(text)` once per text, on a subset),
  sentence-transformers batched (32), and ONNX Runtime on the exported INT8 graph in length-sorted
  batches of 32: the ceiling of these cores, the reference of every ratio;
- this project: the REST gateway (1 and 32 texts a request), Triton's gRPC endpoint straight
  (the same two shapes), and the gateway answering from a warm embedding cache, at concurrency
  1, 8, 32 and 128; the cache also under an open loop of 500 requests/s, for its latency target;
- infinity-emb (own virtual environment) on the same checkpoint, with each engine that starts here.

The systems alternate within each round (round 1: all of them, round 2: all again...) and every
figure is the median over the rounds. Each row carries the CPU the client, the servers and the
rest of the machine used meanwhile, since on a 2-core machine the load generator and anything else
running compete with the servers for the same cores.

    python -m bench embeddings [--runs 3] [--quick] [--out DIR] [--repository DIR] [--model DIR_OR_ID] [--no-infinity]
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from bench.common import (
    ROOT,
    PartResult,
    Point,
    RunStats,
    ServerProcess,
    Target,
    closed_loop,
    http_client,
    median,
    open_loop,
    process_cpu_seconds,
    settle_heap,
    summarize,
    tree_cpu_split,
    venv_python,
)
from bench.stack import REPOSITORY, Endpoint, gateway, triton
from bench.triton_stats import MODEL, TOKENIZER, TritonStats
from bench.workload import texts as workload_texts
from localtriton.ports import free_port

if TYPE_CHECKING:
    from export.checkpoint import Checkpoint

log = logging.getLogger("bench.embeddings")

PART = "embeddings"
CONCURRENCIES = (1, 8, 32, 128)
BATCH = 32  # texts per request of the batched systems, rows per in-process batch
NAIVE_TEXTS = 300  # the naive loop is slow: it runs on this many of the texts
CACHE_RATE = 500.0  # requests per second of the warm-cache open loop
CACHE_SECONDS = 10.0

# System names: one series each in the plots.
NAIVE = "sentence-transformers, encode() per text"
ST_BATCHED = "sentence-transformers, batches of 32"
ORT_INT8 = "ONNX Runtime INT8 in-process, sorted batches of 32"
GATEWAY_1 = "gateway REST, 1 text/request"
GATEWAY_32 = "gateway REST, 32 texts/request"
GATEWAY_BASE64 = "gateway REST, 1 text/request, base64"
TRITON_1 = "Triton gRPC, 1 text/request"
TRITON_32 = "Triton gRPC, 32 texts/request"
CACHED_1 = "gateway REST, warm cache, 1 text/request"
CACHED_OPEN_LOOP = f"gateway REST, warm cache, open loop {CACHE_RATE:.0f} requests/s"
INFINITY_PREFIX = "infinity-emb"

# infinity-emb 0.0.78 and the pins with which it installs and starts here (Python 3.11, torch 2.13 CPU).
INFINITY_REQUIREMENTS = (
    "infinity-emb[server,torch,optimum]==0.0.78",
    "torch==2.13.0",  # the CPU build on this machine's disk, never a CUDA build from the index
    "transformers==4.48.3",  # infinity imports optimum.bettertransformer, which refuses transformers >= 4.49
    "optimum[onnxruntime]==1.26.1",  # 1.27 imports a torch.onnx private that torch 2.13 dropped; 2.x lacks ORT
    "pyarrow==21.0.0",  # sentence-transformers 3 imports datasets; later pyarrow needs numpy 2, infinity numpy < 2
)
# Engines tried, in order. The ONNX one needs an encoder graph beside the checkpoint (hub repositories
# ship one; the packaged checkpoint does not): `peer_checkpoint` adds one, INT8 as ours.
INFINITY_ENGINES = ("torch", "optimum")

# The targets of the issue.
CEILING_SHARE = 0.85
NAIVE_FACTOR = 4.5
INFINITY_FACTOR = 2.5
TARGET_CONCURRENCY = 32
P99_CONCURRENCY = 8
P99_LIMIT_MS = 60.0
CACHE_P99_LIMIT_MS = 5.0


# -- measuring ----------------------------------------------------------------------------------------


Request = Callable[[int], Awaitable[int]]


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy so far (every process on the machine), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def triton_part(command: str) -> str:
    """The part of Triton a process of its tree is: the encoder's or the tokenizer's python-backend stub,
    or the frontend (tritonserver: gRPC, ensemble scheduling, batching)."""
    for part, model in (("encoder", MODEL), ("tokenizer", TOKENIZER)):
        if f"/{model}/" in command:
            return part
    return "frontend"


class CpuWindow:
    """CPU used during one measurement by the system's servers (Triton's also by part, `triton_part`), by the
    client and by everything else, and how much of the cores stayed idle."""

    def __init__(self, servers: dict[str, int]) -> None:
        self.servers = servers  # name -> pid of the servers doing the work
        self.percent: dict[str, float] = {}

    def __enter__(self) -> CpuWindow:
        settle_heap()  # its collection is the client's set-up, not part of the window
        self._servers = self._read_servers()
        self._client = process_cpu_seconds()
        self._busy = machine_busy_seconds()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        busy = machine_busy_seconds() - self._busy
        client = process_cpu_seconds() - self._client
        before, after = self._servers, self._read_servers()
        used = {name: sum(after[name].values()) - sum(before[name].values()) for name in self.servers}
        self.percent = {f"{name}_cpu_percent": 100 * seconds / elapsed for name, seconds in used.items()}
        for part, seconds in after.get("triton", {}).items():
            self.percent[f"triton_{part}_cpu_percent"] = 100 * (seconds - before["triton"].get(part, 0.0)) / elapsed
        self.percent["server_cpu_percent"] = 100 * sum(used.values()) / elapsed
        # What the rest of the machine took meanwhile: other jobs compete for the same cores.
        self.percent["foreign_cpu_percent"] = max(0.0, 100 * (busy - client - sum(used.values())) / elapsed)
        self.percent["idle_cpu_percent"] = max(0.0, 100 * (len(os.sched_getaffinity(0)) - busy / elapsed))

    def _read_servers(self) -> dict[str, dict[str, float]]:
        """Each server's CPU seconds so far: Triton's by part, the others' as one."""
        return {
            name: tree_cpu_split(pid, triton_part if name == "triton" else None) for name, pid in self.servers.items()
        }


@dataclass
class Series:
    """Every run of one system at one setting, for `summarize`, plus each run's CPU window."""

    system: str
    x: float
    runs: list[RunStats] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    counters: list[dict[str, float]] = field(default_factory=list)

    def point(self) -> Point:
        point = summarize(self.system, self.x, self.runs)
        for key in dict.fromkeys(key for window in self.cpu + self.counters for key in window):
            point.extra[key] = median([window[key] for window in self.cpu + self.counters if key in window])
        return point


class Counted:
    """Counts the items of a request function's answers.

    `closed_loop` and `open_loop` add each answer's items after an await (`items += await ...`),
    which loses updates when requests overlap; the items are counted here instead.
    """

    def __init__(self, request: Request) -> None:
        self.items = 0
        self._request = request

    async def __call__(self, index: int) -> int:
        items = await self._request(index)
        self.items += items
        return items


async def measure(
    request: Request, *, total: int, concurrency: int, servers: dict[str, int]
) -> tuple[RunStats, CpuWindow]:
    """A closed loop of `total` requests with `concurrency` in flight, and its CPU window."""
    counted = Counted(request)
    with CpuWindow(servers) as window:
        stats = await closed_loop(counted, total=total, concurrency=concurrency)
    stats.items = counted.items
    return stats, window


async def measure_open(
    request: Request, *, rate: float, seconds: float, servers: dict[str, int]
) -> tuple[RunStats, CpuWindow]:
    """An open loop: a request every 1/rate s for `seconds`, latency from each scheduled start."""
    counted = Counted(request)
    with CpuWindow(servers) as window:
        stats = await open_loop(counted, rate=rate, duration=seconds)
    stats.items = counted.items
    return stats, window


def batches(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[start : start + size]) for start in range(0, len(texts), size)]


# -- clients ------------------------------------------------------------------------------------------


class RestSession(Protocol):
    async def post(self, url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]: ...

    async def aclose(self) -> None: ...


class AiohttpSession:
    """aiohttp: about a third of httpx's CPU per request, which matters when client and server share 2 cores."""

    def __init__(self, concurrency: int) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))

    async def post(self, url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json"}
        async with self._session.post(url, data=body, headers=headers) as response:
            return response.status, await response.read(), dict(response.headers)

    async def aclose(self) -> None:
        await self._session.close()


class HttpxSession:
    """httpx, when aiohttp is not installed."""

    def __init__(self, concurrency: int) -> None:
        self._client = http_client(concurrency)

    async def post(self, url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        response = await self._client.post(url, content=body, headers={"Content-Type": "application/json"})
        return response.status_code, response.content, dict(response.headers)

    async def aclose(self) -> None:
        await self._client.aclose()


def rest_client_name() -> str:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return "httpx"
    return "aiohttp"


def rest_session(concurrency: int) -> RestSession:
    return AiohttpSession(concurrency) if rest_client_name() == "aiohttp" else HttpxSession(concurrency)


class EmbeddingsError(RuntimeError):
    """A request that did not come back as the embeddings asked for."""


def openai_request(
    session: RestSession,
    url: str,
    requests: Sequence[str | list[str]],
    *,
    model: str | None = None,
    encoding_format: str | None = None,
    misses: list[int] | None = None,
) -> Request:
    """POST request i's input to an OpenAI-compatible /embeddings route; checks and counts the vectors."""
    bodies = []
    for payload in requests:
        body: dict[str, Any] = {"input": payload}
        if model:
            body["model"] = model
        if encoding_format:
            body["encoding_format"] = encoding_format
        bodies.append(orjson.dumps(body))  # encoded ahead: the client's own CPU stays out of the way

    async def send(index: int) -> int:
        payload = requests[index % len(requests)]
        status, content, headers = await session.post(url, bodies[index % len(bodies)])
        if status != 200:
            raise EmbeddingsError(f"HTTP {status}: {content[:200]!r}")
        expected = 1 if isinstance(payload, str) else len(payload)
        got = len(orjson.loads(content)["data"])
        if got != expected:
            raise EmbeddingsError(f"{got} vectors for {expected} texts")
        if misses is not None and headers.get("x-cache", headers.get("X-Cache")) != "hit":
            misses.append(index)
        return got

    return send


class TritonDirect:
    """tritonclient's asyncio gRPC client on the `bge` ensemble: TEXT as BYTES [n, 1]."""

    def __init__(self, target: str) -> None:
        import tritonclient.grpc.aio as grpcaio

        self._grpc = grpcaio
        self._client = grpcaio.InferenceServerClient(target)

    def request(self, requests: Sequence[list[str]]) -> Request:
        grpcaio = self._grpc
        arrays = [np.array([[text.encode("utf-8")] for text in texts], dtype=np.object_) for texts in requests]
        output = grpcaio.InferRequestedOutput("EMBEDDING")

        async def send(index: int) -> int:
            raw = arrays[index % len(arrays)]
            text = grpcaio.InferInput("TEXT", list(raw.shape), "BYTES")
            text.set_data_from_numpy(raw)
            result = await self._client.infer("bge", [text], outputs=[output], client_timeout=120)
            rows = int(result.as_numpy("EMBEDDING").shape[0])
            if rows != len(raw):
                raise EmbeddingsError(f"{rows} vectors for {len(raw)} texts")
            return rows

        return send

    async def aclose(self) -> None:
        await self._client.close()


# -- in-process systems ----------------------------------------------------------------------------------


def checkpoint_for(repository: Path, model: str | None) -> Checkpoint:
    """The checkpoint the repository was exported from (`parity.json` names it), as `export` resolves it."""
    from export.checkpoint import resolve_checkpoint

    checkpoint = resolve_checkpoint(model)
    parity = repository / "bge_onnx" / "1" / "parity.json"
    if parity.is_file():
        exported = json.loads(parity.read_text())
        if exported.get("revision") not in (None, checkpoint.revision):
            raise RuntimeError(
                f"{repository} holds {exported.get('model')} revision {exported.get('revision')}, not "
                f"{checkpoint.name} revision {checkpoint.revision}: pass --model with the exported checkpoint, "
                "or run `make export MODEL=...` again"
            )
    return checkpoint


def require_export(repository: Path) -> None:
    wanted = [repository / "bge_onnx" / "1" / "model_int8.onnx", repository / "bge_tokenizer" / "1" / "tokenizer.json"]
    missing = [str(path) for path in wanted if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"no exported model: {', '.join(missing)} missing; run `make export` first")


class InProcess:
    """The three in-process systems, each timed on the calling thread with nothing else in flight."""

    def __init__(self, repository: Path, checkpoint_path: Path) -> None:
        import onnxruntime as ort
        from sentence_transformers import SentenceTransformer
        from tokenizers import Tokenizer

        cores = len(os.sched_getaffinity(0))
        options = ort.SessionOptions()
        options.intra_op_num_threads = cores  # as Triton's bge_onnx: every core to one session
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        model = repository / "bge_onnx" / "1" / "model_int8.onnx"
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(repository / "bge_tokenizer" / "1" / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_sequence_length(repository))
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._model = SentenceTransformer(str(checkpoint_path), device="cpu")

    def naive(self, texts: Sequence[str]) -> RunStats:
        """`encode(text)` once per text: what a service does before it batches anything."""
        return self._timed(texts, [[text] for text in texts], lambda chunk: self._model.encode(chunk[0]))

    def st_batched(self, texts: Sequence[str]) -> RunStats:
        """`encode(texts, batch_size=32)`: sentence-transformers sorts by length and batches itself."""
        stats = self._timed(texts, [list(texts)], lambda chunk: self._model.encode(chunk, batch_size=BATCH))
        # One call: each batch's latency is taken as its share of the total.
        stats.latencies = [stats.elapsed * BATCH / max(len(texts), 1)] * math.ceil(len(texts) / BATCH)
        return stats

    def ort_int8(self, texts: Sequence[str]) -> RunStats:
        """Tokenise all, sort by token length, run the INT8 graph 32 rows at a time: the ceiling."""
        settle_heap()
        cpu = process_cpu_seconds()
        started = time.perf_counter()
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        latencies = []
        for start in range(0, len(order), BATCH):
            began = time.perf_counter()
            rows = [encodings[i].ids for i in order[start : start + BATCH]]
            width = max(len(ids) for ids in rows)
            input_ids = np.full((len(rows), width), self._pad_id, dtype=np.int64)
            attention_mask = np.zeros((len(rows), width), dtype=np.int64)
            for row, ids in enumerate(rows):
                input_ids[row, : len(ids)] = ids
                attention_mask[row, : len(ids)] = 1
            self._session.run(["EMBEDDING"], {"INPUT_IDS": input_ids, "ATTENTION_MASK": attention_mask})
            latencies.append(time.perf_counter() - began)
        elapsed = time.perf_counter() - started
        return RunStats(elapsed, latencies, 0, len(texts), process_cpu_seconds() - cpu)

    @staticmethod
    def _timed(texts: Sequence[str], chunks: list[list[str]], run: Callable[[list[str]], Any]) -> RunStats:
        settle_heap()
        cpu = process_cpu_seconds()
        started = time.perf_counter()
        latencies = []
        for chunk in chunks:
            began = time.perf_counter()
            run(chunk)
            latencies.append(time.perf_counter() - began)
        elapsed = time.perf_counter() - started
        return RunStats(elapsed, latencies, 0, len(texts), process_cpu_seconds() - cpu)


def max_sequence_length(repository: Path) -> int:
    parity = repository / "bge_onnx" / "1" / "parity.json"
    if parity.is_file():
        return int(json.loads(parity.read_text()).get("max_sequence_length", 512))
    return 512


# -- infinity-emb ---------------------------------------------------------------------------------------


def peer_checkpoint(checkpoint: Checkpoint, directory: Path) -> Path:
    """The checkpoint's files (linked) plus an INT8 encoder graph (`model_quantized.onnx`, last_hidden_state)
    for infinity's ONNX engine, quantised as ours (`export.precision.quantize_int8`).

    infinity 0.0.78 reads a local graph only from the model folder's top level, named relative to
    the folder, so the server is started inside it with `--model-id .`.
    """
    marker = directory / ".complete"
    if marker.is_file() and marker.read_text() == checkpoint.revision:
        return directory
    import torch

    from export.graph import load_encoder
    from export.precision import quantize_int8

    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for source in checkpoint.path.iterdir():
        if source.suffix != ".onnx" and source.name != "onnx":
            (directory / source.name).symlink_to(source.resolve())

    class Encoder(torch.nn.Module):
        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
            kwargs = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
            return self.encoder(input_ids=input_ids, **kwargs).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    sample = torch.ones((2, 8), dtype=torch.long)
    fp32 = directory.parent / f"{directory.name}-fp32.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder(load_encoder(checkpoint)),
            (sample, sample, sample),
            str(fp32),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )
    quantize_int8(fp32, directory / "model_quantized.onnx")
    fp32.unlink()
    marker.write_text(checkpoint.revision)
    return directory


@dataclass
class Peer:
    name: str  # series prefix, e.g. "infinity-emb torch"
    endpoint: Endpoint
    model: str


def start_infinity(engine: str, checkpoint: Checkpoint, log_dir: Path, notes: list[str]) -> Peer | None:
    """infinity-emb v2 with `engine` on the checkpoint, or None (and a note saying why) if it cannot run."""
    try:
        python = venv_python("infinity", INFINITY_REQUIREMENTS)
    except (subprocess.CalledProcessError, OSError) as exc:
        notes.append(f"infinity-emb not run: installing {' '.join(INFINITY_REQUIREMENTS)} failed: {exc}")
        return None
    port = free_port()
    served = "minilm"
    arguments = ["v2", "--port", str(port), "--host", "127.0.0.1", "--served-model-name", served]
    arguments += ["--engine", engine, "--device", "cpu", "--log-level", "warning", "--no-model-warmup"]
    arguments += ["--pooling-method", "mean" if checkpoint.pooling.value == "mean" else "cls"]
    binary = str(python.parent / "infinity_emb")
    if engine == "optimum":
        try:
            model_dir = peer_checkpoint(checkpoint, ROOT / ".run" / "bench-cache" / "infinity-checkpoint")
        except Exception as exc:  # the peer's graph failed to build: report it, run the others
            notes.append(f"infinity-emb {engine} not run: building its ONNX graph failed: {exc}")
            return None
        command = ["env", "-C", str(model_dir), binary, *arguments, "--model-id", "."]
    else:
        command = [binary, *arguments, "--model-id", str(checkpoint.path)]
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(log_dir / f"infinity-{engine}-hf"),  # its optimised graph goes here, not in ~/.cache
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    server = ServerProcess(f"infinity-{engine}", command, env=env, log_dir=log_dir)
    base = f"http://127.0.0.1:{port}"
    try:
        server.start(f"{base}/health", timeout=300)
    except RuntimeError as exc:
        notes.append(f"infinity-emb {engine} not run: {exc}")
        return None
    return Peer(f"{INFINITY_PREFIX} {engine}", Endpoint(server, f"{base}/health", base), served)


# -- targets --------------------------------------------------------------------------------------------


def evaluate_targets(
    points: Sequence[Point], cache_p99_ms: float | None, infinity_notes: Sequence[str]
) -> list[Target]:
    """The issue's targets from the medians: each with its measured value and whether it is met."""
    by = {(point.system, point.x): point for point in points}

    def throughput(system: str, x: float = 1) -> float | None:
        point = by.get((system, x))
        return point.throughput if point and point.throughput > 0 else None

    gateway = throughput(GATEWAY_1, TARGET_CONCURRENCY)
    targets = []
    for name, reference, factor, goal in (
        ("REST gateway vs in-process INT8", throughput(ORT_INT8), CEILING_SHARE, "in-process INT8 ceiling"),
        ("REST gateway vs naive loop", throughput(NAIVE), NAIVE_FACTOR, "naive sentence-transformers loop"),
    ):
        targets.append(ratio_target(name, gateway, reference, factor, f"{goal} (same run)"))
    peers = [
        (point.throughput, point.system)
        for point in points
        if point.system.startswith(INFINITY_PREFIX) and point.x == TARGET_CONCURRENCY and point.throughput > 0
    ]
    fastest = max(peers, default=None)
    infinity = ratio_target(
        "REST gateway vs infinity-emb", gateway, fastest[0] if fastest else None, INFINITY_FACTOR, "infinity-emb"
    )
    if fastest:
        infinity.measured += f" ({fastest[1]})"
    elif infinity_notes:
        infinity.measured = "not measured: " + "; ".join(infinity_notes)
    targets.append(infinity)
    p99 = by.get((GATEWAY_1, P99_CONCURRENCY))
    p99_ms = p99.p99_ms if p99 and math.isfinite(p99.p99_ms) else None
    targets.append(
        Target(
            f"REST gateway p99, 1 text/request, concurrency {P99_CONCURRENCY}",
            f"<= {P99_LIMIT_MS:g} ms",
            f"{p99_ms:.1f} ms" if p99_ms is not None else "not measured",
            p99_ms is not None and p99_ms <= P99_LIMIT_MS,
        )
    )
    cached = cache_p99_ms if cache_p99_ms is not None and math.isfinite(cache_p99_ms) else None
    targets.append(
        Target(
            f"cached embeddings p99 at {CACHE_RATE:.0f} requests/s",
            f"<= {CACHE_P99_LIMIT_MS:g} ms",
            f"{cached:.2f} ms" if cached is not None else "not measured",
            cached is not None and cached <= CACHE_P99_LIMIT_MS,
        )
    )
    return targets


def cpu_budget(points: Sequence[Point], cores: int) -> str | None:
    """Where the cores went at the ceiling target's setting, per text, and the throughput they bound: what
    an encoder as lean as the in-process ceiling would reach with the rest of the stack's CPU as measured."""
    by = {(point.system, point.x): point for point in points}
    served, ceiling = by.get((GATEWAY_1, TARGET_CONCURRENCY)), by.get((ORT_INT8, 1))
    if served is None or ceiling is None or served.throughput <= 0 or ceiling.throughput <= 0:
        return None
    if "triton_encoder_cpu_percent" not in served.extra:
        return None

    def per_text(percent: float, throughput: float) -> float:
        return 10 * percent / throughput  # ms of CPU per text: percent / 100 * 1000 ms

    rest = {
        "gateway": served.extra.get("gateway_cpu_percent", 0.0),
        "Triton frontend": served.extra.get("triton_frontend_cpu_percent", 0.0),
        "tokenizer": served.extra.get("triton_tokenizer_cpu_percent", 0.0),
        "load generator": served.extra.get("client_cpu_percent", 0.0),
    }
    rest_ms = sum(per_text(percent, served.throughput) for percent in rest.values())
    ceiling_ms = per_text(ceiling.extra.get("client_cpu_percent", 0.0), ceiling.throughput)
    bound = cores * 1000 / (ceiling_ms + rest_ms)
    parts = ", ".join(f"{name} {per_text(percent, served.throughput):.2f}" for name, percent in rest.items())
    return (
        f"CPU per text, {GATEWAY_1} at concurrency {TARGET_CONCURRENCY}: encoder "
        f"{per_text(served.extra['triton_encoder_cpu_percent'], served.throughput):.2f} ms (in-process ceiling "
        f"{ceiling_ms:.2f} ms), the rest {rest_ms:.2f} ms ({parts}), cores idle "
        f"{served.extra.get('idle_cpu_percent', float('nan')):.0f} %. With everything on these {cores} cores, an "
        f"encoder as lean as the ceiling and no idle core would reach at most {bound:.0f} texts/s = "
        f"{bound / ceiling.throughput:.2f} x the ceiling"
    )


def ratio_target(name: str, value: float | None, reference: float | None, factor: float, against: str) -> Target:
    goal = f">= {factor:g} x {against}, 1 text/request at concurrency {TARGET_CONCURRENCY}"
    if value is None or reference is None:
        return Target(name, goal, "not measured", False)
    ratio = value / reference
    return Target(name, goal, f"{ratio:.2f} x ({value:.0f} vs {reference:.0f} texts/s)", ratio >= factor)


def table_rows(points: Sequence[Point], reference: float | None) -> list[dict[str, Any]]:
    rows = []
    for point in points:
        extra = point.extra
        rows.append(
            {
                "system": point.system,
                "concurrency": int(point.x),
                "texts/s": point.throughput,
                "p50 ms": point.p50_ms,
                "p99 ms": point.p99_ms,
                "client CPU %": extra.get("client_cpu_percent", float("nan")),
                "server CPU %": extra.get("server_cpu_percent", float("nan")),
                "other CPU %": extra.get("foreign_cpu_percent", float("nan")),
                "x INT8 in-process": point.throughput / reference if reference else float("nan"),
                "Triton calls/text": extra.get("triton_calls_per_text", float("nan")),
                f"{MODEL} batch": extra.get("model_batch", float("nan")),
                f"{MODEL} busy %": extra.get("model_busy_percent", float("nan")),
                f"{MODEL} queue ms": extra.get("model_queue_ms", float("nan")),
                "errors": int(extra.get("errors", 0)),
            }
        )
    return rows


# -- the part -------------------------------------------------------------------------------------------


@dataclass
class Plan:
    texts: list[str]
    naive_texts: int
    concurrencies: tuple[int, ...]
    runs: int
    infinity: bool
    cache_rate: float
    cache_seconds: float

    @classmethod
    def make(cls, *, runs: int, quick: bool, infinity: bool) -> Plan:
        if quick:
            return cls(workload_texts(32), 8, (1, 8), 1, False, 100.0, 1.0)
        return cls(workload_texts(2000), NAIVE_TEXTS, CONCURRENCIES, max(runs, 1), infinity, CACHE_RATE, CACHE_SECONDS)


@contextlib.contextmanager
def started(servers: list[ServerProcess]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in reversed(servers):
            server.stop()


async def run(
    out_dir: Path,
    *,
    runs: int = 3,
    quick: bool = False,
    repository: Path = REPOSITORY,
    model: str | None = None,
    infinity: bool = True,
) -> PartResult:
    """Measure every system `runs` times, alternating, and return the medians, table and targets."""
    began = time.monotonic()
    plan = Plan.make(runs=runs, quick=quick, infinity=infinity)
    require_export(repository)
    checkpoint = checkpoint_for(repository, model)
    log_dir = out_dir / "logs" / PART
    notes = [
        f"cores used: {len(os.sched_getaffinity(0))}; model {checkpoint.name} ({checkpoint.path}); "
        f"{len(plan.texts)} texts (half English, half Chinese, 5 to 60 words); medians of {plan.runs} "
        f"alternating runs; client: asyncio + {rest_client_name()} (REST), tritonclient.grpc.aio (Triton)",
        f"naive loop timed on the first {plan.naive_texts} texts; in-process systems run in the bench process",
        f"load average at start: {' '.join(f'{value:.1f}' for value in os.getloadavg())}",
    ]
    servers: list[ServerProcess] = []
    with started(servers):
        triton_endpoint = triton(log_dir, repository)
        servers.append(triton_endpoint.server)
        triton_endpoint.server.start(triton_endpoint.ready_url, timeout=300)
        uncached = gateway(log_dir, {"TRITON_URL": triton_endpoint.grpc_target, "EMBEDDING_CACHE_MB": "0"})
        servers.append(uncached.server)
        uncached.server.start(uncached.ready_url)
        cached = gateway(
            log_dir, {"TRITON_URL": triton_endpoint.grpc_target, "EMBEDDING_CACHE_MB": "256"}, "gateway-cache"
        )
        servers.append(cached.server)
        cached.server.start(cached.ready_url)
        peers: list[Peer] = []
        infinity_notes: list[str] = []
        if plan.infinity:
            for engine in INFINITY_ENGINES:
                peer = start_infinity(engine, checkpoint, log_dir, infinity_notes)
                if peer is not None:
                    servers.append(peer.endpoint.server)
                    peers.append(peer)
            notes.append("infinity-emb engines that started: " + (", ".join(p.name for p in peers) or "none"))
        else:
            infinity_notes.append("infinity-emb not run (quick mode or --no-infinity)")
        notes += infinity_notes
        in_process = InProcess(repository, checkpoint.path)

        def write(series: Sequence[Series], opened: Series, rounds: int) -> PartResult:
            """The result so far, written after every round: a stopped run still leaves its numbers."""
            done = [] if rounds == plan.runs else [f"partial: {rounds} of {plan.runs} rounds done"]
            ending = [
                f"load average at end: {' '.join(f'{value:.1f}' for value in os.getloadavg())}",
                f"embeddings part took {time.monotonic() - began:.0f} s",
            ]
            result = build_result(series, opened, plan.cache_rate, [*notes, *done, *ending], infinity_notes)
            result.write(out_dir)
            return result

        return await measure_rounds(plan, in_process, triton_endpoint, uncached, cached, peers, write)


def build_result(
    series: Sequence[Series], opened: Series, cache_rate: float, notes: list[str], infinity_notes: Sequence[str]
) -> PartResult:
    """Medians into points, the table (ratios to the in-process INT8 ceiling) and the targets."""
    points = [item.point() for item in series]
    cache_point = opened.point() if opened.runs else None
    reference = next((p.throughput for p in points if p.system == ORT_INT8), None)
    rows = table_rows(points, reference)
    if cache_point is not None:
        row = table_rows([cache_point], reference)[0]
        row["concurrency"] = f"{cache_rate:.0f}/s open loop"
        rows.append(row)
    notes = [
        *notes,
        "other CPU %: what the rest of the machine (other users' jobs) used during a measurement; "
        "figures measured while it was high are not comparable with a quiet machine",
        f"Triton's own statistics over each load that reached it: Triton calls/text (below 1 where the gateway "
        f"merged concurrent requests), {MODEL} batch (texts per execution of the encoder), {MODEL} busy % (its "
        f"executions' time over the load's wall time), {MODEL} queue ms (mean wait of a request in its batcher)",
    ]
    if budget := cpu_budget(points, len(os.sched_getaffinity(0))):
        notes.append(budget)
    return PartResult(
        part=PART,
        x_label="concurrency",
        throughput_unit="texts/s",
        points=points,
        table=rows,
        targets=evaluate_targets(points, cache_point.p99_ms if cache_point else None, infinity_notes),
        notes=notes,
    )


@dataclass(frozen=True)
class RestLoad:
    """One OpenAI-compatible route driven with one request shape, and the servers whose CPU it costs."""

    system: str
    url: str
    requests: Sequence[str | list[str]]
    servers: dict[str, int]
    model: str | None = None
    encoding_format: str | None = None
    cache: bool = False  # count answers that did not come from the cache
    triton: TritonStats | None = None  # what Triton saw of the load, for loads that reach it


def rest_loads(
    concurrency: int, plan: Plan, triton: Endpoint, uncached: Endpoint, cached: Endpoint, peers: Sequence[Peer]
) -> list[RestLoad]:
    singles: list[str | list[str]] = list(plan.texts)
    groups: list[str | list[str]] = list(batches(plan.texts, BATCH))
    gateway_url, cache_url = f"{uncached.base_url}/v1/embeddings", f"{cached.base_url}/v1/embeddings"
    stack = {"gateway": uncached.server.pid, "triton": triton.server.pid}
    seen = TritonStats(triton.base_url)
    loads = [
        RestLoad(GATEWAY_1, gateway_url, singles, stack, triton=seen),
        RestLoad(GATEWAY_32, gateway_url, groups, stack, triton=seen),
        RestLoad(CACHED_1, cache_url, singles, {"gateway": cached.server.pid}, cache=True),
    ]
    if concurrency == TARGET_CONCURRENCY:  # what JSON floats cost against base64, at the target's setting
        loads.append(RestLoad(GATEWAY_BASE64, gateway_url, singles, stack, encoding_format="base64", triton=seen))
    for peer in peers:
        servers = {"infinity": peer.endpoint.server.pid}
        url = f"{peer.endpoint.base_url}/embeddings"
        loads.append(RestLoad(f"{peer.name}, 1 text/request", url, singles, servers, model=peer.model))
    return loads


async def measure_rounds(
    plan: Plan,
    in_process: InProcess,
    triton_endpoint: Endpoint,
    uncached: Endpoint,
    cached: Endpoint,
    peers: Sequence[Peer],
    write: Callable[[Sequence[Series], Series, int], PartResult],
) -> PartResult:
    """`plan.runs` rounds; each round measures every system at every concurrency once, in turn,
    then the result so far is written."""
    texts = plan.texts
    series: dict[tuple[str, float], Series] = {}
    opened = Series(CACHED_OPEN_LOOP, plan.cache_rate)

    def record(system: str, x: float, stats: RunStats, window: CpuWindow, counters: dict[str, float]) -> None:
        item = series.setdefault((system, x), Series(system, x))
        item.runs.append(stats)
        item.cpu.append(window.percent)
        item.counters.append(counters)
        log.info(
            "%s @ %g: %.0f texts/s, p99 %.1f ms, errors %d",
            system, x, stats.items_per_second, stats.p(99), stats.errors,
        )  # fmt: skip

    await warm_cache(f"{cached.base_url}/v1/embeddings", batches(texts, BATCH))
    for round_number in range(plan.runs):
        log.info("round %d of %d", round_number + 1, plan.runs)
        for system, function, subset in (
            (NAIVE, in_process.naive, texts[: plan.naive_texts]),
            (ST_BATCHED, in_process.st_batched, texts),
            (ORT_INT8, in_process.ort_int8, texts),
        ):
            with CpuWindow({}) as window:
                stats = function(subset)
            record(system, 1, stats, window, {})
        for concurrency in plan.concurrencies:
            for load in rest_loads(concurrency, plan, triton_endpoint, uncached, cached, peers):
                stats, window, counters = await measure_rest(load, concurrency)
                record(load.system, concurrency, stats, window, counters)
            for system, requests in ((TRITON_1, batches(texts, 1)), (TRITON_32, batches(texts, BATCH))):
                stats, window, counters = await measure_triton(triton_endpoint, requests, concurrency)
                record(system, concurrency, stats, window, counters)
            for server in (triton_endpoint.server, uncached.server, cached.server):
                server.check_alive()
        url = f"{cached.base_url}/v1/embeddings"
        stats, window = await cache_open_loop(url, texts, plan.cache_rate, plan.cache_seconds, cached.server.pid)
        opened.runs.append(stats)
        opened.cpu.append(window.percent)
        log.info("cache open loop at %g/s: p99 %.2f ms, errors %d", plan.cache_rate, stats.p(99), stats.errors)
        result = write(list(series.values()), opened, round_number + 1)
    return result


async def measure_rest(load: RestLoad, concurrency: int) -> tuple[RunStats, CpuWindow, dict[str, float]]:
    """One closed loop over all of the load's requests, after an untimed warm-up."""
    session = rest_session(concurrency)
    misses: list[int] = []
    try:
        request = openai_request(
            session, load.url, load.requests, model=load.model, encoding_format=load.encoding_format, misses=misses
        )
        await warm_up(request, concurrency)  # opens the connections and wakes the server outside the timing
        misses.clear()
        before = await load.triton.snapshot() if load.triton else None
        stats, window = await measure(request, total=len(load.requests), concurrency=concurrency, servers=load.servers)
    finally:
        await session.aclose()
    counters = {"cache_misses": float(len(misses))} if load.cache else {}
    if load.triton and before is not None:
        counters |= await load.triton.since(before, stats.items, stats.elapsed)
    return stats, window, counters


async def measure_triton(
    triton: Endpoint, requests: Sequence[list[str]], concurrency: int
) -> tuple[RunStats, CpuWindow, dict[str, float]]:
    client = TritonDirect(triton.grpc_target)
    seen = TritonStats(triton.base_url)
    try:
        request = client.request(requests)
        await warm_up(request, concurrency)
        before = await seen.snapshot()
        servers = {"triton": triton.server.pid}
        stats, window = await measure(request, total=len(requests), concurrency=concurrency, servers=servers)
    finally:
        await client.aclose()
    return stats, window, await seen.since(before, stats.items, stats.elapsed)


async def warm_up(request: Request, concurrency: int) -> None:
    """`concurrency` requests (at least 4) from the end of the workload, not timed."""
    count = max(concurrency, 4)
    await closed_loop(lambda index: request(-1 - index), total=count, concurrency=concurrency)


async def warm_cache(url: str, groups: Sequence[list[str]]) -> None:
    """Every text once through the cached gateway, so that the cache runs only hit."""
    session = rest_session(4)
    try:
        request = openai_request(session, url, groups)
        stats = await closed_loop(request, total=len(groups), concurrency=4)
    finally:
        await session.aclose()
    if stats.errors:
        raise EmbeddingsError(f"warming the cache: {stats.errors} of {len(groups)} requests failed")


async def cache_open_loop(
    url: str, texts: Sequence[str], rate: float, seconds: float, gateway_pid: int
) -> tuple[RunStats, CpuWindow]:
    """Single-text requests from the warm cache started at `rate` per second, whatever the answers do."""
    session = rest_session(256)
    try:
        request = openai_request(session, url, texts)
        await warm_up(request, 32)
        return await measure_open(request, rate=rate, seconds=seconds, servers={"gateway": gateway_pid})
    finally:
        await session.aclose()
