"""The chart installed with its defaults serves traffic, scales both ways and survives a Triton restart (issue 28):
each point checked on the rendered manifests, and each refusal with the fix its message names."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from gateway.settings_schema import CHART_MANAGED
from tests.helm.test_chart import (
    CHART,
    MONITORED_CLUSTER,
    NAMED_LIKE_SECRETS,
    RELEASE,
    SCENARIOS,
    SECRET_LIKE,
    container,
    helm,
    of_kind,
    one,
    render,
)

pytestmark = pytest.mark.slow

NOT_READY_TRITON = ("--set", "triton.autoscaling.enabled=true")


def template(*args: str, cluster: tuple[str, ...] = MONITORED_CLUSTER) -> tuple[int, str, list[dict[str, Any]]]:
    result = helm("template", RELEASE, str(CHART), "--namespace", "ai", *cluster, *args)
    manifests = [m for m in yaml.safe_load_all(result.stdout) if m] if result.returncode == 0 else []
    return result.returncode, result.stderr, manifests


def refused(*args: str, cluster: tuple[str, ...] = MONITORED_CLUSTER) -> str:
    code, stderr, _ = template(*args, cluster=cluster)
    assert code != 0, f"helm template {' '.join(args)} was accepted"
    return stderr


def by_name(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == f"{RELEASE}-ai-stack-{name}")


def test_default_triton_serves_the_models_of_its_own_image() -> None:
    deployment = one("default", "Deployment", "triton")
    spec = deployment["spec"]["template"]["spec"]
    assert "models" not in {v["name"] for v in spec["volumes"]}, "no volume hides /models of the image"
    assert "--model-repository=/models" in container(deployment, "triton")["args"]
    assert [c for c in of_kind("default", "PersistentVolumeClaim") if "triton" in c["metadata"]["name"]] == []


def test_a_pvc_source_is_still_possible() -> None:
    code, stderr, manifests = template("--set", "triton.modelRepository.source=pvc", "--set", "triton.replicaCount=1")
    assert code == 0, stderr
    volumes = {v["name"]: v for v in by_name(manifests, "Deployment", "triton")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "ai-ai-stack-triton"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_triton_updates_need_no_spare_gpu(scenario: str) -> None:
    strategy = one(scenario, "Deployment", "triton")["spec"]["strategy"]
    assert strategy["type"] == "Recreate" or strategy["rollingUpdate"]["maxSurge"] == 0


@pytest.mark.parametrize(
    "extra",
    [("--set", "triton.replicaCount=2"), NOT_READY_TRITON],
)
def test_chart_refuses_several_tritons_on_a_read_write_once_volume(extra: tuple[str, str]) -> None:
    message = refused("--set", "triton.modelRepository.source=pvc", *extra)
    assert "ReadWriteOnce" in message and "ReadOnlyMany" in message and "source=image" in message


def test_several_tritons_share_a_read_only_many_volume() -> None:
    code, stderr, _ = template(
        "--set",
        "triton.modelRepository.source=pvc",
        "--set",
        "triton.modelRepository.pvc.accessModes={ReadOnlyMany}",
        *NOT_READY_TRITON,
    )
    assert code == 0, stderr


def test_production_values_run_two_tritons_at_least() -> None:
    hpa = one("gpu", "HorizontalPodAutoscaler", "triton")["spec"]
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] >= hpa["minReplicas"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pod_labels_carry_no_version(scenario: str) -> None:
    for workload in (m for m in render(scenario) if m["kind"] in {"Deployment", "StatefulSet"}):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert "helm.sh/chart" not in labels and "app.kubernetes.io/version" not in labels, workload["metadata"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pdbs_let_unhealthy_pods_go(scenario: str) -> None:
    for pdb in of_kind(scenario, "PodDisruptionBudget"):
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in {"autoscaling-off", "sqlite-tasks"}])
def test_the_pods_metric_comes_with_a_scrape_of_the_gateway(scenario: str) -> None:
    gateway_service = one(scenario, "Service", "gateway")
    monitor = one(scenario, "ServiceMonitor", "gateway")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= gateway_service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] == "http" and monitor["endpoints"][0]["path"] == "/metrics"


def test_chart_refuses_the_pods_metric_without_a_scrape() -> None:
    message = refused("--set", "serviceMonitor.enabled=false")
    assert "serviceMonitor.enabled=true" in message and "metricsAdapter.mode=none" in message
    code, stderr, _ = template("--set", "serviceMonitor.enabled=false", "--set", "serviceMonitor.scrapedOtherwise=true")
    assert code == 0, stderr
    code, stderr, _ = template("--set", "serviceMonitor.enabled=false", "--set", "metricsAdapter.mode=none")
    assert code == 0, stderr


def test_adapter_rules_are_prometheus_adapters_own_config() -> None:
    code, stderr, manifests = template("--set", "metricsAdapter.prometheusAdapter.namespace=monitoring")
    assert code == 0, stderr
    rules = by_name(manifests, "ConfigMap", "adapter-rules")
    assert rules["metadata"]["namespace"] == "monitoring", "where the adapter chart's rules.existing finds it"
    config = yaml.safe_load(rules["data"]["config.yaml"])
    assert {"seriesQuery", "resources", "name", "metricsQuery"} <= set(config["rules"][0])


def test_keda_trigger_has_no_removed_field_and_filters_on_labels_that_exist() -> None:
    prometheus = next(
        t for t in one("keda", "ScaledObject", "gateway")["spec"]["triggers"] if t["type"] == "prometheus"
    )
    assert "metricName" not in prometheus["metadata"], "removed in KEDA 2.12"
    query = prometheus["metadata"]["query"]
    assert set(re.findall(r"(\w+)=~?\"", query)) == {"namespace", "pod"}
    assert 'pod=~"ai-ai-stack-gateway-[a-z0-9]+-[a-z0-9]+"' in query


def test_gateway_rolls_when_the_redis_password_changes() -> None:
    def redis_checksum(*args: str) -> str:
        code, stderr, manifests = template(*args)
        assert code == 0, stderr
        pod = by_name(manifests, "Deployment", "gateway")["spec"]["template"]["metadata"]
        return str(pod["annotations"]["checksum/redis"])

    assert redis_checksum("--set", "redis.auth.password=one") == redis_checksum("--set", "redis.auth.password=one")
    assert redis_checksum("--set", "redis.auth.password=one") != redis_checksum("--set", "redis.auth.password=two")
    external = ("--set", "redis.enabled=false", "--set", "redis.external.url=redis://:a@r:6379/0")
    changed = ("--set", "redis.enabled=false", "--set", "redis.external.url=redis://:b@r:6379/0")
    assert redis_checksum(*external) != redis_checksum(*changed)


def test_bundled_redis_password_from_an_existing_secret() -> None:
    assert [s for s in of_kind("gpu", "Secret") if s["metadata"]["name"].endswith("-redis")] == [], "none generated"
    env = {e["name"]: e for e in container(one("gpu", "Deployment", "gateway"), "gateway")["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ai-redis-password", "key": "redis-password"}
    assert env["REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@ai-ai-stack-redis:6379/0"
    assert list(env).index("REDIS_PASSWORD") < list(env).index("REDIS_URL"), "Kubernetes expands earlier variables"
    redis = container(one("gpu", "StatefulSet", "redis"), "redis")
    for variable in redis["env"]:
        assert variable["valueFrom"]["secretKeyRef"]["name"] == "ai-redis-password"


def test_a_set_password_renders_the_same_every_time() -> None:
    renders = [template("--set", "redis.auth.password=fixed")[2] for _ in range(2)]
    secrets = [by_name(r, "Secret", "redis")["stringData"] for r in renders]
    assert secrets[0] == secrets[1] and secrets[0]["redis-password"] == "fixed"


def test_triton_is_reached_through_a_headless_service_round_robin() -> None:
    headless = one("default", "Service", "triton-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert [p["port"] for p in headless["ports"]] == [8001]
    url = one("default", "ConfigMap", "gateway")["data"]["TRITON_URL"]
    assert url == "dns:///ai-ai-stack-triton-headless.ai.svc:8001"
    from gateway.upstreams.triton import CHANNEL_ARGS

    assert ("grpc.lb_policy_name", "round_robin") in CHANNEL_ARGS


def test_gateway_grpc_connections_age_and_http_keep_alive_outlives_the_proxy() -> None:
    data = one("gpu", "ConfigMap", "gateway")["data"]
    assert float(data["GATEWAY_GRPC_MAX_CONNECTION_AGE_SECONDS"]) > 0
    assert float(data["GATEWAY_KEEPALIVE_SECONDS"]) > 60, "above ingress-nginx's upstream keep-alive"
    message = refused("--set", "ingress.enabled=true", "--set-string", "gateway.config.GATEWAY_KEEPALIVE_SECONDS=30")
    assert "GATEWAY_KEEPALIVE_SECONDS" in message and "ingress.upstreamKeepaliveSeconds" in message


def test_termination_grace_lets_a_chat_stream_finish() -> None:
    deployment = one("default", "Deployment", "gateway")
    data = one("default", "ConfigMap", "gateway")["data"]
    assert float(data["GATEWAY_SHUTDOWN_GRACE_SECONDS"]) >= float(data["CHAT_TOTAL_TIMEOUT_SECONDS"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(data["GATEWAY_SHUTDOWN_GRACE_SECONDS"])
    message = refused("--set", "gateway.terminationGracePeriodSeconds=60")
    assert "gateway.terminationGracePeriodSeconds" in message


def policy_rules(scenario: str, name: str) -> dict[str, Any]:
    policy = one(scenario, "NetworkPolicy", name)["spec"]
    return {"types": policy["policyTypes"], "ingress": policy.get("ingress", []), "egress": policy.get("egress", [])}


def ports_of(rule: dict[str, Any]) -> set[Any]:
    return {p["port"] for p in rule["ports"]}


def test_gateway_network_policy_in_from_the_namespace_out_to_what_it_calls() -> None:
    rules = policy_rules("default", "gateway")
    assert rules["types"] == ["Ingress", "Egress"]
    (clients,) = [r for r in rules["ingress"] if "grpc" in ports_of(r)]
    assert clients["from"] == [{"podSelector": {}}], "ingress off: the release's namespace, no ingress controller"
    egress = {frozenset(ports_of(r)): r for r in rules["egress"]}
    triton = frozenset({8001, 8002})  # gRPC, and the metrics the GPU policy reads
    assert set(egress) == {frozenset({53}), triton, frozenset({6379}), frozenset({443})}
    assert egress[triton]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "triton"
    assert egress[frozenset({6379})]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"


def test_ingress_controller_selector_is_configurable() -> None:
    code, stderr, manifests = template(
        "--set",
        "ingress.enabled=true",
        "--set",
        "gateway.secrets.GATEWAY_API_KEYS=k",
        "--set-json",
        'networkPolicy.ingressFrom=[{"podSelector":{"matchLabels":{"a":"b"}}}]',
    )
    assert code == 0, stderr
    ingress = by_name(manifests, "NetworkPolicy", "gateway")["spec"]["ingress"]
    assert ingress[0]["from"] == [{"podSelector": {}}, {"podSelector": {"matchLabels": {"a": "b"}}}]


def test_gateway_egress_to_milvus_and_an_external_redis() -> None:
    code, stderr, manifests = template(
        "-f",
        str(CHART / "ci" / "external-redis-values.yaml"),
        "--set",
        "search.enabled=true",
        "--set",
        "search.milvus.uri=https://milvus.example.com:19531",
    )
    assert code == 0, stderr
    egress = by_name(manifests, "NetworkPolicy", "gateway")["spec"]["egress"]
    assert {frozenset(ports_of(r)) for r in egress} == {
        frozenset({53}),
        frozenset({8001, 8002}),
        frozenset({6379}),
        frozenset({19531}),
        frozenset({443}),
    }


def test_triton_accepts_only_grpc_from_the_gateway() -> None:
    for rule in policy_rules("default", "triton")["ingress"]:
        assert "http" not in ports_of(rule), "the gateway uses 8001 (and 8002, the metrics) only"


def test_search_with_milvus_gets_its_uri_and_token_from_a_secret() -> None:
    code, stderr, manifests = template(
        "--set",
        "search.enabled=true",
        "--set",
        "search.milvus.uri=http://milvus.m.svc:19530",
        "--set",
        "search.milvus.token=milvus-token",
    )
    assert code == 0, stderr
    assert by_name(manifests, "ConfigMap", "gateway")["data"]["SEARCH_MILVUS_URI"] == "http://milvus.m.svc:19530"
    assert by_name(manifests, "Secret", "gateway")["stringData"]["SEARCH_MILVUS_TOKEN"] == "milvus-token"
    env = {e["name"]: e for e in container(by_name(manifests, "Deployment", "gateway"), "gateway")["env"]}
    assert env["SEARCH_MILVUS_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "SEARCH_MILVUS_TOKEN"
    code, stderr, manifests = template(
        "--set",
        "search.enabled=true",
        "--set",
        "search.milvus.uri=http://milvus.m.svc:19530",
        "--set",
        "search.milvus.existingSecret=milvus",
        "--set",
        "search.milvus.existingSecretKey=token",
    )
    env = {e["name"]: e for e in container(by_name(manifests, "Deployment", "gateway"), "gateway")["env"]}
    assert env["SEARCH_MILVUS_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "milvus", "key": "token"}


def test_search_is_off_unless_enabled_and_on_with_its_store_when_enabled() -> None:
    """The default chart turns search off (no store opened, 503 `search_disabled`), rather than leaving each
    replica the gateway's default: an embedded store of its own under a relative path."""
    code, stderr, manifests = template()
    assert code == 0, stderr
    data = by_name(manifests, "ConfigMap", "gateway")["data"]
    assert data["SEARCH_ENABLED"] == "false"
    assert "SEARCH_PATH" not in data and "SEARCH_MILVUS_URI" not in data
    code, stderr, manifests = template("--set", "search.enabled=true", "--set", "search.milvus.uri=http://m:19530")
    assert code == 0, stderr
    data = by_name(manifests, "ConfigMap", "gateway")["data"]
    assert data["SEARCH_ENABLED"] == "true" and data["SEARCH_MILVUS_URI"] == "http://m:19530"
    assert "SEARCH_ENABLED" in refused("--set-json", 'gateway.config={"SEARCH_ENABLED": "true"}')


def test_embedded_search_is_refused_for_several_replicas() -> None:
    message = refused("--set", "search.enabled=true")
    assert "search.milvus.uri" in message and "other replicas would not see it" in message
    one_pod = ("--set", "gateway.autoscaling.enabled=false", "--set", "gateway.replicaCount=1")
    code, stderr, manifests = template("--set", "search.enabled=true", *one_pod)
    assert code == 0, stderr
    assert by_name(manifests, "ConfigMap", "gateway")["data"]["SEARCH_PATH"] == "/var/lib/gateway/search"
    assert "search.path" in refused("--set", "search.enabled=true", "--set", "search.path=/srv/search", *one_pod)


def test_chart_refuses_autoscaling_without_redis_unless_told() -> None:
    message = refused("--set", "redis.enabled=false")
    assert "gateway.autoscaling.allowWithoutRedis=true" in message and "redis.enabled=true" in message
    allowed = ("--set", "redis.enabled=false", "--set", "gateway.autoscaling.allowWithoutRedis=true")
    assert template(*allowed)[0] == 0


def test_grpc_ingress_speaks_grpc_to_the_grpc_port() -> None:
    ingress = one("gpu", "Ingress", "gateway-grpc")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "grpc.ai.example.com" != one("gpu", "Ingress", "gateway")["spec"]["rules"][0]["host"]
    assert rule["http"]["paths"][0]["backend"]["service"]["port"] == {"name": "grpc"}


def test_service_account_for_workload_identity() -> None:
    (account,) = of_kind("external-redis", "ServiceAccount")
    assert account["metadata"]["name"] == "ai-ai-stack" and account["automountServiceAccountToken"] is False
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    for component in ("gateway", "triton"):
        pod = one("external-redis", "Deployment", component)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "ai-ai-stack" and pod["automountServiceAccountToken"] is False
    code, stderr, manifests = template("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=shared")
    assert code == 0, stderr
    assert [m for m in manifests if m["kind"] == "ServiceAccount"] == []
    assert by_name(manifests, "Deployment", "triton")["spec"]["template"]["spec"]["serviceAccountName"] == "shared"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--set", "gateway.pdb.maxUnavailable=0"), "maxUnavailable"),
        (("--set", "triton.pdb.maxUnavailable=0%"), "maxUnavailable"),
        (("--set", "gateway.readinessProbe.periodSeconds=0"), "periodSeconds"),
        (("--set", "triton.startupProbe.failureThreshold=0"), "failureThreshold"),
        (("--set", "gateway.config.GATEWAY_MAX_IN_FLIGT=10"), "GATEWAY_MAX_IN_FLIGT"),
        (("--set", "gateway.autoscaling.minReplicas=30"), "minReplicas"),
        (("--set", "triton.autoscaling.enabled=true", "--set", "triton.autoscaling.minReplicas=5"), "minReplicas"),
    ],
)
def test_schema_and_checks_refuse_bad_values(args: tuple[str, ...], named: str) -> None:
    assert named in refused(*args)


def test_a_percentage_is_a_valid_max_unavailable() -> None:
    assert template("--set", "gateway.pdb.maxUnavailable=25%")[0] == 0


def test_gateway_config_schema_is_generated_from_the_settings() -> None:
    """gateway.config and extraConfig refuse misspelt keys and ill-typed values: their schema is generated from the
    settings classes (`python -m gateway.settings_schema`), and a setting added or removed since fails here."""
    import json

    from gateway.settings import all_environment_variables, renamed_variables
    from gateway.settings_schema import SCHEMA, rendered

    text = SCHEMA.read_text()
    assert text == rendered(text), "run `python -m gateway.settings_schema`"
    config = json.loads(text)["definitions"]["gatewayConfig"]
    properties, renamed = config["properties"], renamed_variables()
    assert config["additionalProperties"] is False and set(properties) == all_environment_variables() | set(renamed)
    for old, new in renamed.items():  # a values file of 0.1 still installs, its settings typed as before
        assert properties[old] == {
            **properties[new],
            "deprecated": True,
            "description": f"Renamed {new}; read until 0.3.",
        }
    typed = {name for name in all_environment_variables() if properties[name]}
    passed = all_environment_variables() - CHART_MANAGED
    assert typed == {n for n in passed if not SECRET_LIKE.search(n) or n in NAMED_LIKE_SECRETS}


@pytest.mark.parametrize("flag", ["--set", "--set-string", "--set-json"])
def test_a_number_setting_takes_a_number_or_a_numeric_string(flag: str) -> None:
    code, stderr, manifests = template(flag, "gateway.config.GATEWAY_MAX_IN_FLIGHT=512")
    assert code == 0, stderr
    assert by_name(manifests, "ConfigMap", "gateway")["data"]["GATEWAY_MAX_IN_FLIGHT"] == "512"


def test_a_setting_of_the_wrong_type_is_refused() -> None:
    assert "gateway.config.GATEWAY_MAX_IN_FLIGHT" in refused("--set", "gateway.config.GATEWAY_MAX_IN_FLIGHT=abc")
    assert "gateway.extraConfig.TRITON_TIMEOUT_SECONDS" in refused(
        "--set", "gateway.extraConfig.TRITON_TIMEOUT_SECONDS=soon"
    )
    assert "REDIS_TIMEOUT_SECONDS" in refused("--set", "gateway.config.REDIS_TIMEOUT_SECONDS=1.5.2")
    assert template("--set", "gateway.config.REDIS_TIMEOUT_SECONDS=0.5")[0] == 0
