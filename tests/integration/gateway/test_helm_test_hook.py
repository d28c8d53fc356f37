"""`helm test`'s pod script, as the chart renders it, against a real gateway with Triton and search."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest
import yaml
from pydantic import SecretStr

from gateway.settings import AuthSettings
from localtriton.server import TritonProcess
from tests.helm.test_chart import CHART, RELEASE, helm
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow


def rendered_test_pod() -> tuple[str, dict[str, str]]:
    """The test pod's script and its plain environment values, with search on."""
    result = helm("template", RELEASE, str(CHART), "--show-only", "templates/tests/gateway-test.yaml",
                  "--set", "search.enabled=true", "--set", "gateway.autoscaling.enabled=false",
                  "--set", "gateway.replicaCount=1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    pod = yaml.safe_load(result.stdout)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return container["command"][2], env


def test_the_helm_test_pod_checks_readiness_an_embedding_and_a_search(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway]
) -> None:
    script, env = rendered_test_pod()
    assert env["SEARCH_ENABLED"] == "true"
    gateway = gateway_factory(triton.grpc_url, auth=AuthSettings(api_keys=SecretStr("first-key,second-key")))

    def run(**extra: str) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, **env, "GATEWAY_URL": gateway.base_url, **extra}
        return subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip

    passed = run(GATEWAY_API_KEYS="first-key, second-key")
    assert passed.returncode == 0, passed.stderr
    assert "embedding: 384 dimensions" in passed.stdout and "search: found the document" in passed.stdout
    refused = run()  # no key: the gateway answers 401, and the test fails as it should
    assert refused.returncode != 0 and "401" in refused.stderr
    listed = httpx.get(f"{gateway.base_url}/v1/collections", headers={"Authorization": "Bearer first-key"}).json()
    assert [c["name"] for c in listed["data"]] == [], "the test deletes its collection"
