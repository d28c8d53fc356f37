"""The GPU policy's wiring in the chart: the gateway reads every Triton pod's metrics (none with cpuOnly) and, as an
option, the cluster's DCGM exporter, and its NetworkPolicy lets it reach both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.test_chart import CHART, helm
from tests.helm.test_chart_networkpolicy import component_peer, egress_by_port, policies

pytestmark = pytest.mark.slow

TRITON_METRICS = "http://ai-ai-stack-triton-headless.ai.svc:8002/metrics"
DCGM = "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"
DCGM_PEERS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpu-operator"}},
        "podSelector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}},
    }
]


def gateway_config(*args: str) -> dict[str, str]:
    import yaml

    result = helm("template", "ai", str(CHART), "--namespace", "ai", *args)
    assert result.returncode == 0, result.stderr
    for manifest in yaml.safe_load_all(result.stdout):
        if manifest and manifest["kind"] == "ConfigMap" and manifest["metadata"]["name"] == "ai-ai-stack-gateway":
            data: dict[str, str] = manifest["data"]
            return data
    raise AssertionError("no gateway ConfigMap")


def metrics_ingress(spec: dict[str, Any]) -> list[dict[str, Any]] | None:
    (rule,) = [r for r in spec["ingress"] if {p["port"] for p in r["ports"]} == {"metrics"}]
    return rule.get("from")


def test_on_gpus_the_gateway_reads_every_triton_pods_metrics() -> None:
    config = gateway_config()
    assert config["GPU_METRICS_URLS"] == TRITON_METRICS
    assert config["GPU_MEMORY_DEGRADE_FRACTION"] == "0.9"
    assert config["GPU_TEMPERATURE_THROTTLE_CELSIUS"] == "85"
    found = policies()
    assert egress_by_port(found["gateway"])[frozenset({8001, 8002})] == [component_peer("triton")]
    scrapers = metrics_ingress(found["triton"])
    assert scrapers is not None and component_peer("gateway") in scrapers, "Triton lets the gateway read its metrics"


def test_cpu_only_has_no_gpu_to_read() -> None:
    assert "GPU_METRICS_URLS" not in gateway_config("--set", "cpuOnly=true")
    found = policies("--set", "cpuOnly=true")
    assert frozenset({8001}) in egress_by_port(found["gateway"])
    assert component_peer("gateway") not in (metrics_ingress(found["triton"]) or [])


def test_the_dcgm_option_points_the_gateway_at_the_clusters_exporter_and_lets_it_through() -> None:
    assert "GPU_METRICS_URLS" in gateway_config() and DCGM not in gateway_config()["GPU_METRICS_URLS"]
    on = ("--set", "dcgmExporter.enabled=true")
    assert gateway_config(*on)["GPU_METRICS_URLS"] == f"{TRITON_METRICS},{DCGM}"
    assert egress_by_port(policies(*on)["gateway"])[frozenset({9400})] == DCGM_PEERS
    elsewhere = policies(*on, "--set", "dcgmExporter.url=http://dcgm.monitoring.svc/metrics", "--set-json",
                         "dcgmExporter.networkPolicyPeers=[]")  # fmt: skip
    assert egress_by_port(elsewhere["gateway"])[frozenset({80})] is None, "no peers: any address on the URL's port"


def test_the_gpu_metrics_urls_are_the_charts_to_set() -> None:
    result = helm("template", str(CHART), "--set", "gateway.config.GPU_METRICS_URLS=http://x/metrics")
    assert result.returncode != 0 and "GPU_METRICS_URLS is set by the chart" in result.stderr
    refused = helm("template", str(CHART), "--set", "dcgmExporter.url=nvidia-dcgm-exporter:9400")
    assert refused.returncode != 0, "a URL without its scheme"
