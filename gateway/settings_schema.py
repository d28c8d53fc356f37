"""`python -m gateway.settings_schema [--check]`: write the Helm chart's schema of `gateway.config` and
`gateway.extraConfig` from the settings classes.

Each variable the chart may pass through its ConfigMap (neither a secret nor one the chart sets itself) gets a
schema from its type: a number as a number or a numeric string (`--set gateway.config.X=512` gives a number, a
values file usually a string: both keep working, `abc` does not), a boolean as one or as "true"/"false", a choice as
its enum. A few strings carry the chart's own rules (`STRING_RULES`). `--check` writes nothing and fails when the
chart's schema differs, so a new setting cannot be missing from it, nor a removed one linger.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from gateway.settings import environment_variables, renamed_variables, settings_groups

SCHEMA = Path(__file__).resolve().parent.parent / "helm" / "ai-stack" / "values.schema.json"

# Set by the chart from its own values (ports, addresses, the GPU metrics, search, the keys file, the SQLite files).
CHART_MANAGED = frozenset({
    "GATEWAY_HOST", "GATEWAY_HTTP_PORT", "GATEWAY_GRPC_PORT", "TRITON_URL", "GPU_METRICS_URLS", "REDIS_URL",
    "SEARCH_ENABLED", "SEARCH_MILVUS_URI", "SEARCH_MILVUS_TOKEN", "SEARCH_PATH", "GATEWAY_KEYS_FILE",
    "GATEWAY_KEYS_SQLITE_PATH", "GATEWAY_USAGE_SQLITE_PATH", "GATEWAY_USAGE_SPOOL_PATH",
})  # fmt: skip
# Names the chart refuses in its ConfigMap (they belong in a Secret), as its gateway-configmap.yaml says.
SECRET_LIKE = re.compile(r"KEY|PASSWORD|PASSWD|SECRET|TOKEN$|CREDENTIAL|AUTHORIZATION|HEADERS|REDIS_URL", re.IGNORECASE)
NOT_SECRET = frozenset({"GATEWAY_KEYS_REFRESH_SECONDS"})  # names keys, holds a number
STRING_RULES: dict[str, dict[str, Any]] = {
    "GATEWAY_LOG_LEVEL": {"enum": ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]},
    "GATEWAY_PUBLIC_URL": {"pattern": r"^(https?://[^\s/]+\S*)?$"},
    "TASKS_SQLITE_PATH": {"pattern": "^/[^/].*/[^/]+$"},  # a file below a folder: the folder becomes a volume
}
# Shared by every setting of a type, under the schema's "definitions".
DEFINITIONS: dict[str, Any] = {
    "integerSetting": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^-?[0-9]+$"}]},
    "numberSetting": {
        "anyOf": [
            {"type": "number"},
            {"type": "string", "pattern": r"^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"},
        ]
    },
    "booleanSetting": {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["true", "false"]}]},
}


def settings() -> dict[str, FieldInfo]:
    return {name: field for group in settings_groups() for name, field in environment_variables(group).items()}


def passed_through(name: str) -> bool:
    """Whether the chart passes `name` through its ConfigMap: neither set by the chart nor a secret."""
    return name not in CHART_MANAGED and (name in NOT_SECRET or not SECRET_LIKE.search(name))


def setting_schema(name: str, field: FieldInfo) -> dict[str, Any]:
    annotation = field.annotation
    if isinstance(annotation, types.UnionType):  # `X | None`: unset is the absence of the key
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        return {"type": "string", "enum": [str(choice) for choice in typing.get_args(annotation)]}
    for kind, name_of_kind in ((bool, "booleanSetting"), (int, "integerSetting"), (float, "numberSetting")):
        if annotation is kind:
            return {"$ref": f"#/definitions/{name_of_kind}"}
    return {"type": "string", **STRING_RULES.get(name, {})}  # text, and JSON text (GATEWAY_PRICES)


def config_schema() -> dict[str, Any]:
    """The schema `gateway.config` and `gateway.extraConfig` share: every setting the chart passes through, typed;
    the others (set by the chart, or secrets) by name only, so that the chart's own refusal says why; a name from before
    0.4 as its new name, marked deprecated (the chart carries it under the new name); no other key."""
    fields = settings()
    properties = {name: setting_schema(name, field) if passed_through(name) else {} for name, field in fields.items()}
    for old, new in renamed_variables().items():
        properties[old] = {**properties[new], "deprecated": True, "description": f"Renamed {new}; read until 0.3."}
    properties = dict(sorted(properties.items()))
    return {"type": "object", "additionalProperties": False, "properties": properties}


def rendered(schema_text: str) -> str:
    schema = json.loads(schema_text)
    schema["definitions"] = {**DEFINITIONS, "gatewayConfig": config_schema()}
    gateway = schema["properties"]["gateway"]["properties"]
    gateway["config"] = gateway["extraConfig"] = {"$ref": "#/definitions/gatewayConfig"}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the chart's schema differs; write nothing")
    args = parser.parse_args(argv)
    current = SCHEMA.read_text()
    wanted = rendered(current)
    if args.check:
        if current != wanted:
            print(f"{SCHEMA} is out of date: run `python -m gateway.settings_schema`", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
