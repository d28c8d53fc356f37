"""The keys part's gateways: one per configuration, in front of the same Triton, with a keys file for the keyed
ones; each on free ports and fresh stores (SQLite files in the log folder, or the part's own Redis)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from bench.keys.plan import EMBEDDING_PRICE, TEAM, UNLIMITED_BUDGET, UNLIMITED_RPM, Config
from bench.stack import Endpoint, gateway

# Settings a keyed or Redis gateway gets here; removed from the others, whatever this shell has set.
KEY_SETTINGS = ("GATEWAY_API_KEYS", "GATEWAY_KEYS_FILE", "REDIS_URL")


def write_keys_file(path: Path, secret: str) -> None:
    """One key of team `TEAM`, with the key's and the team's limits set high enough never to refuse."""
    limits = {"requests_per_minute": {"embeddings": UNLIMITED_RPM}, "monthly_budget": UNLIMITED_BUDGET}
    document = {
        "teams": {TEAM: {"limits": {"requests_per_minute": UNLIMITED_RPM, "monthly_budget": UNLIMITED_BUDGET}}},
        "keys": [{"name": "bench", "team": TEAM, "secret": secret, "scopes": ["embeddings"], "limits": limits}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))


def start_gateway(
    log_dir: Path, config: Config, triton_target: str, keys_file: Path, model: str, redis_url: str | None
) -> Endpoint:
    """A gateway of `config` with a warmable in-process (or Redis) embedding cache; `model` gets a price."""
    name = "gateway-" + ("keys" if config.keys else "open") + ("-redis" if config.redis else "")
    for suffix in ("keys", "usage"):
        (log_dir / f"{name}-{suffix}.sqlite3").unlink(missing_ok=True)  # no spend left from an earlier run
    env = {
        "TRITON_URL": triton_target,
        "EMBEDDING_CACHE_MB": "256",
        "GATEWAY_PRICES": json.dumps({model: {"embedding": EMBEDDING_PRICE}}),
    }
    endpoint = gateway(log_dir, env, name)  # its keys and usage files are the ones removed above
    for setting in KEY_SETTINGS:
        endpoint.server.env.pop(setting, None)
    if config.keys:
        endpoint.server.env["GATEWAY_KEYS_FILE"] = str(keys_file)
    if config.redis:
        assert redis_url is not None
        endpoint.server.env["REDIS_URL"] = redis_url
    endpoint.server.start(endpoint.ready_url)
    return endpoint
