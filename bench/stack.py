"""The processes a benchmark drives, each on free ports: Triton, the gateway, the two simulators and Redis.

Every server is a real subprocess (`ServerProcess`), so its CPU can be read from /proc and it never
shares an event loop or the GIL with the load generator.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.paths import ROOT
from bench.processes import ServerProcess
from localtriton.ports import free_port

REPOSITORY = ROOT / "model_repository"
TRITON_START_SECONDS = 300  # loading every model of the repository on a busy 2-core machine


@dataclass
class Endpoint:
    server: ServerProcess
    ready_url: str
    base_url: str  # HTTP base URL
    grpc_target: str = ""  # host:port where it speaks gRPC


def triton(log_dir: Path, repository: Path = REPOSITORY) -> Endpoint:
    """Triton serving `repository` (run `make export` first); ready when the `bge` model is."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = [
        sys.executable, "-m", "localtriton", "serve", "--repository", str(repository),
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
        "--state-dir", str(log_dir / "triton-state"),
    ]  # fmt: skip
    server = ServerProcess("triton", command, log_dir=log_dir)
    base = f"http://127.0.0.1:{http}"
    return Endpoint(server, f"{base}/v2/models/bge/ready", base, f"127.0.0.1:{grpc}")


def gateway(log_dir: Path, env: dict[str, str], name: str = "gateway") -> Endpoint:
    """`python -m gateway` with `env` on top of this environment (TRITON_URL, caches, upstreams...).
    `env` may fix GATEWAY_HTTP_PORT (e.g. to build GATEWAY_PUBLIC_URL from it); else a free port is used."""
    http = int(env.get("GATEWAY_HTTP_PORT") or free_port())
    grpc = int(env.get("GATEWAY_GRPC_PORT") or free_port())
    settings = {
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_LOG_LEVEL": "WARNING",
        # Files of its own, not the checkout's `.run` ones that `make up` uses and every bench run would grow.
        "TASKS_SQLITE_PATH": str(log_dir / f"{name}-tasks.sqlite3"),
        "GATEWAY_KEYS_SQLITE_PATH": str(log_dir / f"{name}-keys.sqlite3"),
        "GATEWAY_USAGE_SQLITE_PATH": str(log_dir / f"{name}-usage.sqlite3"),
        "GATEWAY_USAGE_SPOOL_PATH": str(log_dir / f"{name}-usage-spool.sqlite3"),
        **env,
        "GATEWAY_HTTP_PORT": str(http),
        "GATEWAY_GRPC_PORT": str(grpc),
    }
    server = ServerProcess(name, [sys.executable, "-m", "gateway"], env=settings, log_dir=log_dir)
    base = f"http://127.0.0.1:{http}"
    return Endpoint(server, f"{base}/healthz", base, f"127.0.0.1:{grpc}")


def start_triton(log_dir: Path, servers: list[ServerProcess], repository: Path = REPOSITORY) -> Endpoint:
    """`triton` started, ready, and in `servers` (so `stopped_on_exit(servers)` stops it)."""
    endpoint = triton(log_dir, repository)
    servers.append(endpoint.server)
    endpoint.server.start(endpoint.ready_url, timeout=TRITON_START_SECONDS)
    return endpoint


def start_gateway(log_dir: Path, env: dict[str, str], name: str, servers: list[ServerProcess]) -> Endpoint:
    """`gateway` started, ready, and in `servers`."""
    endpoint = gateway(log_dir, env, name)
    servers.append(endpoint.server)
    endpoint.server.start(endpoint.ready_url)
    return endpoint


def hunyuan_simulator(log_dir: Path, *args: str) -> Endpoint:
    """The Hunyuan simulator (`python -m simulators.hunyuan`); base URL ends in /v1 like Tencent's."""
    port = free_port()
    command = [sys.executable, "-m", "simulators.hunyuan", "--port", str(port), *args]
    server = ServerProcess("hunyuan-simulator", command, log_dir=log_dir)
    base = f"http://127.0.0.1:{port}"
    return Endpoint(server, f"{base}/v1/models", f"{base}/v1")


def pika_simulator(log_dir: Path, *args: str) -> Endpoint:
    """The Pika (fal queue) simulator (`python -m simulators.pika`)."""
    port = free_port()
    command = [sys.executable, "-m", "simulators.pika", "--port", str(port), *args]
    server = ServerProcess("pika-simulator", command, log_dir=log_dir)
    base = f"http://127.0.0.1:{port}"
    return Endpoint(server, f"{base}/.well-known/jwks.json", base)


@contextlib.contextmanager
def redis_server(log_dir: Path) -> Iterator[str | None]:
    """A throwaway `redis-server` on a free port (no persistence); None when the binary is missing."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with (log_dir / "redis.log").open("ab") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = redis.Redis(port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"redis-server not ready on port {port}; see {log_dir / 'redis.log'}") from None
                time.sleep(0.1)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)
