"""The chart through restarts, rollouts and installs on clusters of every kind: search's index on a volume that
outlives the pod, Triton's drain and replicas, monitoring that renders only where the cluster has it, and a published
gateway refused without keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART, KUBERNETES_VERSIONS, MONITORED_CLUSTER, RELEASE, container, helm
from tests.helm.test_chart_operations import by_name, refused, template

pytestmark = pytest.mark.slow

ONE_POD = ("--set", "gateway.autoscaling.enabled=false", "--set", "gateway.replicaCount=1")
EMBEDDED_SEARCH = ("--set", "search.enabled=true", *ONE_POD)
BARE_CLUSTER: tuple[str, ...] = ()  # no --api-versions: helm's discovery finds no monitoring stack
KEYS = ("--set", "gateway.secrets.GATEWAY_API_KEYS=k1")


def rendered(*args: str, cluster: tuple[str, ...] = MONITORED_CLUSTER) -> list[dict[str, Any]]:
    code, stderr, manifests = template(*args, cluster=cluster)
    assert code == 0, stderr
    return manifests


def pod_spec(manifests: list[dict[str, Any]], component: str) -> dict[str, Any]:
    spec: dict[str, Any] = by_name(manifests, "Deployment", component)["spec"]["template"]["spec"]
    return spec


def volumes(manifests: list[dict[str, Any]], component: str) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(manifests, component)["volumes"]}


def notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` would print it: rendered through a copy of the chart in which a ConfigMap
    carries it (helm template renders no NOTES, and helm install needs a cluster)."""
    chart = tmp_path / "chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
        (chart / "templates" / "notes-as-configmap.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
            '  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
        )
    result = helm("template", RELEASE, str(chart), "--show-only", "templates/notes-as-configmap.yaml", *args)
    assert result.returncode == 0, result.stderr
    text: str = yaml.safe_load(result.stdout)["data"]["notes"]
    return text


# -- search's index and the usage spool --------------------------------------------------------------------------


def test_the_embedded_search_store_keeps_its_collections_on_a_volume_that_outlives_the_pod() -> None:
    manifests = rendered(*EMBEDDED_SEARCH, "--set", "search.persistence.storageClass=fast")
    claim = by_name(manifests, "PersistentVolumeClaim", "gateway-data")
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert claim["spec"]["storageClassName"] == "fast" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", "an uninstall keeps the index"
    gateway = by_name(manifests, "Deployment", "gateway")
    assert gateway["spec"]["strategy"] == {"type": "Recreate"}, "the old pod lets the volume go first"
    assert volumes(manifests, "gateway")["tasks"]["persistentVolumeClaim"]["claimName"] == "ai-ai-stack-gateway-data"
    mounts = {m["name"]: m["mountPath"] for m in container(gateway, "gateway")["volumeMounts"]}
    config = by_name(manifests, "ConfigMap", "gateway")["data"]
    for path in (config["SEARCH_PATH"], config["GATEWAY_USAGE_SPOOL_PATH"]):
        assert path.startswith(mounts["tasks"] + "/"), f"{path} is on the claim"


def test_the_embedded_store_without_persistence_is_an_empty_dir_and_an_existing_claim_is_used() -> None:
    manifests = rendered(*EMBEDDED_SEARCH, "--set", "search.persistence.enabled=false")
    assert "emptyDir" in volumes(manifests, "gateway")["tasks"]
    assert [m for m in manifests if m["kind"] == "PersistentVolumeClaim"] == []
    manifests = rendered(*EMBEDDED_SEARCH, "--set", "search.persistence.existingClaim=my-index")
    assert volumes(manifests, "gateway")["tasks"]["persistentVolumeClaim"]["claimName"] == "my-index"
    assert [m for m in manifests if m["kind"] == "PersistentVolumeClaim"] == [], "the chart creates none"


def test_the_embedded_store_refuses_autoscaling_and_milvus_takes_any_number_of_replicas() -> None:
    message = refused("--set", "search.enabled=true", "--set", "gateway.replicaCount=1")  # autoscaling on
    assert "other replicas would not see it" in message
    manifests = rendered("--set", "search.enabled=true", "--set", "search.milvus.uri=http://milvus:19530")
    assert [m for m in manifests if m["kind"] == "PersistentVolumeClaim"] == []
    assert by_name(manifests, "Deployment", "gateway")["spec"]["strategy"]["type"] == "RollingUpdate"
    assert by_name(manifests, "HorizontalPodAutoscaler", "gateway")["spec"]["maxReplicas"] == 20


def test_the_task_database_claim_stays_the_volume_when_search_is_turned_on() -> None:
    """Without Redis the task database's PVC is the gateway's volume; turning the embedded store on must not move
    the gateway to another claim (its tasks would stay behind)."""
    no_redis = ("--set", "redis.enabled=false", "--set", "gateway.taskStore.persistence.enabled=true", *ONE_POD)
    manifests = rendered(*no_redis, "--set", "search.enabled=true")
    claims = [m["metadata"]["name"] for m in manifests if m["kind"] == "PersistentVolumeClaim"]
    assert claims == ["ai-ai-stack-gateway-tasks"]
    assert volumes(manifests, "gateway")["tasks"]["persistentVolumeClaim"]["claimName"] == "ai-ai-stack-gateway-tasks"


def test_each_replica_can_keep_its_usage_spool_on_a_claim_of_its_own() -> None:
    manifests = rendered("--set", "gateway.usageSpool.persistence.enabled=true", "--set",
                         "gateway.usageSpool.persistence.storageClass=fast")  # fmt: skip
    gateway = by_name(manifests, "StatefulSet", "gateway")
    assert [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-gateway")] == []
    (claim,) = gateway["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "tasks" and claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "tasks" not in {v["name"] for v in gateway["spec"]["template"]["spec"]["volumes"]}, (
        "the claim template is the volume"
    )
    mounts = {m["name"]: m["mountPath"] for m in container(gateway, "gateway")["volumeMounts"]}
    spool = by_name(manifests, "ConfigMap", "gateway")["data"]["GATEWAY_USAGE_SPOOL_PATH"]
    assert spool.startswith(mounts["tasks"] + "/")
    target = by_name(manifests, "HorizontalPodAutoscaler", "gateway")["spec"]["scaleTargetRef"]
    assert target["kind"] == "StatefulSet" and gateway["spec"]["podManagementPolicy"] == "Parallel"
    import kubernetes_validate

    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(gateway, version, strict=True)
    # One replica with a PVC already keeps its spool there: no StatefulSet.
    one = rendered(*EMBEDDED_SEARCH, "--set", "gateway.usageSpool.persistence.enabled=true")
    assert by_name(one, "Deployment", "gateway")["spec"]["strategy"] == {"type": "Recreate"}


# -- Triton: replicas, drain, disruption budget, TensorRT's cache --------------------------------------------------


def test_triton_runs_two_replicas_on_gpus_and_one_on_cpus_unless_told() -> None:
    assert by_name(rendered(), "Deployment", "triton")["spec"]["replicas"] == 2
    assert by_name(rendered("--set", "cpuOnly=true"), "Deployment", "triton")["spec"]["replicas"] == 1
    assert by_name(rendered("--set", "triton.replicaCount=3"), "Deployment", "triton")["spec"]["replicas"] == 3
    budget = by_name(rendered("--set", "cpuOnly=true"), "PodDisruptionBudget", "triton")["spec"]
    assert budget["minAvailable"] == 1, "a drain never takes the last Triton"
    budget = by_name(rendered("--set", "triton.pdb.minAvailable=null", "--set", "triton.pdb.maxUnavailable=1"),
                     "PodDisruptionBudget", "triton")["spec"]  # fmt: skip
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget


def test_triton_drains_before_sigterm_within_its_grace_period() -> None:
    triton = by_name(rendered(), "Deployment", "triton")
    hook = container(triton, "triton")["lifecycle"]["preStop"]["exec"]["command"]
    script = hook[-1]
    assert hook[:2] == ["python3", "-c"] and '"/tmp/draining"' in script, "readiness fails first"
    assert "time.sleep(15)" in script and "+ 20" in script and "nv_inference_pending_request_count" in script
    assert triton["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 90
    message = refused("--set", "triton.terminationGracePeriodSeconds=60")
    assert "must exceed triton.preStop.unreadySeconds + inFlightWaitSeconds + 30" in message and "= 65" in message


def test_the_tensorrt_engine_cache_is_writable_on_gpus(tmp_path: Path) -> None:
    pbtxt = (
        Path(__file__).resolve().parents[2] / "model_repository/bge_onnx/configs/onnxruntime_gpu.pbtxt"
    ).read_text()
    assert 'key: "trt_engine_cache_path"\n        value: "/var/cache/tensorrt"' in pbtxt
    gpu = rendered()
    mounts = {
        m["name"]: m["mountPath"] for m in container(by_name(gpu, "Deployment", "triton"), "triton")["volumeMounts"]
    }
    assert mounts["tensorrt-cache"] == "/var/cache/tensorrt"
    assert volumes(gpu, "triton")["tensorrt-cache"]["emptyDir"]["sizeLimit"] == "4Gi"
    assert "tensorrt-cache" not in volumes(rendered("--set", "cpuOnly=true"), "triton"), "no TensorRT on CPUs"


# -- monitoring --------------------------------------------------------------------------------------------------


def test_a_bare_cluster_gets_no_monitoring_objects_and_an_hpa_on_cpu(tmp_path: Path) -> None:
    manifests = rendered(cluster=BARE_CLUSTER)
    assert [m["kind"] for m in manifests if m["kind"] == "ServiceMonitor"] == []
    assert [m for m in manifests if m["metadata"]["name"].endswith("-adapter-rules")] == []
    metrics = by_name(manifests, "HorizontalPodAutoscaler", "gateway")["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Resource"], "a missing pods metric would keep the HPA from scaling down"
    text = notes(tmp_path)
    assert "on CPU alone: the pods metric http_requests_in_flight is not available" in text
    assert "no prometheus-adapter found on the cluster" in text


def test_a_cluster_with_the_monitoring_stack_gets_service_monitors_and_the_pods_metric(tmp_path: Path) -> None:
    manifests = rendered()  # the monitored cluster
    monitors = [m for m in manifests if m["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2 and all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors)
    rules = next(m for m in manifests if m["metadata"]["name"].endswith("-adapter-rules"))
    assert rules["metadata"]["namespace"] == "monitoring"
    metrics = by_name(manifests, "HorizontalPodAutoscaler", "gateway")["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Resource", "Pods"]
    apis = (
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "--api-versions",
        "custom.metrics.k8s.io/v1beta1",
    )
    assert "on CPU and http_requests_in_flight via an HPA" in notes(tmp_path, *apis)


def test_monitoring_true_renders_it_for_pipelines_that_see_no_cluster_and_false_renders_none() -> None:
    forced = rendered("--set", "serviceMonitor.enabled=true", cluster=BARE_CLUSTER)
    assert len([m for m in forced if m["kind"] == "ServiceMonitor"]) == 2
    assert "Pods" in [m["type"] for m in by_name(forced, "HorizontalPodAutoscaler", "gateway")["spec"]["metrics"]]
    keda = rendered("--set", "metricsAdapter.mode=keda", cluster=BARE_CLUSTER)
    assert [m["kind"] for m in keda if m["kind"] in {"ScaledObject", "HorizontalPodAutoscaler"}] == [
        "HorizontalPodAutoscaler"
    ], "without KEDA's CRD the chart's own HPA scales on CPU"
    message = refused("--set", "serviceMonitor.enabled=false")
    assert "exists only if Prometheus scrapes the gateway" in message
    off = rendered("--set", "serviceMonitor.enabled=false", "--set", "metricsAdapter.mode=none")
    assert [m for m in off if m["kind"] == "ServiceMonitor"] == []


def test_triton_autoscaling_is_refused_without_its_pods_metric() -> None:
    message = refused("--set", "triton.autoscaling.enabled=true", cluster=BARE_CLUSTER)
    assert "triton_queue_duration_us_per_request" in message
    assert by_name(rendered("--set", "triton.autoscaling.enabled=true"), "HorizontalPodAutoscaler", "triton")


# -- a published gateway without keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "published",
    [
        ("--set", "ingress.enabled=true"),
        ("--set", "ingress.grpc.enabled=true"),
        ("--set", "gateway.service.type=LoadBalancer"),
        ("--set", "gateway.service.type=NodePort"),
    ],
)
def test_a_published_gateway_without_keys_is_refused(published: tuple[str, str]) -> None:
    message = refused(*published)
    assert "publishes the gateway with no API keys" in message and "gateway.allowUnauthenticated=true" in message
    assert rendered(*published, "--set", "gateway.allowUnauthenticated=true")


@pytest.mark.parametrize(
    "keys",
    [
        KEYS,
        ("--set", "gateway.existingSecret=my-keys"),
        ("--set", "gateway.keys.existingSecret=my-keys-file"),
        ("--set", "gateway.keys.file=keys: []"),
    ],
)
def test_a_published_gateway_with_keys_from_any_source_is_rendered(keys: tuple[str, str]) -> None:
    assert rendered("--set", "ingress.enabled=true", *keys)


def test_an_unpublished_open_gateway_is_rendered_with_a_warning(tmp_path: Path) -> None:
    assert rendered()
    assert "every route is open" in notes(tmp_path)
    assert "every route is open" not in notes(tmp_path, *KEYS)


def test_the_schema_takes_the_new_values_and_refuses_wrong_ones() -> None:
    assert "serviceMonitor.enabled" in refused("--set", "serviceMonitor.enabled=sometimes")
    assert refused("--set", "search.persistence.size=10")
    assert refused("--set", "gateway.allowUnauthenticated=yes")
    assert json.loads((CHART / "values.schema.json").read_text())["properties"]["search"]["properties"]["persistence"]


# -- what a shared production cluster asks of a chart ---------------------------------------------------------------

DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_images_can_be_pinned_by_digest() -> None:
    manifests = rendered("--set", f"gateway.image.digest={DIGEST}", "--set", f"triton.image.digest={DIGEST}",
                         "--set", f"redis.image.digest={DIGEST}")  # fmt: skip
    images = [container(by_name(manifests, kind, name), name)["image"] for kind, name in
              (("Deployment", "gateway"), ("Deployment", "triton"), ("StatefulSet", "redis"))]  # fmt: skip
    assert images == [f"ghcr.io/example/ai-gateway:0.2.0@{DIGEST}", f"ghcr.io/example/ai-triton:0.2.0@{DIGEST}",
                      f"redis:7.4.2-alpine@{DIGEST}"]  # fmt: skip
    assert "gateway.image.digest" in refused("--set", "gateway.image.digest=latest")


def test_extra_env_volumes_and_mounts_reach_the_gateway_and_triton() -> None:
    extra = []
    for component in ("gateway", "triton"):
        extra += [
            "--set-json", f'{component}.extraEnv=[{{"name": "EXTRA", "value": "{component}"}}]',
            "--set-json", f'{component}.extraVolumes=[{{"name": "extra", "emptyDir": {{}}}}]',
            "--set-json", f'{component}.extraVolumeMounts=[{{"name": "extra", "mountPath": "/extra"}}]',
        ]  # fmt: skip
    manifests = rendered(*extra)
    for component in ("gateway", "triton"):
        spec = container(by_name(manifests, "Deployment", component), component)
        assert {"name": "EXTRA", "value": component} in spec["env"]
        assert {"name": "extra", "mountPath": "/extra"} in spec["volumeMounts"]
        assert volumes(manifests, component)["extra"] == {"name": "extra", "emptyDir": {}}


def test_triton_spreads_over_nodes_and_takes_a_priority_class() -> None:
    spec = pod_spec(rendered("--set", "triton.priorityClassName=gpu-serving"), "triton")
    assert spec["priorityClassName"] == "gpu-serving"
    spread = {c["topologyKey"]: c["whenUnsatisfiable"] for c in spec["topologySpreadConstraints"]}
    assert spread == {"kubernetes.io/hostname": "ScheduleAnyway", "topology.kubernetes.io/zone": "ScheduleAnyway"}
    own = '[{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]'
    spec = pod_spec(rendered("--set-json", f"triton.topologySpreadConstraints={own}"), "triton")
    assert [c["whenUnsatisfiable"] for c in spec["topologySpreadConstraints"]] == ["DoNotSchedule"]


def test_redis_has_room_for_an_append_only_file_rewrite() -> None:
    redis = container(by_name(rendered(), "StatefulSet", "redis"), "redis")
    assert redis["resources"]["limits"]["memory"] == "1280Mi" and "512mb" in redis["args"]
    message = refused("--set", "redis.resources.limits.memory=768Mi")
    assert "must be at least twice redis.maxmemory (512mb)" in message
    assert rendered("--set", "redis.resources.limits.memory=768Mi", "--set", "redis.maxmemory=384mb")
    assert rendered("--set", "redis.resources.limits.memory=1Gi", "--set", "redis.maxmemory=0.5gb")


def test_common_annotations_reach_every_resource_beside_their_own() -> None:
    manifests = rendered(*EMBEDDED_SEARCH, "--set", "commonAnnotations.owner=ai-team",
                         "--set-json", 'gateway.service.annotations={"lb": "internal"}')  # fmt: skip
    assert all(m["metadata"]["annotations"]["owner"] == "ai-team" for m in manifests), "every resource"
    assert by_name(manifests, "Service", "gateway")["metadata"]["annotations"]["lb"] == "internal"
    claim = by_name(manifests, "PersistentVolumeClaim", "gateway-data")["metadata"]["annotations"]
    assert claim["helm.sh/resource-policy"] == "keep"


@pytest.mark.parametrize(
    "unsafe",
    ["gateway.securityContext.runAsUser=0", "triton.podSecurityContext.runAsUser=0",
     "redis.securityContext.privileged=true", "gateway.securityContext.allowPrivilegeEscalation=true"],
)  # fmt: skip
def test_the_schema_refuses_root_and_privileged_containers(unsafe: str) -> None:
    assert unsafe.split("=")[0] in refused("--set", unsafe)


def test_a_values_file_of_0_3_keeps_its_renamed_settings(tmp_path: Path) -> None:
    """`HUNYUAN_*` and `PIKA_*` became `CHAT_*` and `VIDEO_*`: set under the old name, a value still takes effect
    (carried under the new name, over the chart's default there), reaches the network policy, and NOTES says so."""
    old = ("--set", "gateway.config.HUNYUAN_BASE_URL=http://chat.test:8080/v1",
           "--set", "gateway.extraConfig.PIKA_TASK_TIMEOUT_SECONDS=300")  # fmt: skip
    manifests = rendered(*old, "--set", "networkPolicy.enabled=true")
    config = by_name(manifests, "ConfigMap", "gateway")["data"]
    assert config["CHAT_BASE_URL"] == "http://chat.test:8080/v1" and config["VIDEO_TASK_TIMEOUT_SECONDS"] == "300"
    assert not [name for name in config if name.startswith(("HUNYUAN_", "PIKA_"))]
    assert config["CHAT_MODELS"] == "hy3-preview", "the other defaults stay"
    policy = by_name(manifests, "NetworkPolicy", "gateway")["spec"]
    assert any(port["port"] == 8080 for rule in policy["egress"] for port in rule.get("ports", []))
    assert "Deprecated: gateway config HUNYUAN_BASE_URL is now CHAT_BASE_URL" in notes(tmp_path, *old)
    assert "HUNYUAN_BASE_UR" in refused("--set", "gateway.config.HUNYUAN_BASE_UR=http://chat.test/v1")
