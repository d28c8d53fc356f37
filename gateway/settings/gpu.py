"""The GPUs under Triton: where the gateway reads their state, and the thresholds of its GPU policy."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Hysteresis: a GPU leaves a state only this far below the threshold that put it there, so that a reading hovering
# at the threshold does not flip the state (and the answers) every interval.
MEMORY_RECOVERY_MARGIN = 0.05  # degraded above GPU_MEMORY_DEGRADE_FRACTION, normal again below it minus this
TEMPERATURE_RECOVERY_MARGIN = 5.0  # throttled above GPU_TEMPERATURE_THROTTLE_CELSIUS, cooled below it minus this
STALE_INTERVALS = 3  # an endpoint or a GPU not read for this many intervals leaves the policy


class GpuSettings(BaseSettings):
    """GPU-aware protection: the gateway polls the Prometheus text of Triton's metrics endpoint (memory, power,
    utilisation per GPU) and of the DCGM exporter (temperature, clock-throttle reasons), off the request path, and acts
    per Triton. A GPU whose memory passes its threshold is `degraded`: its Triton gets no calls of several texts while
    another has room; once every Triton is degraded, new uncached bulk work (embeddings of several uncached texts,
    document upserts, reranks) answers 503 `gpu_memory_high` with Retry-After, while single texts, search queries and
    cached answers are served. A hot GPU is `throttled`: its Triton gets no calls while a cooler one serves; once every
    Triton is hot, the in-flight limit of the coalesced embedding calls (TRITON_MAX_IN_FLIGHT_CALLS: embeddings,
    search queries, upserts' texts) is lowered a step per interval, down to 1, until they cool, then raised back a
    step per interval; reranks and chunker calls are not limited, and with TRITON_MAX_IN_FLIGHT_CALLS=1 there is
    nothing to lower. Stale or missing metrics never block traffic: without readings there is no GPU policy
    (docs/operations.md, "GPU states")."""

    model_config = SettingsConfigDict(env_prefix="GPU_", frozen=True)

    metrics_urls: str = Field(
        "",
        description="Comma-separated Prometheus endpoints to read the GPUs from: Triton's metrics "
        "(http://<triton>:8002/metrics) and the DCGM exporter's (http://<exporter>:9400/metrics). A host name is "
        "resolved to every address it has and each address is read (a headless Service's name reads every pod). An "
        "endpoint whose address is one of Triton's (TRITON_URL) governs the calls to that Triton only; one that "
        "matches none, or a single Triton, governs all calls; the DCGM exporter's GPUs follow the Triton that "
        "reports the same GPU UUID. Empty: no GPU policy (the Helm chart fills it on GPU deployments).",
    )
    metrics_interval_seconds: float = Field(
        5.0,
        gt=0,
        description="Seconds between two reads of every endpoint; a state changes at most once per interval, and "
        "an endpoint not read for 3 intervals leaves the policy. Triton refreshes its GPU metrics every 2 s and "
        "the DCGM exporter every 30 s by default; shorter intervals react sooner and poll more.",
    )
    memory_degrade_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="A GPU whose used memory is above this fraction of its budget (GPU_MEMORY_BUDGET_BYTES, else "
        "the GPU's total) is degraded: uncached bulk work answers 503 `gpu_memory_high`. It is normal again below "
        "this fraction minus 0.05. Lower: refuses earlier, more headroom for single texts.",
    )
    memory_budget_bytes: int = Field(
        0,
        ge=0,
        description="The memory Triton may use on each GPU, which its used memory is judged against (0: the GPU's "
        "total); set it where Triton has only part of a GPU. ONNX Runtime keeps its CUDA arena once grown, and the "
        "export caps each model's (`gpu_mem_limit`, 8 GiB): keep the caps of the models on a GPU plus about 1 GiB "
        "of CUDA contexts below 85 % of this budget, so that arenas grown to their caps never degrade the GPU and "
        "what does is memory beyond them (another process, a model loaded beside, TensorRT's workspaces).",
    )
    temperature_throttle_celsius: float = Field(
        85.0,
        description="A GPU hotter than this (DCGM_FI_DEV_GPU_TEMP), or one whose clocks the driver slows for heat "
        "or power brake (DCGM's clock-throttle reasons), is throttled: once every Triton is, the in-flight limit "
        "of the coalesced embedding calls (TRITON_MAX_IN_FLIGHT_CALLS; not reranks nor chunker calls) is lowered by "
        "one call per interval, down to 1 (at 1: nothing to lower); below this temperature minus 5 °C it is raised "
        "back by one per interval. Power at its cap is normal under load and does not throttle. Triton's own "
        "metrics carry no temperature: without the DCGM exporter nothing is throttled.",
    )

    def urls(self) -> list[str]:
        """GPU_METRICS_URLS, each once, in order."""
        return list(dict.fromkeys(url.strip() for url in self.metrics_urls.split(",") if url.strip()))
