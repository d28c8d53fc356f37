"""What the gateway's GPU policy reads on a GPU machine: the readings its parser (`gateway.gpu.metrics_text`) gets from
live Triton and DCGM endpoints, beside NVML's own figures (`nvidia-smi`), and the state the policy would give each
GPU with the default thresholds. `bench/gpu.sh` runs it before the GPU benchmark.

    python -m bench.gpu_readings                  start Triton (bge_onnx on KIND_GPU, GPU metrics on), embed a few
                                                  batches, then read its metrics port and DCGM_URL (if it answers)
    python -m bench.gpu_readings --url URL ...    read these endpoints only (e.g. a deployment's Triton pods and
                                                  its DCGM exporter); no GPU needed here

Without a GPU (no working `nvidia-smi`) the first form reads nothing and says why; it never fails the benchmark.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.gpu import nvidia_gpu_missing
from bench.stack import REPOSITORY
from gateway.gpu.metrics_text import GpuReading, merge_by_gpu, parse_readings
from gateway.gpu.policy import GpuPolicy, Thresholds
from gateway.settings import GpuSettings

DCGM_URL = os.environ.get("DCGM_URL", "http://127.0.0.1:9400/metrics")  # dcgm-exporter's default port
NVML_FIELDS = "uuid,memory.used,memory.total,temperature.gpu,power.draw,power.limit"
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # the newer name, then the older
LOAD_BATCHES = 8  # batches of 64 texts sent before reading: the CUDA arena and the clocks move off idle


def read_endpoint(url: str, client: httpx.Client) -> tuple[list[GpuReading], str]:
    """The parser's readings of `url`, and what went wrong ("" when nothing did)."""
    try:
        response = client.get(url)
        response.raise_for_status()
        return parse_readings(response.text), ""
    except (httpx.HTTPError, ValueError) as exc:
        return [], f"{type(exc).__name__}: {exc}"


def describe(reading: GpuReading) -> str:
    parts = [f"{reading.uuid} ({reading.source})"]
    if reading.memory_used_bytes is not None and reading.memory_total_bytes:
        parts.append(f"memory {reading.memory_used_bytes / 2**30:.2f} of {reading.memory_total_bytes / 2**30:.2f} GiB")
    if reading.utilization is not None:
        parts.append(f"utilisation {reading.utilization:.0%}")
    if reading.power_watts is not None:
        cap = f" of {reading.power_limit_watts:.0f}" if reading.power_limit_watts else ""
        parts.append(f"power {reading.power_watts:.0f}{cap} W")
    if reading.temperature_celsius is not None:
        parts.append(f"{reading.temperature_celsius:g} °C")
    if reading.clock_event_reasons is not None:
        parts.append(f"clock reasons 0x{reading.clock_event_reasons:x} (slowed for heat: {reading.slowed_for_heat})")
    return ", ".join(parts)


def report(urls: Sequence[str]) -> list[str]:
    """One line per endpoint and GPU as the parser read it, then each GPU merged and the policy's state for it."""
    lines: list[str] = []
    readings: list[GpuReading] = []
    with httpx.Client(timeout=5.0) as client:
        for url in urls:
            found, error = read_endpoint(url, client)
            lines.append(f"{url}: {error or f'{len(found)} GPU(s)'}")
            lines += [f"  {describe(r)}" for r in found]
            readings += found
    thresholds = Thresholds.of(GpuSettings(), max_in_flight_calls=4)
    for uuid, merged in merge_by_gpu(readings).items():
        policy = GpuPolicy(thresholds)
        policy.observe(merged)
        states = ", ".join(sorted(state.value for state in policy.states))
        lines.append(f"merged {describe(merged)} -> {states} (default thresholds)")
        if merged.temperature_celsius is None:
            lines.append(
                f"  {uuid}: no temperature (Triton reports none): the gateway needs the DCGM exporter for heat"
            )
    if not readings:
        lines.append("no GPU read: the gateway would apply no GPU policy")
    return lines


def nvml_lines() -> list[str]:
    """NVML's figures per GPU (through nvidia-smi): what both exporters read, for comparison; DCGM absent, the only
    source of temperature and clock reasons on the machine."""
    for reasons in REASON_FIELDS:
        query = ["nvidia-smi", f"--query-gpu={NVML_FIELDS},{reasons}", "--format=csv,noheader,nounits"]
        done = subprocess.run(query, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            header = f"NVML ({NVML_FIELDS},{reasons}; MiB, °C, W):"
            return [header, *(f"  {line.strip()}" for line in done.stdout.splitlines() if line.strip())]
    return [f"NVML: nvidia-smi could not be queried ({done.stderr.strip()[:200]})"]


@contextmanager
def gpu_triton(repository: Path, work: Path) -> Iterator[str]:
    """Triton on `repository` with bge_onnx on the GPU and its GPU metrics on (localtriton turns them off); yields
    its metrics URL once it has embedded a few batches."""
    from bench.gpu import gpu_repository
    from localtriton.ports import free_port
    from localtriton.server import TritonProcess

    server = TritonProcess(
        gpu_repository(repository, work / "repository"),
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_path=work / "triton.log",
        extra_args=("--allow-gpu-metrics=true", "--metrics-interval-ms=1000"),
    )
    server.start()
    try:
        server.wait_ready(timeout=600)
        embed_batches(server.grpc_url)
        yield f"http://{server.host}:{server.metrics_port}/metrics"
    finally:
        server.stop()


def embed_batches(address: str) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    from bench.workload import texts

    sample = texts()[: 64 * LOAD_BATCHES]
    client = grpcclient.InferenceServerClient(address)
    for start in range(0, len(sample), 64):
        batch = np.array([[t.encode()] for t in sample[start : start + 64]], dtype=np.object_)
        tensor = grpcclient.InferInput("TEXT", list(batch.shape), "BYTES")
        tensor.set_data_from_numpy(batch)
        client.infer("bge", [tensor])
    client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", action="append", default=[], help="a Prometheus endpoint to read (repeatable)")
    parser.add_argument("--repository", type=Path, default=REPOSITORY, help="the exported model repository")
    args = parser.parse_args(argv)
    if args.url:
        print("\n".join(report(args.url)))
        return 0
    reason = nvidia_gpu_missing()
    if reason is not None:
        print(f"gpu readings: {reason}; nothing read")
        return 0
    try:
        with (
            tempfile.TemporaryDirectory(prefix="gpu-readings-") as work,
            gpu_triton(args.repository, Path(work)) as url,
        ):
            lines = report([url, DCGM_URL]) + nvml_lines()
    except Exception as exc:  # a step before the benchmark: it reports, it does not stop the benchmark
        print(f"gpu readings: Triton on the GPU did not serve ({type(exc).__name__}: {exc}); nothing read")
        return 0
    print("gpu readings (what the gateway's GPU policy reads):\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
