"""The keys part's run: Triton, Redis and a gateway per configuration, then rounds of the cached open loop
against each gateway in alternating order; the result is written after every round."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.embeddings.loads import Series, batches, cache_open_loop, warm_cache
from bench.embeddings.repository import require_export
from bench.keys.plan import CONFIGS, PART, RATE, SECONDS, TEXTS, Config
from bench.keys.report import build_result
from bench.keys.servers import start_gateway, write_keys_file
from bench.processes import ServerProcess, stopped_on_exit
from bench.progress import PartProgress
from bench.results import PartResult
from bench.stack import REPOSITORY, Endpoint, redis_server, start_triton
from bench.workload import texts as workload_texts

log = logging.getLogger("bench.keys")


async def run(
    out_dir: Path,
    *,
    runs: int = 3,
    quick: bool = False,
    repository: Path = REPOSITORY,
    progress: PartProgress | None = None,
) -> PartResult:
    """Start Triton, Redis and a gateway per configuration, warm their caches, then measure them in rounds
    (`progress` hears of each)."""
    require_export(repository)
    runs = 1 if quick else max(runs, 1)
    log_dir = out_dir / "logs" / PART
    texts = workload_texts(TEXTS)
    secret = "sk-bench-" + secrets.token_urlsafe(24)
    keys_file = log_dir / "keys.yaml"
    write_keys_file(keys_file, secret)
    notes: list[str] = []
    servers: list[ServerProcess] = []
    with stopped_on_exit(servers), redis_server(log_dir) as redis_url:
        triton_endpoint = start_triton(log_dir, servers, repository)
        configs = [config for config in CONFIGS if redis_url is not None or not config.redis]
        if redis_url is None:
            notes.append("Redis configurations skipped: no redis-server binary on this machine.")
        model = served_model(triton_endpoint)
        gateways: dict[Config, Endpoint] = {}
        for config in configs:
            gateways[config] = start_gateway(log_dir, config, triton_endpoint.grpc_target, keys_file, model, redis_url)
            servers.append(gateways[config].server)
        for config, endpoint in gateways.items():
            headers = auth_headers(config, secret)
            check_keys(endpoint, config, headers, texts[0])
            await warm_cache(f"{endpoint.base_url}/v1/embeddings", batches(texts, 1), headers)
        return await measure_rounds(gateways, texts, secret, runs, quick, out_dir, notes, progress)


async def measure_rounds(
    gateways: dict[Config, Endpoint], texts: list[str], secret: str, runs: int, quick: bool, out_dir: Path,
    notes: list[str], progress: PartProgress | None = None,
) -> PartResult:  # fmt: skip
    """`runs` rounds, each measuring every gateway once (reversed every other round); the result so far is
    written after every round: a stopped run still leaves its numbers."""
    began, load_at_start = time.monotonic(), os.getloadavg()[0]
    configs = list(gateways)
    series = {config: Series(config.name, RATE) for config in configs}
    result: PartResult | None = None
    for round_number in range(runs):
        order = configs if round_number % 2 == 0 else configs[::-1]
        log.info("round %d of %d: %s", round_number + 1, runs, ", ".join(config.name for config in order))
        for config in order:
            endpoint, missed = gateways[config], list[int]()
            stats, window = await cache_open_loop(
                f"{endpoint.base_url}/v1/embeddings",
                texts,
                RATE,
                SECONDS[quick],
                endpoint.server.pid,
                headers=auth_headers(config, secret),
                misses=missed,
            )
            endpoint.server.check_alive()
            series[config].add(stats, window.percent, {"cache_misses": float(len(missed))})
            log.info(
                "%s: p50 %.3f ms, p99 %.3f ms, errors %d, misses %d",
                config.name, stats.p(50), stats.p(99), stats.errors, len(missed),
            )  # fmt: skip
        ending = [
            *([] if round_number + 1 == runs else [f"partial: {round_number + 1} of {runs} rounds done"]),
            recorded_requests(gateways, secret),
            f"measuring took {time.monotonic() - began:.0f} s",
        ]
        result = build_result(list(series.values()), configs, runs, quick, load_at_start, [*notes, *ending])
        result.write(out_dir)
        if progress is not None:
            progress.advance()
    assert result is not None
    return result


def auth_headers(config: Config, secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if config.keys else {}


def served_model(triton_endpoint: Endpoint) -> str:
    """The model name the gateway answers embeddings with (the export's `model_name` parameter of `bge`):
    the price table's key."""
    response = httpx.get(f"{triton_endpoint.base_url}/v2/models/bge/config", timeout=30)
    response.raise_for_status()
    config = response.json()
    return str(config.get("parameters", {}).get("model_name", {}).get("string_value") or config["name"])


def check_keys(endpoint: Endpoint, config: Config, headers: dict[str, str], text: str) -> None:
    """A keyed gateway refuses a request without the key and prices one with it: the costs measured are on."""
    url = f"{endpoint.base_url}/v1/embeddings"
    with httpx.Client(timeout=60) as client:
        answer = client.post(url, json={"input": text}, headers=headers)
        answer.raise_for_status()
        if config.keys:
            refused = client.post(url, json={"input": text})
            if refused.status_code != 401 or "x-request-cost" not in answer.headers:
                raise RuntimeError(
                    f"{config.name}: keys are not in force (without a key: HTTP {refused.status_code}; "
                    f"X-Request-Cost {'present' if 'x-request-cost' in answer.headers else 'missing'})"
                )


def recorded_requests(gateways: dict[Config, Endpoint], secret: str) -> str:
    """What each keyed gateway's usage record holds for the key today: every answered request is on it."""
    today = dt.datetime.now(dt.UTC).date().isoformat()
    counts = []
    for config, endpoint in gateways.items():
        if not config.keys:
            continue
        with _suppressed_http():
            response = httpx.get(
                f"{endpoint.base_url}/v1/usage",
                params={"start": today, "end": today, "group_by": "key"},
                headers=auth_headers(config, secret),
                timeout=30,
            )
            response.raise_for_status()
            requests = sum(int(row.get("requests", 0)) for row in response.json()["data"])
            counts.append(f"{config.name}: {requests}")
            continue
        counts.append(f"{config.name}: usage not readable")
    return "requests in the key's usage record (all rounds, warm-ups included): " + "; ".join(counts)


@contextlib.contextmanager
def _suppressed_http() -> Iterator[None]:
    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
        yield
