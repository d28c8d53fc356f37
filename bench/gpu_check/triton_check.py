"""The served path on the GPU: Triton (the nvidia-pytriton wheel's server) with `bge_onnx` as a KIND_GPU instance
on the FP16 graph, called through the gateway's own Triton client at batches of 1 to 128 texts, one and four calls
in flight; the served vectors against PyTorch's FP32 ones for the same tokens; and Triton's GPU metrics, read
from its metrics port as the gateway's GPU poller reads them.

The dry run serves the FP32 graph on a KIND_CPU instance instead: the same repository, server, client and
metrics code, without a GPU.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.gpu_check.latency import Point, Sweep, Window, percentiles_ms
from bench.gpu_check.model import ModelShape, cls_embedder
from bench.gpu_check.onnx_check import REPOSITORY
from bench.gpu_check.plan import Plan
from bench.gpu_check.steps import StepSkipped
from bench.gpu_check.torch_check import parity_line, parity_summary
from localtriton.server import TritonProcess

if TYPE_CHECKING:
    from transformers import BertModel

    from gateway.settings import TritonSettings
    from gateway.upstreams.triton import TritonClient

PARITY_TEXTS = 32
GENERATED = ("*.onnx", "*.onnx.data", "parity.json", "tokenizer.json", "__pycache__", "reranker*")


class GpuCheckTriton(TritonProcess):
    """localtriton's server with Triton's GPU metrics on (localtriton turns them off: CPU machines have none), whose
    python-backend stubs run the Python of `stub_env` (see `stub_environment`)."""

    def __init__(self, repository: Path, stub_env: Path, **kwargs: Any) -> None:
        super().__init__(repository, **kwargs)
        self.stub_env = stub_env

    def command(self) -> list[str]:
        return [*(a for a in super().command() if a != "--allow-gpu-metrics=false"), "--allow-gpu-metrics=true"]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["PATH"] = os.pathsep.join([str(self.stub_env / "bin"), env["PATH"]])
        return env


def stub_environment(dest: Path, sites: list[Path]) -> Path:
    """A virtual environment whose Python imports from `sites`, in that order, for the python-backend stubs.

    The stub's embedded Python runs isolated (it ignores PYTHONPATH) and imports from the environment of the first
    `python3` on PATH. The carried wheels, installed with `--target`, are outside every environment; this one lists
    them before the machine's own packages (a `.pth` file), so that onnxruntime-gpu comes before the CPU build."""
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    (own,) = dest.glob("lib/python3*/site-packages")
    (own / "gpu_check_sites.pth").write_text("".join(f"{site}\n" for site in sites), encoding="utf-8")
    return dest


def client_unavailable() -> str | None:
    """Why the gateway's Triton client cannot be imported here, or None."""
    try:
        import gateway.upstreams.triton  # noqa: F401
    except ImportError as exc:
        return f"the gateway's Triton client does not import ({exc}): carry its wheels (bench/gpu_check/carry.sh)"
    return None


def repository(work: Path, shape: ModelShape, graph: Path, tokenizer_file: Path, seed: int, on_gpu: bool) -> Path:
    """The tracked model repository with the check's graph and tokenizer installed by the export's own `install`,
    `bge_onnx` on KIND_GPU (its FP16 graph) or, in the dry run, KIND_CPU on the FP32 graph."""
    from tritonclient.grpc import model_config_pb2 as mc

    from export.repository import ServedModel, install, parse, render

    dest = work / "model_repository"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(REPOSITORY, dest, ignore=shutil.ignore_patterns(*GENERATED))
    staged = work / "staged"
    staged.mkdir(exist_ok=True)
    files = [_linked(graph, staged / graph.name), _linked(tokenizer_file, staged / "tokenizer.json")]
    served = ServedModel(shape.name, f"random-seed-{seed}", shape.hidden, shape.max_positions, cpu_precision="fp32")
    install(dest, served, files[:1], files[1])
    config_file = dest / "bge_onnx" / "config.pbtxt"
    config = parse(config_file.read_text())
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
    config_file.write_text(render(config))
    return dest


def _linked(source: Path, target: Path) -> Path:
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)
    return target


def library_path(sites: list[Path]) -> str:
    """LD_LIBRARY_PATH for the server: the CUDA libraries of the wheels in `sites` (the stub's onnxruntime-gpu loads
    them by name, with no torch import to load them first) and this Python's libpython (the stub links to it)."""
    found = sorted({str(lib.parent) for site in sites for lib in site.glob("nvidia/**/lib/lib*.so*")})
    libdir = sysconfig.get_config_var("LIBDIR")
    return os.pathsep.join(filter(None, [*found, libdir, os.environ.get("LD_LIBRARY_PATH")]))


async def served_point(client: TritonClient, texts: list[str], batch: int, in_flight: int, window: Window) -> Point:
    """`in_flight` callers, each sending `batch` texts a call until the window closes."""
    position = 0

    def next_texts() -> list[str]:
        nonlocal position
        chosen = [texts[(position + i) % len(texts)] for i in range(batch)]
        position += batch
        return chosen

    for _ in range(window.warmup):
        await client.embed(next_texts())
    latencies: list[float] = []
    began = time.perf_counter()

    async def caller() -> None:
        while True:
            spent = time.perf_counter() - began
            if (len(latencies) >= window.min_calls and spent >= window.min_seconds) or spent >= window.max_seconds:
                return
            started = time.perf_counter()
            await client.embed(next_texts())
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(caller() for _ in range(in_flight)))
    spent = time.perf_counter() - began
    p50, p99 = percentiles_ms(latencies)
    return Point(
        "Triton bge (gateway client)", batch, 0, len(latencies), batch * len(latencies) / spent, p50, p99, in_flight
    )


async def served_sweep(
    client: TritonClient, texts: list[str], plan: Plan, deadline: float, say: Callable[[str], None]
) -> Sweep:
    result = Sweep([], [])
    for in_flight in plan.in_flight:
        for batch in plan.served_batches:
            if time.monotonic() + plan.served_window.max_seconds + 2.0 > deadline:
                result.left_out.append(f"{batch} texts, {in_flight} in flight")
                continue
            point = await served_point(client, texts, batch, in_flight, plan.served_window)
            result.points.append(point)
            say(point.line())
    return result


def reference_vectors(encoder: BertModel, tokenizer_file: Path, texts: list[str], device: str) -> Any:
    """PyTorch FP32 vectors of `texts`, tokenized with the tokenizer file Triton serves."""
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_truncation(encoder.config.max_position_embeddings)
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings], device=device)
    mask = torch.tensor([e.attention_mask for e in encodings], device=device)
    model = cls_embedder(encoder).to(device)
    try:
        with torch.inference_mode():
            return model(ids, mask).float().cpu().numpy()
    finally:
        model.to("cpu")


async def serve_and_measure(
    settings: TritonSettings, texts: list[str], plan: Plan, deadline: float, say: Callable[[str], None]
) -> tuple[Any, Sweep]:
    """The first texts' served vectors (for parity), then the sweep, on one client."""
    from gateway.upstreams.triton import TritonClient

    async with TritonClient(settings) as client:
        served = (await client.embed(texts[:PARITY_TEXTS])).vectors
        return served, await served_sweep(client, texts, plan, deadline, say)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
    return text


def gpu_samples(text: str) -> dict[str, float]:
    """Triton's `nv_gpu_*` and `nv_energy_*` samples as the gateway's parser (prometheus_client's) reads them."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        f"{sample.name}{{gpu_uuid={sample.labels.get('gpu_uuid', '')}}}": sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(("nv_gpu_", "nv_energy"))
    }


def run(
    encoder: BertModel,
    plan: Plan,
    graphs: dict[str, Path],
    tokenizer_file: Path,
    sites: list[Path],
    work: Path,
    out_dir: Path,
    deadline: float,
    say: Callable[[str], None],
    seed: int = 0,
) -> dict[str, Any]:
    """Serve, measure, read the metrics; the server is stopped whatever happens."""
    from bench.workload import texts as workload_texts
    from gateway.settings import TritonSettings
    from localtriton.ports import free_port

    on_gpu = not plan.dry_run
    graph = graphs["fp16" if on_gpu else "fp32"]
    repo = repository(work, plan.shape, graph, tokenizer_file, seed, on_gpu)
    os.environ["LD_LIBRARY_PATH"] = library_path(sites)
    server = GpuCheckTriton(
        repo,
        stub_environment(work / "stub-env", sites),
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        dist_dir=work / "tritonserver",
        log_path=work / "triton.log",
        exit_timeout_seconds=5,
    )
    started = time.monotonic()
    server.start()
    try:
        try:
            server.wait_ready(timeout=max(10.0, min(240.0, deadline - time.monotonic() - 30)))
        except Exception as exc:
            raise StepSkipped(f"Triton did not become ready: {exc}") from None
        ready = time.monotonic() - started
        say(f"triton: ready in {ready:.0f} s (bge_onnx on {'KIND_GPU' if on_gpu else 'KIND_CPU'})")
        texts = workload_texts(512)
        settings = TritonSettings(url=server.grpc_url, timeout_seconds=120)
        served, measured = asyncio.run(serve_and_measure(settings, texts, plan, deadline, say))
        metrics_text = scrape(f"http://{server.host}:{server.metrics_port}/metrics")
    finally:
        log_tail = server.log_tail(20).splitlines()
        server.stop()
    (out_dir / "triton_metrics.prom").write_text(metrics_text, encoding="utf-8")
    reference = reference_vectors(encoder, tokenizer_file, texts[:PARITY_TEXTS], "cuda" if on_gpu else "cpu")
    parity = parity_summary(reference, np.asarray(served, dtype=np.float32))
    say(parity_line("triton parity served vs torch FP32", parity))
    return {
        "instance_kind": "KIND_GPU" if on_gpu else "KIND_CPU",
        "graph": graph.name,
        "ready_seconds": round(ready, 1),
        "parity_served_vs_torch_fp32": parity,
        "sweep": measured.as_dict(),
        "nv_gpu_metrics": gpu_samples(metrics_text) or "Triton exported no nv_gpu_* metrics (no GPU, or no DCGM)",
        "log_tail": log_tail,
    }
