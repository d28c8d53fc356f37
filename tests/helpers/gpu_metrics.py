"""Recorded Prometheus text of a GPU Triton and of the DCGM exporter, with the figures a test sets, and a real HTTP
server that serves it.

The families, label sets and formatting are those of Triton's metrics endpoint (`nv_gpu_*`, label `gpu_uuid`,
values printed with six decimals, per-model `nv_inference_*` families beside them) and of dcgm-exporter with its
default counters plus the clock-throttle reasons (labels `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`Hostname`, the driver version, and the pod's in Kubernetes mode).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GIB = 1 << 30
MIB = 1 << 20
H100 = "NVIDIA H100 80GB HBM3"


@dataclass
class Gpu:
    """What a test says of one GPU; the text is rendered from it."""

    uuid: str = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    index: int = 0
    total_bytes: int = 80 * GIB
    used_bytes: int = 20 * GIB
    utilization: float = 0.35
    power_watts: float = 310.5
    power_limit_watts: float = 700.0
    temperature: float = 55.0
    clock_reasons: int = 0  # NVML's mask: 0x4 power cap, 0x40 HW thermal slowdown, ...
    reasons_field: str = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"  # DCGM 3.3+: DCGM_FI_DEV_CLOCKS_EVENT_REASONS


def triton_text(gpus: list[Gpu]) -> str:
    """Triton's /metrics (port 8002) on a GPU server: the GPU families, and the per-model ones it serves with them."""
    families = [
        ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", lambda g: g.utilization),
        ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", lambda g: g.total_bytes),
        ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", lambda g: g.used_bytes),
        ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", lambda g: g.power_watts),
        ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", lambda g: g.power_limit_watts),
        (
            "nv_energy_consumption",
            "GPU energy consumption in joules since the Triton Server started",
            "counter",
            lambda g: 3594017.4,
        ),
    ]
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="bge",version="1"} 1532',
        'nv_inference_request_success{model="bge_onnx",version="1"} 1532',
        "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds",
        "# TYPE nv_inference_queue_duration_us counter",
        'nv_inference_queue_duration_us{model="bge_onnx",version="1"} 88123',
    ]
    for name, help_text, kind, value in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{gpu_uuid="{g.uuid}"}} {float(value(g)):.6f}' for g in gpus]
    return "\n".join(lines) + "\n"


def dcgm_text(gpus: list[Gpu], *, hostname: str = "gpu-node-1", pod: str = "ai-ai-stack-triton-7d9c-x2x4q") -> str:
    """dcgm-exporter's /metrics (port 9400), Kubernetes mode, for the GPUs of one node."""

    def labels(g: Gpu) -> str:
        return (
            f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="00000000:{0x53 + g.index:02X}:00.0",device="nvidia{g.index}",'
            f'modelName="{H100}",Hostname="{hostname}",DCGM_FI_DRIVER_VERSION="550.90.07",container="triton",'
            f'namespace="ai",pod="{pod}"'
        )

    families = [
        ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge", lambda g: 1980),
        ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge", lambda g: 2619),
        ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "gauge", lambda g: int(g.temperature) - 8),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", lambda g: int(g.temperature)),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", lambda g: g.power_watts),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since boot (in mJ).",
            "counter",
            lambda g: 51772392190,
        ),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", lambda g: round(g.utilization * 100)),
        ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge", lambda g: 0),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", lambda g: _free_mib(g)),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge", lambda g: g.used_bytes // MIB),
    ]
    lines = []
    for name, help_text, kind, value in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels(g)}}} {value(g)}" for g in gpus]
    for field in sorted({g.reasons_field for g in gpus}):
        lines += [f"# HELP {field} Current clock throttle reasons.", f"# TYPE {field} gauge"]
        lines += [f"{field}{{{labels(g)}}} {g.clock_reasons}" for g in gpus if g.reasons_field == field]
    return "\n".join(lines) + "\n"


def _free_mib(gpu: Gpu) -> int:
    reserved = 581  # the driver's share: FB_USED + FB_FREE falls short of the card's memory by it
    return (gpu.total_bytes - gpu.used_bytes) // MIB - reserved


class MetricsServer:
    """A real HTTP server on 127.0.0.1 serving `texts[path]` (status `statuses[path]`, default 200); a path with no
    text answers 404. Tests change the dicts between reads."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.texts: dict[str, str] = {}
        self.statuses: dict[str, int] = {}
        self.reads: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.reads[self.path] = server.reads.get(self.path, 0) + 1
                text = server.texts.get(self.path)
                status = server.statuses.get(self.path, 200 if text is not None else 404)
                body = (text or "").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # quiet: the test reads `reads`
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        # A short poll: shutdown() waits for the loop's next look at its flag (0.5 s by default).
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name="gpu-metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str) -> str:
        return f"http://{self._httpd.server_address[0]}:{self.port}{path}"

    def __enter__(self) -> MetricsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
