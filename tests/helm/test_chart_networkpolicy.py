"""NetworkPolicies: who reaches the gateway, and every component's egress on the ports of the URLs it is given
(the platform review of the chart). Each test renders the chart and reads the policies' peers and ports."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART, KUBERNETES_VERSIONS, RELEASE, helm

pytestmark = pytest.mark.slow

SAME_NAMESPACE: dict[str, Any] = {"podSelector": {}}
INGRESS_NGINX = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
KUBE_DNS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
NODE_LOCAL_DNS = {"ipBlock": {"cidr": "169.254.20.10/32"}}
ANYWHERE = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
DNS_PORTS = {(53, "UDP"), (53, "TCP")}
TRITON_PORTS = frozenset({8001, 8002})  # gRPC, and the metrics the GPU policy reads
# The ingress needs keys (the chart refuses an open gateway behind it).
WITH_KEYS = ("--set", "gateway.secrets.GATEWAY_API_KEYS=k")
EXTERNAL_REDIS = ("--set", "redis.enabled=false")
MILVUS = ("--set", "search.enabled=true", "--set")


def policies(*args: str) -> dict[str, dict[str, Any]]:
    """The specs of the rendered NetworkPolicies by component; each one also validated for Kubernetes 1.26+."""
    import kubernetes_validate

    result = helm("template", RELEASE, str(CHART), "--namespace", "ai", *args)
    assert result.returncode == 0, result.stderr
    found = {}
    for manifest in yaml.safe_load_all(result.stdout):
        if manifest and manifest["kind"] == "NetworkPolicy":
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(manifest, version, strict=True)
            found[manifest["metadata"]["name"].removeprefix(f"{RELEASE}-ai-stack-")] = manifest["spec"]
    return found


def ports(rule: dict[str, Any]) -> set[tuple[Any, str]]:
    return {(p["port"], p["protocol"]) for p in rule["ports"]}


def egress_by_port(spec: dict[str, Any]) -> dict[frozenset[Any], list[dict[str, Any]] | None]:
    """Each egress rule's peers (None: any address) by its set of ports."""
    rules = {frozenset(p for p, _ in ports(rule)): rule.get("to") for rule in spec["egress"]}
    assert len(rules) == len(spec["egress"]), "two egress rules on the same ports"
    return rules


def clients_from(spec: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Peers of the rule on the gateway's gRPC port (always with HTTP); None: no such rule."""
    found = [r for r in spec["ingress"] if ("grpc", "TCP") in ports(r)]
    assert len(found) <= 1
    if not found:
        return None
    assert ports(found[0]) == {("http", "TCP"), ("grpc", "TCP")}
    from_: list[dict[str, Any]] = found[0]["from"]
    return from_


def component_peer(component: str) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "ai-stack",
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/component": component,
            }
        }
    }


def test_default_lets_the_namespace_in_and_each_component_out_only_where_it_calls() -> None:
    found = policies()
    assert set(found) == {"gateway", "triton", "redis"}
    gateway = found["gateway"]
    assert gateway["policyTypes"] == ["Ingress", "Egress"]
    assert clients_from(gateway) == [SAME_NAMESPACE], "ingress off: in-cluster clients only, no ingress controller"
    assert egress_by_port(gateway) == {
        frozenset({53}): [KUBE_DNS, NODE_LOCAL_DNS],
        TRITON_PORTS: [component_peer("triton")],
        frozenset({6379}): [component_peer("redis")],
        frozenset({443}): ANYWHERE,  # TokenHub, fal's queue, Platform API and JWKS: all https
    }
    # Triton (models in its image) and Redis call out to nothing but DNS, or nothing at all.
    assert found["triton"]["policyTypes"] == ["Ingress", "Egress"]
    assert egress_by_port(found["triton"]) == {frozenset({53}): [KUBE_DNS, NODE_LOCAL_DNS]}
    assert found["redis"]["policyTypes"] == ["Ingress", "Egress"]
    assert found["redis"]["egress"] == []


def test_dns_is_udp_and_tcp_to_kube_dns_and_node_local_dns() -> None:
    found = policies()
    for component in ("gateway", "triton"):
        (dns,) = [r for r in found[component]["egress"] if 53 in {p for p, _ in ports(r)}]
        assert ports(dns) == DNS_PORTS, component
        assert NODE_LOCAL_DNS in dns["to"] and KUBE_DNS in dns["to"], component


def test_node_local_dns_address_is_a_value() -> None:
    found = policies("--set-json", 'networkPolicy.nodeLocalDnsCidrs=["169.254.0.53/32","10.96.0.10/32"]')
    expected = [KUBE_DNS, {"ipBlock": {"cidr": "169.254.0.53/32"}}, {"ipBlock": {"cidr": "10.96.0.10/32"}}]
    assert egress_by_port(found["gateway"])[frozenset({53})] == expected
    assert egress_by_port(found["triton"])[frozenset({53})] == expected
    without = policies("--set-json", "networkPolicy.nodeLocalDnsCidrs=[]")
    assert egress_by_port(without["gateway"])[frozenset({53})] == [KUBE_DNS]


def test_dns_to_any_address_when_dns_to_is_empty() -> None:
    found = policies("--set-json", "networkPolicy.dnsTo=[]")
    assert egress_by_port(found["gateway"])[frozenset({53})] is None, "no `to`: node-local DNS included"


def test_ingress_on_adds_the_controller_to_the_clients() -> None:
    found = policies(*WITH_KEYS, "--set", "ingress.enabled=true")
    assert clients_from(found["gateway"]) == [SAME_NAMESPACE, INGRESS_NGINX]
    grpc_only = policies(*WITH_KEYS, "--set", "ingress.grpc.enabled=true")
    assert clients_from(grpc_only["gateway"]) == [SAME_NAMESPACE, INGRESS_NGINX]


def test_clients_and_controller_are_values() -> None:
    custom = policies(
        *WITH_KEYS,
        "--set",
        "ingress.enabled=true",
        "--set-json",
        'networkPolicy.clientsFrom=[{"namespaceSelector":{"matchLabels":{"team":"search"}}}]',
        "--set-json",
        'networkPolicy.ingressFrom=[{"podSelector":{"matchLabels":{"a":"b"}}}]',
    )
    assert clients_from(custom["gateway"]) == [
        {"namespaceSelector": {"matchLabels": {"team": "search"}}},
        {"podSelector": {"matchLabels": {"a": "b"}}},
    ]
    only_controller = policies(
        *WITH_KEYS, "--set", "ingress.enabled=true", "--set-json", "networkPolicy.clientsFrom=[]"
    )
    assert clients_from(only_controller["gateway"]) == [INGRESS_NGINX]
    nobody = policies("--set-json", "networkPolicy.clientsFrom=[]")
    assert clients_from(nobody["gateway"]) is None, "no clients and no ingress: only the scrapers get in"


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("rediss://:password@redis.example.com:6380/0", 6380),
        ("rediss://:password@redis.example.com/0", 6379),
        ("redis://redis.example.svc", 6379),
        ("redis://[fd00::1]:6390/0", 6390),
    ],
)
def test_external_redis_port_comes_from_its_url(url: str, port: int) -> None:
    found = policies(*EXTERNAL_REDIS, "--set", f"redis.external.url={url}")
    assert "redis" not in found, "no bundled Redis, no policy for it"
    egress = egress_by_port(found["gateway"])
    assert egress[frozenset({port})] is None, "networkPolicy.externalTo is empty: any address on that port"
    assert set(egress) == {frozenset({53}), TRITON_PORTS, frozenset({port}), frozenset({443})}


def test_external_redis_in_a_secret_uses_the_fallback_port_and_external_to() -> None:
    found = policies(
        *EXTERNAL_REDIS,
        "--set",
        "redis.external.existingSecret=ai-redis",
        "--set",
        "networkPolicy.externalRedisPort=6380",
        "--set-json",
        'networkPolicy.externalTo=[{"ipBlock":{"cidr":"10.0.0.0/8"}}]',
    )
    assert egress_by_port(found["gateway"])[frozenset({6380})] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]


def test_no_redis_no_redis_egress() -> None:
    found = policies(*EXTERNAL_REDIS, "--set", "gateway.replicaCount=1", "--set", "gateway.autoscaling.enabled=false")
    assert set(egress_by_port(found["gateway"])) == {frozenset({53}), TRITON_PORTS, frozenset({443})}


@pytest.mark.parametrize(
    ("endpoint", "port"),
    [
        ("http://otel-collector.monitoring:4317", 4317),
        ("http://otel-collector.monitoring:4318", 4318),
        ("otel-collector.monitoring:4317", 4317),  # no scheme: the gRPC exporter's host:port form
        ("https://otlp.example.com", 443),  # no port: gRPC dials 443
    ],
)
def test_otlp_port_comes_from_the_endpoint(endpoint: str, port: int) -> None:
    found = policies(
        "--set",
        f"gateway.extraConfig.OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}",
        "--set-json",
        'networkPolicy.externalTo=[{"namespaceSelector":{}}]',
    )
    egress = [r for r in found["gateway"]["egress"] if r.get("to") == [{"namespaceSelector": {}}]]
    assert [ports(r) for r in egress] == [{(port, "TCP")}], "one rule towards networkPolicy.externalTo"


def test_no_otlp_endpoint_no_otlp_rule() -> None:
    found = policies("--set-json", 'networkPolicy.externalTo=[{"namespaceSelector":{}}]')
    assert not [r for r in found["gateway"]["egress"] if r.get("to") == [{"namespaceSelector": {}}]]


@pytest.mark.parametrize(
    ("uri", "port"),
    [
        ("http://milvus.milvus.svc:19531", 19531),
        ("http://milvus.milvus.svc", 19530),
        ("https://in01-abc.zillizcloud.com", 443),
    ],
)
def test_milvus_port_comes_from_its_uri(uri: str, port: int) -> None:
    found = policies(*MILVUS, f"search.milvus.uri={uri}")
    egress = found["gateway"]["egress"]
    assert [ports(r) for r in egress if "to" not in r] == [{(port, "TCP")}], "networkPolicy.externalTo: any address"
    assert len(egress) == 5, "DNS, Triton, Redis, Milvus, upstreams"


def test_milvus_uses_external_to() -> None:
    found = policies(
        *MILVUS,
        "search.milvus.uri=http://milvus.milvus.svc:19530",
        "--set-json",
        'networkPolicy.externalTo=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"milvus"}}}]',
    )
    peers = egress_by_port(found["gateway"])[frozenset({19530})]
    assert peers == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "milvus"}}}]


def test_upstream_ports_come_from_their_urls() -> None:
    found = policies(
        "--set",
        "gateway.config.CHAT_BASE_URL=http://hunyuan-mock.test.svc:8080/v1",
        "--set",
        r"gateway.config.CHAT_BACKUP_BASE_URLS=https://backup.example.com:8443/v1\, http://plain.example.com/v1",
        "--set",
        "gateway.config.VIDEO_PLATFORM_URL=",
        "--set",
        "gateway.extraConfig.VIDEO_WEBHOOK_JWKS_URL=https://jwks.example.com:9443/jwks.json",
    )
    (upstreams,) = [r for r in found["gateway"]["egress"] if r.get("to") == ANYWHERE]
    assert ports(upstreams) == {(p, "TCP") for p in (80, 443, 8080, 8443, 9443)}


def test_object_storage_models_let_triton_out_over_https() -> None:
    objects = ("--set", "triton.modelRepository.source=objectStorage")
    found = policies(*objects, "--set", "triton.modelRepository.objectStorage.uri=s3://ai-models/model_repository")
    assert egress_by_port(found["triton"]) == {frozenset({53}): [KUBE_DNS, NODE_LOCAL_DNS], frozenset({443}): ANYWHERE}
    minio = policies(*objects, "--set", "triton.modelRepository.objectStorage.uri=http://minio.minio.svc:9000/models")
    assert egress_by_port(minio["triton"])[frozenset({9000})] == ANYWHERE


def test_disabled_renders_no_policy() -> None:
    assert policies("--set", "networkPolicy.enabled=false") == {}
