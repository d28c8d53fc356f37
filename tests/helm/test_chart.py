"""The Helm chart in helm/ai-stack: lint, render, validate against the Kubernetes schemas, and check what it renders.

Needs the helm binary at .run/tools/bin/helm (`helm/install-tools.sh` puts it there) and kubernetes-validate.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from gateway.settings import renamed_variables
from gateway.settings_schema import SECRET_LIKE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ai-stack"
HELM = ROOT / ".run" / "tools" / "bin" / "helm"
# The oldest version Chart.yaml allows, and a current one.
KUBERNETES_VERSIONS = ("1.26.0", "1.30.0")
RELEASE = "ai"

SCENARIOS = ["default", *sorted(p.stem.removesuffix("-values") for p in (CHART / "ci").glob("*-values.yaml"))]
# Kinds from CRDs that kubernetes-validate has no schema for; their shape is checked by the tests below.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("keda.sh/v1alpha1", "ScaledObject")}
# Settings about API keys that hold no secret: a path and an interval.
NAMED_LIKE_SECRETS = {"GATEWAY_KEYS_FILE", "GATEWAY_KEYS_REFRESH_SECONDS", "GATEWAY_KEYS_SQLITE_PATH"}
# Settings whose default is "unset" (None): the chart leaves them out unless gateway.extraConfig sets them.
# GATEWAY_PUBLIC_URL is rendered only when the ingress (or gateway.config) gives the gateway a public address.
UNSET_BY_DEFAULT = {"OTEL_EXPORTER_OTLP_ENDPOINT", "CHAT_TOKENS_PER_MINUTE", "GATEWAY_PUBLIC_URL"}
# Set by the chart only where they apply: the keys file with gateway.keys, the SQLite files without Redis,
# search's store settings with search.enabled, the GPU metrics on GPUs.
SET_WHERE_THEY_APPLY = {
    "GPU_METRICS_URLS",
    "GATEWAY_KEYS_FILE",
    "GATEWAY_KEYS_SQLITE_PATH",
    "GATEWAY_USAGE_SQLITE_PATH",
    "SEARCH_MILVUS_URI",
    "SEARCH_MILVUS_TOKEN",
    "SEARCH_PATH",
}
# Keys the gateway reads from its Secret (the chart's, or gateway.existingSecret).
GATEWAY_SECRET_KEYS = {"GATEWAY_API_KEYS", "CHAT_API_KEY", "VIDEO_API_KEY"}

# The cluster the scenarios are rendered for has the monitoring stack (the Prometheus operator, prometheus-adapter,
# KEDA): with serviceMonitor.enabled=auto the chart asks helm's API discovery, which these flags stand in for.
MONITORED_CLUSTER = tuple(
    arg
    for api in (
        "monitoring.coreos.com/v1/ServiceMonitor",
        "custom.metrics.k8s.io/v1beta1",
        "keda.sh/v1alpha1/ScaledObject",
    )
    for arg in ("--api-versions", api)
)

Manifest = dict[str, Any]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run helm/install-tools.sh first")
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120, check=False)


def values_args(scenario: str) -> list[str]:
    return [] if scenario == "default" else ["-f", str(CHART / "ci" / f"{scenario}-values.yaml")]


@cache
def render(scenario: str) -> tuple[Manifest, ...]:
    result = helm("template", RELEASE, str(CHART), "--namespace", "ai", *MONITORED_CLUSTER, *values_args(scenario))
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(scenario: str, kind: str) -> list[Manifest]:
    return [m for m in render(scenario) if m["kind"] == kind]


def one(scenario: str, kind: str, component: str) -> Manifest:
    found = [m for m in of_kind(scenario, kind) if m["metadata"]["name"] == f"{RELEASE}-ai-stack-{component}"]
    assert len(found) == 1, f"{kind} {component}: {len(found)} rendered"
    return found[0]


def pod_containers(manifest: Manifest) -> list[Manifest]:
    spec = manifest["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads(scenario: str) -> list[Manifest]:
    return [m for m in render(scenario) if m["kind"] in {"Deployment", "StatefulSet"}]


def container(manifest: Manifest, name: str) -> Manifest:
    return next(c for c in manifest["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def settings_env_names() -> set[str]:
    """Every environment variable gateway.settings.Settings reads."""
    from gateway.settings import all_environment_variables

    return all_environment_variables()


def gateway_env_names(scenario: str) -> set[str]:
    config = one(scenario, "ConfigMap", "gateway")["data"]
    env = container(one(scenario, "Deployment", "gateway"), "gateway").get("env", [])
    return set(config) | {e["name"] for e in env}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint(scenario: str) -> None:
    result = helm("lint", "--strict", str(CHART), *values_args(scenario))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_validates_against_kubernetes_schemas(scenario: str) -> None:
    import kubernetes_validate

    for manifest in render(scenario):
        if (manifest["apiVersion"], manifest["kind"]) in CRD_KINDS:
            assert manifest["metadata"]["name"] and manifest["spec"]
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)


def test_schema_rejects_a_string_where_a_number_belongs() -> None:
    for command in ("lint", "template"):
        result = helm(command, str(CHART), "--set-string", "gateway.autoscaling.maxReplicas=twenty")
        assert result.returncode != 0, f"helm {command} accepted maxReplicas=twenty"
        assert "maxReplicas" in result.stdout + result.stderr


def test_schema_rejects_an_unknown_model_repository_source() -> None:
    result = helm("template", str(CHART), "--set", "triton.modelRepository.source=ftp")
    assert result.returncode != 0


def test_gateway_hpa_numbers_and_behaviour() -> None:
    hpa = one("default", "HorizontalPodAutoscaler", "gateway")
    spec = hpa["spec"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (spec["minReplicas"], spec["maxReplicas"]) == (3, 20)
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ai-ai-stack-gateway"}
    cpu, pods = spec["metrics"]
    assert cpu["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}
    assert pods["pods"]["metric"]["name"] == "http_requests_in_flight"
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": "10"}
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 30
    assert up["policies"] == [{"type": "Pods", "value": 4, "periodSeconds": 60}]
    assert down["stabilizationWindowSeconds"] == 300
    assert down["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 120}]
    assert "replicas" not in one("default", "Deployment", "gateway")["spec"], "the HPA owns the replica count"


def test_prometheus_adapter_rule_serves_the_in_flight_gauge() -> None:
    # prometheus-community/prometheus-adapter (charts/prometheus-adapter/templates/deployment.yaml) mounts the
    # ConfigMap named by its `rules.existing` at /etc/adapter/ and runs with --config=/etc/adapter/config.yaml.
    data = one("default", "ConfigMap", "adapter-rules")["data"]
    assert set(data) == {"config.yaml"}
    config = yaml.safe_load(data["config.yaml"])
    assert set(config) <= {"rules", "externalRules", "resourceRules"}, "the adapter's config format"
    assert all(set(r) >= {"seriesQuery", "resources", "name", "metricsQuery"} for r in config["rules"])
    rule = config["rules"][0]
    assert rule["seriesQuery"].startswith("http_requests_in_flight{")
    assert rule["name"]["as"] == "http_requests_in_flight"


def test_keda_replaces_the_hpa() -> None:
    assert of_kind("keda", "HorizontalPodAutoscaler") == []
    scaled = one("keda", "ScaledObject", "gateway")["spec"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (3, 20)
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["policies"] == [{"type": "Pods", "value": 4, "periodSeconds": 60}]
    triggers = {t["type"]: t for t in scaled["triggers"]}
    assert triggers["cpu"]["metadata"]["value"] == "60"
    assert "http_requests_in_flight" in triggers["prometheus"]["metadata"]["query"]
    assert triggers["prometheus"]["metadata"]["threshold"] == "10"


def test_without_a_metrics_adapter_the_hpa_scales_on_cpu_alone() -> None:
    """An HPA with a metric nobody serves never scales down: with mode none it gets only the CPU metric."""
    result = helm("template", RELEASE, str(CHART), "--namespace", "ai", "--set", "metricsAdapter.mode=none")
    assert result.returncode == 0, result.stderr
    manifests = [m for m in yaml.safe_load_all(result.stdout) if m]
    hpa = next(m for m in manifests if m["kind"] == "HorizontalPodAutoscaler")
    assert [metric["type"] for metric in hpa["spec"]["metrics"]] == ["Resource"]
    assert not [m for m in manifests if m["metadata"]["name"].endswith("adapter-rules")]


def test_autoscaling_off_sets_a_fixed_replica_count() -> None:
    assert of_kind("autoscaling-off", "HorizontalPodAutoscaler") == []
    assert of_kind("autoscaling-off", "ScaledObject") == []
    assert one("autoscaling-off", "Deployment", "gateway")["spec"]["replicas"] == 2


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gateway_probes_ports_and_draining(scenario: str) -> None:
    deployment = one(scenario, "Deployment", "gateway")
    gateway = container(deployment, "gateway")
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": 8080, "grpc": 50051}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    sleep = int(gateway["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(one(scenario, "ConfigMap", "gateway")["data"]["GATEWAY_SHUTDOWN_GRACE_SECONDS"])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > sleep + drain


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_services_name_their_grpc_protocol(scenario: str) -> None:
    for component, grpc_port in (("gateway", 50051), ("triton", 8001)):
        ports = {p["name"]: p for p in one(scenario, "Service", component)["spec"]["ports"]}
        assert ports["grpc"]["port"] == grpc_port
        assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    triton_ports = {p["name"]: p["port"] for p in one(scenario, "Service", "triton")["spec"]["ports"]}
    assert triton_ports == {"http": 8000, "grpc": 8001, "metrics": 8002}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_triton_probes_are_sized_for_model_loading(scenario: str) -> None:
    triton = container(one(scenario, "Deployment", "triton"), "triton")
    assert triton["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    readiness = " ".join(triton["readinessProbe"]["exec"]["command"])
    assert "/tmp/draining" in readiness and "127.0.0.1:8000/v2/health/ready" in readiness, "ready unless draining"
    startup = triton["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "models get at least 5 minutes to load"
    assert {p["containerPort"] for p in triton["ports"]} == {8000, 8001, 8002}


def test_triton_on_gpu_by_default() -> None:
    deployment = one("default", "Deployment", "triton")
    triton = container(deployment, "triton")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--model-config-name=onnxruntime_gpu" in triton["args"]
    tolerations = deployment["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert "models" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}, "from the image"


def test_cpu_only_asks_for_no_gpu() -> None:
    deployment = one("cpu-only", "Deployment", "triton")
    triton = container(deployment, "triton")
    assert "nvidia.com/gpu" not in json.dumps(triton["resources"])
    assert not any(a.startswith("--model-config-name") for a in triton["args"]), "KIND_CPU: the default config"
    assert triton["image"].startswith("ghcr.io/example/ai-triton-cpu:")
    assert "models" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert of_kind("cpu-only", "PersistentVolumeClaim") == []


def test_object_storage_source_fetches_models_in_an_init_container() -> None:
    spec = one("external-redis", "Deployment", "triton")["spec"]["template"]["spec"]
    (fetch,) = spec["initContainers"]
    env = {e["name"]: e.get("value") for e in fetch["env"]}
    assert env["MODEL_REPOSITORY_URI"] == "s3://ai-models/model_repository"
    assert fetch["envFrom"] == [{"secretRef": {"name": "ai-models-s3"}}]
    assert {v["name"]: v for v in spec["volumes"]}["models"]["emptyDir"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_container_has_resources(scenario: str) -> None:
    for workload in workloads(scenario):
        for c in pod_containers(workload):
            resources = c.get("resources", {})
            assert resources.get("requests") and resources.get("limits"), f"{workload['metadata']['name']}/{c['name']}"
            assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_container_runs_locked_down(scenario: str) -> None:
    for workload in workloads(scenario):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for c in pod_containers(workload):
            context = c["securityContext"]
            where = f"{workload['metadata']['name']}/{c['name']}"
            assert context["runAsNonRoot"] is True, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_secrets_only_in_secrets(scenario: str) -> None:
    for config_map in of_kind(scenario, "ConfigMap"):
        data = config_map.get("data", {})
        leaked = [k for k, v in data.items() if SECRET_LIKE.search(k) and k not in NAMED_LIKE_SECRETS and v]
        assert leaked == [], f"{config_map['metadata']['name']} holds {leaked}"
    for workload in workloads(scenario):
        for c in pod_containers(workload):
            # a value made only of $(VAR) references to secretKeyRef variables holds no secret itself
            plain = [
                e["name"]
                for e in c.get("env", [])
                if SECRET_LIKE.search(e["name"]) and "value" in e and not re.search(r"\$\([A-Z_]+\)", e["value"])
            ]
            assert plain == [], f"{c['name']} sets {plain} in plain text"


def test_gateway_keys_come_from_the_charts_secret() -> None:
    secret = one("gpu", "Secret", "gateway")
    assert secret["stringData"] == {
        "GATEWAY_API_KEYS": "ci-key-1,ci-key-2",
        "CHAT_API_KEY": "ci-chat-key",
        "VIDEO_API_KEY": "ci-video-key",
    }
    env = {e["name"]: e for e in container(one("gpu", "Deployment", "gateway"), "gateway")["env"]}
    for key in GATEWAY_SECRET_KEYS:
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "ai-ai-stack-gateway", "key": key, "optional": True}


def test_gateway_keys_come_from_an_existing_secret() -> None:
    assert [s for s in of_kind("external-redis", "Secret") if s["metadata"]["name"].endswith("gateway")] == []
    env = {e["name"]: e for e in container(one("external-redis", "Deployment", "gateway"), "gateway")["env"]}
    for key in GATEWAY_SECRET_KEYS:
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "ai-gateway-keys", "key": key, "optional": True}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pika_api_key_only_in_the_secret(scenario: str) -> None:
    assert "VIDEO_API_KEY" not in one(scenario, "ConfigMap", "gateway")["data"]
    env = {e["name"]: e for e in container(one(scenario, "Deployment", "gateway"), "gateway")["env"]}
    assert set(env["VIDEO_API_KEY"]) == {"name", "valueFrom"}, "from a secretKeyRef, never a plain value"
    assert env["VIDEO_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True, "no key: image routes answer 503"


def test_gateway_public_url_is_the_ingress_host() -> None:
    assert one("gpu", "ConfigMap", "gateway")["data"]["GATEWAY_PUBLIC_URL"] == "https://ai.example.com"
    for scenario in ("default", "external-redis", "sqlite-tasks"):
        assert "GATEWAY_PUBLIC_URL" not in one(scenario, "ConfigMap", "gateway")["data"], "no ingress: poll"


def config_map_data(*args: str) -> dict[str, str]:
    result = helm("template", RELEASE, str(CHART), "--show-only", "templates/gateway-configmap.yaml", *args)
    assert result.returncode == 0, result.stderr
    data: dict[str, str] = yaml.safe_load(result.stdout)["data"]
    return data


def test_gateway_public_url_set_explicitly_wins() -> None:
    url = "https://hooks.example.org"
    assert config_map_data("--set", f"gateway.config.GATEWAY_PUBLIC_URL={url}")["GATEWAY_PUBLIC_URL"] == url
    with_ingress = ("--set", "ingress.enabled=true", "--set", "gateway.secrets.GATEWAY_API_KEYS=k")
    overridden = config_map_data(*with_ingress, "--set", f"gateway.extraConfig.GATEWAY_PUBLIC_URL={url}")
    assert overridden["GATEWAY_PUBLIC_URL"] == url
    wildcard = config_map_data(*with_ingress, "--set", "ingress.hosts[0].host=*.example.com")
    assert "GATEWAY_PUBLIC_URL" not in wildcard, "a wildcard host is no address fal can call"


def test_schema_rejects_a_public_url_without_scheme() -> None:
    result = helm("template", str(CHART), "--set", "gateway.config.GATEWAY_PUBLIC_URL=ai.example.com")
    assert result.returncode != 0
    assert "GATEWAY_PUBLIC_URL" in result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_task_database_folder_is_a_writable_volume(scenario: str) -> None:
    deployment = one(scenario, "Deployment", "gateway")
    path = PurePosixPath(one(scenario, "ConfigMap", "gateway")["data"]["TASKS_SQLITE_PATH"])
    assert path.is_absolute(), "the working directory is on the read-only root filesystem"
    mounts = {m["mountPath"]: m["name"] for m in container(deployment, "gateway")["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert set(volumes[mounts[str(path.parent)]]) & {"emptyDir", "persistentVolumeClaim"}


def test_task_database_without_redis_is_on_a_pvc_with_one_replica() -> None:
    deployment = one("sqlite-tasks", "Deployment", "gateway")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}, "one SQLite writer, RWO volume"
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["tasks"]["persistentVolumeClaim"] == {"claimName": "ai-ai-stack-gateway-tasks"}
    claim = one("sqlite-tasks", "PersistentVolumeClaim", "gateway-tasks")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "REDIS_URL" not in {e["name"] for e in container(deployment, "gateway")["env"]}


@pytest.mark.parametrize("scenario", ["default", "external-redis", "autoscaling-off"])
def test_task_database_with_redis_needs_no_pvc(scenario: str) -> None:
    assert [c for c in of_kind(scenario, "PersistentVolumeClaim") if c["metadata"]["name"].endswith("-tasks")] == []
    assert one(scenario, "Deployment", "gateway")["spec"]["strategy"]["type"] == "RollingUpdate"
    volumes = {v["name"]: v for v in one(scenario, "Deployment", "gateway")["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["tasks"], "unused with Redis, but the path stays writable"


def test_chart_refuses_a_task_pvc_for_several_replicas() -> None:
    sqlite_on_a_pvc = (
        *("--set", "redis.enabled=false", "--set", "gateway.taskStore.persistence.enabled=true"),
        *("--set", "gateway.autoscaling.allowWithoutRedis=true"),
    )
    for extra in ("gateway.replicaCount=1", "gateway.autoscaling.enabled=false"):  # the other one is still wrong
        result = helm("template", str(CHART), *sqlite_on_a_pvc, "--set", extra)
        assert result.returncode != 0
        assert "gateway.taskStore.persistence" in result.stderr


def test_chart_refuses_a_relative_task_database_path() -> None:
    result = helm("template", str(CHART), "--set", "gateway.extraConfig.TASKS_SQLITE_PATH=tasks.sqlite3")
    assert result.returncode != 0
    assert "gateway.extraConfig.TASKS_SQLITE_PATH: Does not match pattern '^/[^/].*/[^/]+$'" in result.stderr


@pytest.mark.parametrize(
    ("scenario", "secret", "key"),
    [
        ("default", "ai-ai-stack-redis", "REDIS_URL"),
        ("external-redis", "ai-redis", "url"),
        ("autoscaling-off", "ai-ai-stack-redis", "REDIS_URL"),
    ],
)
def test_gateway_gets_redis_url_either_way(scenario: str, secret: str, key: str) -> None:
    env = {e["name"]: e for e in container(one(scenario, "Deployment", "gateway"), "gateway")["env"]}
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
    bundled = [s for s in of_kind(scenario, "StatefulSet") if s["metadata"]["name"].endswith("redis")]
    assert len(bundled) == (1 if scenario == "default" else 0)


def test_bundled_redis_url_carries_its_password() -> None:
    secret = one("default", "Secret", "redis")["stringData"]
    assert secret["REDIS_URL"] == f"redis://:{secret['redis-password']}@ai-ai-stack-redis:6379/0"


def test_gateway_env_matches_the_settings_it_reads() -> None:
    expected = settings_env_names()
    for scenario in SCENARIOS:
        names = gateway_env_names(scenario) - {"REDIS_PASSWORD"}  # only expanded into REDIS_URL
        read = expected | set(renamed_variables())  # a secret's key may still carry a name from before 0.2
        assert names - read == set(), f"{scenario}: the chart sets variables the gateway does not read"
        missing = expected - names - UNSET_BY_DEFAULT - SET_WHERE_THEY_APPLY - {"REDIS_URL"}
        assert missing == set(), f"{scenario}: settings the chart cannot set: add them to gateway.config"
    documented = (CHART / "values.yaml").read_text()
    assert all(name in documented for name in UNSET_BY_DEFAULT), "document the unset ones under gateway.extraConfig"


def test_every_setting_is_in_the_configuration_doc() -> None:
    """values.yaml sends readers to docs/configuration.md for what each variable means."""
    document = (ROOT / "docs" / "configuration.md").read_text()
    missing = settings_env_names() - set(re.findall(r"`([A-Z][A-Z0-9_]+)`", document))
    assert missing == set(), f"{sorted(missing)} missing from docs/configuration.md: run python -m gateway.settings_doc"


def test_gateway_config_parses_as_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.settings import Settings

    for name in settings_env_names():
        monkeypatch.delenv(name, raising=False)
    for name, value in one("default", "ConfigMap", "gateway")["data"].items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.triton.url == "dns:///ai-ai-stack-triton-headless.ai.svc:8001"
    assert settings.server.http_port == 8080
    assert settings.server.grpc_port == 50051


def test_network_policy_lets_only_the_gateway_reach_triton_and_redis() -> None:
    gateway_labels = one("default", "Deployment", "gateway")["spec"]["selector"]["matchLabels"]
    gateway_peer = {"podSelector": {"matchLabels": gateway_labels}}
    for component, ports in (("triton", {"grpc"}), ("redis", {"redis"})):
        rules = one("default", "NetworkPolicy", component)["spec"]["ingress"]
        for rule in rules:
            rule_ports = {p["port"] for p in rule["ports"]}
            if rule_ports & ports:
                assert rule["from"] == [gateway_peer], component
                assert rule_ports == ports


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_network_policy_lets_webhooks_in_and_the_gateway_call_out(scenario: str) -> None:
    """fal's webhooks come in through the ingress on the HTTP port; the gateway calls fal and Hunyuan over HTTPS."""
    if not of_kind(scenario, "NetworkPolicy"):
        return
    policy = one(scenario, "NetworkPolicy", "gateway")["spec"]
    assert any({p["port"] for p in rule["ports"]} >= {"http"} for rule in policy["ingress"])
    assert any({p["port"] for p in rule["ports"]} == {443} for rule in policy["egress"])


def test_selectors_are_stable_labels() -> None:
    for workload in workloads("default"):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert "helm.sh/chart" not in selector and "app.kubernetes.io/version" not in selector
        assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}


def test_ingress_is_off_and_service_monitor_on_by_default() -> None:
    assert of_kind("default", "Ingress") == []
    assert len(of_kind("default", "ServiceMonitor")) == 2, "the autoscaler's pods metric needs the gateway scraped"


def test_ingress_streams_server_sent_events() -> None:
    ingress = one("gpu", "Ingress", "gateway")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"] == {"name": "http"}
    monitors = {m["metadata"]["name"]: m["spec"]["endpoints"][0]["port"] for m in of_kind("gpu", "ServiceMonitor")}
    assert monitors == {"ai-ai-stack-gateway": "http", "ai-ai-stack-triton": "metrics"}


def test_pod_disruption_budgets() -> None:
    assert one("default", "PodDisruptionBudget", "gateway")["spec"]["maxUnavailable"] == 1
    triton = one("default", "PodDisruptionBudget", "triton")["spec"]
    assert triton["minAvailable"] == 1 and "maxUnavailable" not in triton, "a drain always leaves one Triton"


def test_grafana_dashboard_shows_the_signals() -> None:
    data = next(m for m in of_kind("default", "ConfigMap") if m["metadata"]["name"].endswith("-dashboard"))["data"]
    dashboard = json.loads(data["ai-stack.json"])
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    for metric in (
        "gateway_http_request_duration_seconds_bucket",
        "http_requests_in_flight",
        "gateway_cache_lookups_total",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "gateway_embedding_batch_size",
        "gateway_chat_upstream_errors_total",
        "gateway_video_tasks{",
        "gateway_video_task_duration_seconds_bucket",
        "gateway_video_callbacks_total",
        "gateway_video_polls_total",
        "gateway_gpu_state{",
        "gateway_gpu_memory_used_ratio",
        "gateway_triton_in_flight_limit",
        "gateway_gpu_refusals_total",
    ):
        assert metric in exprs, metric


def test_dashboard_metrics_exist_in_the_gateway() -> None:
    from prometheus_client import REGISTRY

    import gateway.metrics  # noqa: F401  (declares every gateway_* metric)

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    declared = {f.name + suffix for f in REGISTRY.collect() for suffix in suffixes.get(f.type, [""])}
    dashboard = json.loads((CHART / "dashboards" / "ai-stack.json").read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    used = set(re.findall(r"\bgateway_[a-z_]+", exprs))
    assert used - declared == set(), "the dashboard queries metrics the gateway does not export"


def test_readme_parameter_tables_match_values() -> None:
    params = re.findall(r"^\s*## @param (\S+) (.*)$", (CHART / "values.yaml").read_text(), re.MULTILINE)
    rows = re.findall(r"^\| `([^`]+)` \| (.*) \| .* \|$", (CHART / "README.md").read_text(), re.MULTILINE)
    assert rows == params, "README.md's parameter tables drifted from the `## @param` lines of values.yaml"


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    documented = set(re.findall(r"^\s*## @param (\S+)", text, re.MULTILINE))

    def leaves(node: Any, path: str) -> list[str]:
        if isinstance(node, dict) and node:
            return [leaf for key, value in node.items() for leaf in leaves(value, f"{path}.{key}".lstrip("."))]
        return [path]

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:n]) in documented for n in range(1, len(parts) + 1))

    undocumented = [p for p in leaves(yaml.safe_load(text), "") if not covered(p)]
    assert undocumented == [], f"add `## @param` lines for {undocumented}"


@pytest.mark.parametrize("name", ["VIDEO_API_KEY", "CHAT_API_KEY"])
def test_chart_refuses_a_secret_in_the_config_map(name: str) -> None:
    result = helm("template", str(CHART), "--set", f"gateway.extraConfig.{name}=leak")
    assert result.returncode != 0
    assert f"{name} looks like a secret" in result.stderr


@pytest.mark.parametrize("name", ["SOME_DB_PASSWORD", "TRITON_TIMEOUT_SECOND"])
def test_chart_refuses_a_config_key_that_is_no_setting(name: str) -> None:
    for values in ("gateway.config", "gateway.extraConfig"):
        result = helm("template", str(CHART), "--set", f"{values}.{name}=1")
        assert result.returncode != 0 and f"Additional property {name} is not allowed" in result.stderr
