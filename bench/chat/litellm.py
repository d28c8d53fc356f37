"""LiteLLM's proxy, the peer the gateway is compared with: its own virtual environment, its config and its
server, in front of the same simulators."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from bench.chat.plan import API_KEY
from bench.processes import ServerProcess
from bench.stack import Endpoint
from localtriton.ports import free_port

LITELLM_REQUIREMENTS = ("litellm[proxy]==1.108.0",)  # newer releases pin litellm-proxy-extras builds not on PyPI
LITELLM_NOTE = (
    f"LiteLLM: {LITELLM_REQUIREMENTS[0]} in its own virtual environment, one uvicorn worker (uvloop), master key, "
    "no database, num_retries 0, model openai/<name> at the same simulator."
)


def litellm_config(routes: Mapping[str, str], api_key: str = API_KEY) -> str:
    """LiteLLM's config.yaml (JSON is YAML) mapping each model name to `openai/<model>` at its simulator."""
    model_list = [
        {"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": base, "api_key": api_key}}
        for model, base in routes.items()
    ]
    settings = {"drop_params": True, "num_retries": 0, "request_timeout": 120}
    return json.dumps({"model_list": model_list, "litellm_settings": settings}, indent=2) + "\n"


def litellm_endpoint(python: Path, config: Path, log_dir: Path) -> Endpoint:
    """LiteLLM's proxy on a free port: one worker, master key, no database, access log off."""
    port = free_port()
    command = [str(python.parent / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    env = {"LITELLM_MASTER_KEY": API_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    server = ServerProcess("litellm", [*command, "--num_workers", "1"], env=env, log_dir=log_dir)
    base = f"http://127.0.0.1:{port}"
    return Endpoint(server, f"{base}/health/liveliness", f"{base}/v1")
