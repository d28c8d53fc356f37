"""The bundled Redis' password under `helm template` (Argo CD), where `lookup` finds nothing: a generated password is
drawn once per render, the Secret and the checksums on the Redis and gateway pods hold that one, so both roll
together when a render draws a new one; a set password or an existing Secret renders the same every time."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART, RELEASE, helm

pytestmark = pytest.mark.slow

SECRET_TEMPLATE = "ai-stack/templates/redis-secret.yaml"


class Render:
    """One `helm template` of the chart: its output and the parts the Redis password reaches."""

    def __init__(self, *args: str) -> None:
        result = helm("template", RELEASE, str(CHART), "--namespace", "ai", *args)
        assert result.returncode == 0, result.stderr
        self.text = result.stdout
        self.manifests: list[dict[str, Any]] = [m for m in yaml.safe_load_all(result.stdout) if m]

    def pod_annotations(self, kind: str, name: str) -> dict[str, str]:
        (workload,) = [
            m for m in self.manifests if m["kind"] == kind and m["metadata"]["name"] == f"{RELEASE}-ai-stack-{name}"
        ]
        return dict(workload["spec"]["template"]["metadata"]["annotations"])

    def secret_template(self) -> str:
        """redis-secret.yaml as this render produced it (what the pods' checksums are taken over)."""
        (document,) = [d for d in self.text.split("---\n# Source: ") if d.startswith(SECRET_TEMPLATE + "\n")]
        return document.split("\n", 1)[1]

    def password(self) -> str:
        (secret,) = [m for m in self.manifests if m["kind"] == "Secret" and m["metadata"]["name"].endswith("-redis")]
        return str(secret["stringData"]["redis-password"])


def helm_checksum(*items: str) -> str:
    """What `list ... | toJson | sha256sum` gives in the chart's templates."""
    return hashlib.sha256(json.dumps(list(items), separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def test_a_generated_password_is_the_one_both_pods_checksums_are_taken_over() -> None:
    render = Render()
    secret = render.secret_template()
    assert render.password() in secret
    redis = render.pod_annotations("StatefulSet", "redis")["checksum/secret"]
    assert redis == helm_checksum(secret, "", "redis-password"), "the Redis pod's checksum is of the rendered Secret"
    gateway = render.pod_annotations("Deployment", "gateway")["checksum/redis"]
    assert gateway == helm_checksum(secret, "", "redis-password", "", "REDIS_URL"), "and so is the gateways'"


def test_two_renders_without_a_password_roll_redis_and_the_gateways_together() -> None:
    first, second = Render(), Render()
    assert first.password() != second.password(), "helm template cannot look up the Secret: a new password"
    for render in (first, second):
        secret = render.secret_template()
        assert render.pod_annotations("StatefulSet", "redis")["checksum/secret"] == helm_checksum(
            secret, "", "redis-password"
        )
    redis = [r.pod_annotations("StatefulSet", "redis")["checksum/secret"] for r in (first, second)]
    gateway = [r.pod_annotations("Deployment", "gateway")["checksum/redis"] for r in (first, second)]
    assert redis[0] != redis[1] and gateway[0] != gateway[1], "Redis and every gateway pod roll with the new password"


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "redis.auth.password=fixed"),
        ("--set", "redis.auth.existingSecret=ai-redis-password"),
        ("--set", "redis.enabled=false", "--set", "redis.external.url=redis://:a@r:6379/0"),
    ],
    ids=["password", "existing-secret", "external-url"],
)
def test_a_password_from_the_values_or_a_secret_renders_the_same_every_time(args: tuple[str, ...]) -> None:
    assert Render(*args).text == Render(*args).text
