"""The chart's side of API keys per team (issue 27): the keys file from a Secret mounted as a folder, so that an edit of
the Secret reaches the gateway's reload; the admin API's keys and the usage record on the gateway's volume without
Redis; prices and the refresh interval through gateway.config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from gateway.settings_schema import CHART_MANAGED, SECRET_LIKE
from tests.helm.test_chart import RELEASE, SCENARIOS, container, of_kind, one, render
from tests.helm.test_chart_operations import refused, template

pytestmark = pytest.mark.slow

KEYS_SECRET = f"{RELEASE}-ai-stack-gateway-keys"
# A plain secret in the keys file: it must reach a Secret and nothing else.
MARKER = "sk-chart-test-4f1c9e"
KEYS_FILE = f"keys:\n  - {{name: nightly, team: data, secret: {MARKER!r}}}\n"


def rendered(*args: str) -> list[dict[str, Any]]:
    code, stderr, manifests = template(*args)
    assert code == 0, stderr
    return manifests


def with_keys_file(tmp_path: Path, text: str, *args: str) -> list[dict[str, Any]]:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return rendered("--set-file", f"gateway.keys.file={path}", *args)


def find(manifests: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def pod_template(manifests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = find(manifests, "Deployment", f"{RELEASE}-ai-stack-gateway")["spec"]["template"]
    return found


def keys_mount(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keys volume and its mount in the gateway container."""
    gateway = next(c for c in pod["spec"]["containers"] if c["name"] == "gateway")
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "keys"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "keys"]
    return volume, mount


def config(manifests: Sequence[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = find(manifests, "ConfigMap", f"{RELEASE}-ai-stack-gateway")["data"]
    return data


def test_keys_file_given_at_install_is_a_secret_mounted_as_a_folder(tmp_path: Path) -> None:
    manifests = with_keys_file(tmp_path, KEYS_FILE)
    assert find(manifests, "Secret", KEYS_SECRET)["stringData"] == {"keys.yaml": KEYS_FILE}
    volume, mount = keys_mount(pod_template(manifests))
    assert volume["secret"] == {"secretName": KEYS_SECRET, "items": [{"key": "keys.yaml", "path": "keys.yaml"}]}
    assert mount["readOnly"] is True
    assert "subPath" not in mount, "a subPath mount never sees the Secret change"
    path = PurePosixPath(config(manifests)["GATEWAY_KEYS_FILE"])
    assert (str(path.parent), path.name) == (mount["mountPath"], "keys.yaml")


def test_keys_file_from_an_existing_secret_is_reloaded_not_rolled() -> None:
    assert [s for s in of_kind("external-redis", "Secret") if s["metadata"]["name"] == KEYS_SECRET] == []
    pod = pod_template(render("external-redis"))
    volume, mount = keys_mount(pod)
    items = [{"key": "teams.yaml", "path": "keys.yaml"}]  # the ci values' existingSecretKey
    assert volume["secret"] == {"secretName": "ai-gateway-keys-file", "items": items}
    assert mount["readOnly"] is True and "subPath" not in mount
    assert (
        one("external-redis", "ConfigMap", "gateway")["data"]["GATEWAY_KEYS_FILE"] == f"{mount['mountPath']}/keys.yaml"
    )
    assert "checksum/keys" not in pod["metadata"]["annotations"], "an edit of the Secret is reloaded live"


def test_a_new_keys_file_given_to_the_chart_rolls_the_gateways(tmp_path: Path) -> None:
    first = pod_template(with_keys_file(tmp_path, KEYS_FILE))["metadata"]["annotations"]["checksum/keys"]
    second = pod_template(with_keys_file(tmp_path, KEYS_FILE.replace("nightly", "weekly")))["metadata"]["annotations"]
    assert second["checksum/keys"] != first


def test_no_keys_file_without_gateway_keys() -> None:
    pod = pod_template(render("default"))
    assert "keys" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "GATEWAY_KEYS_FILE" not in one("default", "ConfigMap", "gateway")["data"]
    assert "checksum/keys" not in pod["metadata"]["annotations"]


@pytest.mark.parametrize("redis", ["redis.enabled=true", "redis.enabled=false"])
def test_keys_file_content_is_in_no_config_map(tmp_path: Path, redis: str) -> None:
    manifests = with_keys_file(
        tmp_path, KEYS_FILE, "--set", redis, "--set", "gateway.autoscaling.allowWithoutRedis=true"
    )
    config_maps = [m for m in manifests if m["kind"] == "ConfigMap"]
    assert config_maps and all(MARKER not in json.dumps(m) for m in config_maps)
    holders = {m["metadata"]["name"] for m in manifests if MARKER in json.dumps(m)}
    assert holders == {KEYS_SECRET}, "only the keys Secret holds the file (no annotation, env or ConfigMap)"


def test_ci_keys_file_is_one_the_gateway_loads() -> None:
    from gateway.keys.keys_file import parse_keys_file

    text = one("sqlite-tasks", "Secret", "gateway-keys")["stringData"]["keys.yaml"]
    assert [key.team for key in parse_keys_file(text).keys] == ["search"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_key_and_usage_databases_on_the_gateways_volume_only_without_redis(scenario: str) -> None:
    deployment = one(scenario, "Deployment", "gateway")
    data = one(scenario, "ConfigMap", "gateway")["data"]
    names = ("GATEWAY_KEYS_SQLITE_PATH", "GATEWAY_USAGE_SQLITE_PATH")
    if "REDIS_URL" in {e["name"] for e in container(deployment, "gateway")["env"]}:
        assert [n for n in names if n in data] == [], "with Redis the keys and the usage record live in Redis"
        return
    mounts = {m["mountPath"]: m["name"] for m in container(deployment, "gateway")["volumeMounts"]}
    tasks_dir = str(PurePosixPath(data["TASKS_SQLITE_PATH"]).parent)
    paths = [PurePosixPath(data[n]) for n in names]
    assert all(str(p.parent) == tasks_dir and mounts[tasks_dir] == "tasks" for p in paths), paths
    assert len(set(paths) | {PurePosixPath(data["TASKS_SQLITE_PATH"])}) == 3, "three databases, three files"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_usage_spool_is_on_the_gateways_task_volume(scenario: str) -> None:
    """With Redis or without: the records Redis did not take outlive a killed container."""
    data = one(scenario, "ConfigMap", "gateway")["data"]
    mounts = {
        m["mountPath"]: m["name"] for m in container(one(scenario, "Deployment", "gateway"), "gateway")["volumeMounts"]
    }
    spool = PurePosixPath(data["GATEWAY_USAGE_SPOOL_PATH"])
    assert mounts[str(spool.parent)] == "tasks" and spool != PurePosixPath(data["TASKS_SQLITE_PATH"])


def test_without_redis_on_a_pvc_the_keys_survive_the_pod() -> None:
    volumes = {
        v["name"]: v for v in one("sqlite-tasks", "Deployment", "gateway")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["tasks"]["persistentVolumeClaim"] == {"claimName": f"{RELEASE}-ai-stack-gateway-tasks"}
    assert one("sqlite-tasks", "ConfigMap", "gateway")["data"]["GATEWAY_KEYS_SQLITE_PATH"].startswith(
        "/var/lib/gateway/"
    )


def test_prices_and_refresh_interval_through_gateway_config(tmp_path: Path) -> None:
    prices = {"hy3-preview": {"input": 1.2, "output": 4.8, "cached": 0.3}, "bge": {"embedding": 0.02}}
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {"gateway": {"config": {"GATEWAY_PRICES": json.dumps(prices), "GATEWAY_KEYS_REFRESH_SECONDS": "1"}}}
        )
    )
    data = config(rendered("-f", str(values)))
    assert json.loads(data["GATEWAY_PRICES"]) == prices
    assert data["GATEWAY_KEYS_REFRESH_SECONDS"] == "1"
    assert json.loads(one("default", "ConfigMap", "gateway")["data"]["GATEWAY_PRICES"]) == {}


@pytest.mark.parametrize(("prices", "named"), [("[1]", "must be a JSON object"), ('{"bge": ', "is not valid JSON")])
def test_chart_refuses_prices_that_are_no_json_object(tmp_path: Path, prices: str, named: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"gateway": {"config": {"GATEWAY_PRICES": prices}}}))
    assert f"GATEWAY_PRICES {named}" in refused("-f", str(values))


@pytest.mark.parametrize("name", sorted(n for n in CHART_MANAGED if not SECRET_LIKE.search(n)))
def test_chart_refuses_to_be_told_the_paths_it_sets(name: str) -> None:
    """Every setting the chart sets itself (the schema's list) is refused by name, wherever it is given."""
    assert f"{name} is set by the chart" in refused("--set", f"gateway.extraConfig.{name}=/var/lib/gateway/x")


def test_chart_refuses_a_keys_file_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"keys: [{{name: a, secret: {MARKER}\n")
    stderr = refused("--set-file", f"gateway.keys.file={path}")
    assert "gateway.keys.file is not YAML" in stderr
    assert MARKER not in stderr, "the file's content is never quoted"
