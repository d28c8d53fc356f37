"""The platform as deployed, on this machine: nginx in front of N gateway replicas (restarted when killed, as a
Deployment does), two Tritons serving one repository, Redis with its append-only file, Milvus standalone, and the
TokenHub and fal simulators. Each is a real process (`Supervised`) on ports of its own.

`Platform.start()` brings it up in dependency order; `Platform.stop()` ends every process group it started.
The operations the fault schedule needs (kill, graceful restart, pause) are methods here, so that `faults.py`
only says when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import redis

from bench.milvus_standalone import milvus_launch
from bench.soak.nginx import NGINX_ACCESS_LOG, nginx_config
from bench.soak.processes import Supervised, http_ok, stop_all, tcp_open
from bench.soak.teams import Team, keys_file
from localtriton.ports import free_port
from localtriton.server import TritonProcess

log = logging.getLogger("bench.soak")

CHAT_MODEL = "deepseek-v4-flash"  # thinks before it answers: reasoning tokens, then the answer
SIM_KEY = "soak-upstream-key"
CHAT_QUOTA = (30, 60)  # the account's requests per second and calls in flight (CHAT_REQUESTS_PER_SECOND, ...)
REDIS_MAXMEMORY = "256mb"


# milvus-server's port options -> the keys of the milvus.yaml it writes (indexCoord's is unused in standalone)
@dataclass
class PlatformConfig:
    run_dir: Path
    repository: Path
    replicas: int = 3
    chat_ttft_seconds: float = 0.5  # the simulator's own time to first token (reasoning starts)
    chat_tokens_per_second: float = 25.0  # pieces per second: reasoning then answer over about 1-5 s
    video_seconds: float = 15.0  # a job's run at the simulated fal
    webhook_loss_rate: float = 0.1  # webhooks fal never sends: those tasks end by polling
    triton_exit_timeout_seconds: int = 5  # how long a SIGTERMed Triton drains before it exits
    teams: list[Team] = field(default_factory=list)


class Platform:
    """Every process of the platform, with the ports that reach them."""

    def __init__(self, config: PlatformConfig) -> None:
        self.config = config
        self.logs = config.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.started: list[Supervised] = []
        self.tritons: list[Supervised] = []
        self.gateways: list[Supervised] = []
        self.gateway_ports: list[int] = []
        self.triton_ports: list[int] = []  # gRPC
        self.nginx_port = free_port()
        self.redis_port = free_port()
        self.milvus_port = free_port()
        self.hunyuan_port = free_port()
        self.pika_port = free_port()
        self.redis: Supervised | None = None
        self.milvus: Supervised | None = None
        self.nginx: Supervised | None = None
        self.hunyuan: Supervised | None = None
        self.pika: Supervised | None = None
        self._supervisor: asyncio.Task[None] | None = None
        # `stop` may run while `start` goes on in another thread (Ctrl-C while the platform starts): once it has
        # begun, nothing more joins `started`, so that everything started is stopped.
        self._starting = threading.Lock()
        self._stopping = False
        self.restarts: list[tuple[float, str]] = []  # (Unix time, replica) the supervisor started again

    # ---------------------------------------------------------------- start and stop

    @property
    def milvus_uri(self) -> str:
        return f"http://127.0.0.1:{self.milvus_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.nginx_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> None:
        """Bring everything up (blocking, minutes at most); on failure, stop what started and raise."""
        try:
            self._start_redis()
            # Milvus and the Tritons take the longest to start and need nothing of each other: side by side.
            tritons = [self._triton(index) for index in range(2)]
            with ThreadPoolExecutor(max_workers=3) as pool:
                starting: list[Future[Any]] = [pool.submit(self._start_milvus)]
                starting += [pool.submit(self._add, triton, timeout=300) for triton in tritons]
                for future in starting:
                    future.result()
            self._start_simulators()
            (self.config.run_dir / "keys.yaml").write_text(keys_file(self.config.teams))
            for index in range(self.config.replicas):
                self._start_gateway(index)
            self._start_nginx()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with self._starting:
            self._stopping = True
        if self._supervisor is not None:  # stop runs in a worker thread: the task is cancelled on its own loop
            self._supervisor.get_loop().call_soon_threadsafe(self._supervisor.cancel)
        stop_all(self.started)

    def _add(self, process: Supervised, *, timeout: float = 180.0) -> Supervised:
        with self._starting:
            if self._stopping:
                raise RuntimeError(f"the platform is stopping: not starting {process.name}")
            self.started.append(process)
        process.start(timeout=timeout)
        return process

    def _start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: run `make system-deps`")
        data = self.config.run_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        command = [
            binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--maxmemory", REDIS_MAXMEMORY, "--maxmemory-policy", "volatile-lru",
        ]  # fmt: skip
        self.redis = self._add(Supervised("redis", command, log_dir=self.logs, ready=self._redis_ping))

    def _redis_ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.redis_port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def _start_milvus(self) -> None:
        """Milvus standalone with every port its own (`bench.milvus_standalone`: pinned, so that a restart answers on
        the same ones, with a session lease short enough to serve again soon after)."""
        launch = milvus_launch(self.config.run_dir / "milvus", proxy_port=self.milvus_port)
        process = Supervised("milvus", launch.command, log_dir=self.logs, ready=self._milvus_ready, env=launch.env)
        # milvus-server exits on SIGTERM and leaves Milvus running: Milvus gets the SIGTERM itself and stops in 5 s.
        process.signal_group = True
        self.milvus = self._add(process, timeout=240)

    def _milvus_ready(self) -> bool:
        """It answers, and answers a query on each collection it loads: a restarted Milvus lists its collections
        (as Loading) some seconds before its predecessor's sessions lapse and it serves them."""
        from pymilvus import MilvusClient
        from pymilvus.client.types import LoadState
        from pymilvus.exceptions import MilvusException

        try:
            client = MilvusClient(uri=self.milvus_uri, timeout=3)
        except (MilvusException, grpc.RpcError):  # refused, or a connect that timed out while Milvus starts
            return False
        try:
            for name in client.list_collections():
                if client.get_load_state(name, timeout=3)["state"] in (LoadState.Loading, LoadState.Loaded):
                    client.query(name, filter="", limit=1, timeout=3)
            return True
        except (MilvusException, grpc.RpcError):
            return False
        finally:
            client.close()

    def _triton(self, index: int) -> Supervised:
        http, grpc, metrics = free_port(), free_port(), free_port()
        triton = TritonProcess(
            self.config.repository,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            dist_dir=Path(".run/tritonserver"),
            exit_timeout_seconds=self.config.triton_exit_timeout_seconds,
        )
        ready = http_ok(f"http://127.0.0.1:{http}/v2/models/bge/ready")
        process = Supervised(f"triton-{index}", triton.command(), log_dir=self.logs, ready=ready)
        process.env = triton.environment()
        self.triton_ports.append(grpc)
        self.tritons.append(process)
        return process

    def _start_simulators(self) -> None:
        python = sys.executable
        hunyuan = [
            python, "-m", "simulators.hunyuan", "--port", str(self.hunyuan_port), "--api-key", SIM_KEY, "--control",
            "--ttft", str(self.config.chat_ttft_seconds), "--tps", str(self.config.chat_tokens_per_second),
            "--qps", "200", "--max-concurrency", "200", "--log-level", "warning",
        ]  # fmt: skip
        ready = http_ok(f"http://127.0.0.1:{self.hunyuan_port}/_simulator/stats")
        self.hunyuan = self._add(Supervised("hunyuan-simulator", hunyuan, log_dir=self.logs, ready=ready))
        pika = [
            python, "-m", "simulators.pika", "--port", str(self.pika_port), "--api-key", SIM_KEY, "--control",
            "--job-seconds", str(self.config.video_seconds),
            "--callback-loss-rate", str(self.config.webhook_loss_rate), "--log-level", "warning",
        ]  # fmt: skip
        ready = http_ok(f"http://127.0.0.1:{self.pika_port}/_simulator/stats")
        self.pika = self._add(Supervised("pika-simulator", pika, log_dir=self.logs, ready=ready))

    def gateway_env(self, index: int) -> dict[str, str]:
        run = self.config.run_dir
        tritons = ",".join(f"127.0.0.1:{port}" for port in self.triton_ports)
        pika = f"http://127.0.0.1:{self.pika_port}"
        return {
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_HTTP_PORT": str(self.gateway_ports[index]),
            "GATEWAY_GRPC_PORT": str(free_port()),
            "GATEWAY_LOG_LEVEL": "INFO",
            "GATEWAY_PUBLIC_URL": self.base_url,  # fal's webhooks come in through the load balancer
            "GATEWAY_SHUTDOWN_GRACE_SECONDS": "15",
            "GATEWAY_KEYS_FILE": str(run / "keys.yaml"),
            # A replica's own files, kept across its restarts (a pod's volume): the usage spool replays from it.
            "TASKS_SQLITE_PATH": str(run / f"gateway-{index}-tasks.sqlite3"),
            "GATEWAY_KEYS_SQLITE_PATH": str(run / f"gateway-{index}-keys.sqlite3"),
            "GATEWAY_USAGE_SQLITE_PATH": str(run / f"gateway-{index}-usage.sqlite3"),
            "GATEWAY_USAGE_SPOOL_PATH": str(run / f"gateway-{index}-usage-spool.sqlite3"),
            "SEARCH_PATH": str(run / f"gateway-{index}-search"),
            "TRITON_URL": f"ipv4:{tritons}",
            "REDIS_URL": self.redis_url,
            "SEARCH_MILVUS_URI": self.milvus_uri,
            "CHAT_BASE_URL": f"http://127.0.0.1:{self.hunyuan_port}/v1",
            "CHAT_API_KEY": SIM_KEY,
            "CHAT_MODELS": CHAT_MODEL,
            "CHAT_REQUESTS_PER_SECOND": str(CHAT_QUOTA[0]),
            "CHAT_MAX_CONCURRENT": str(CHAT_QUOTA[1]),
            "VIDEO_BASE_URL": pika,
            "VIDEO_API_KEY": SIM_KEY,
            "VIDEO_WEBHOOK_JWKS_URL": f"{pika}/.well-known/jwks.json",
            "VIDEO_PLATFORM_URL": pika,
            "VIDEO_CALLBACK_GRACE_SECONDS": str(max(5.0, self.config.video_seconds)),
            "VIDEO_READ_TIMEOUT_SECONDS": "5",
            "VIDEO_UNKNOWN_SUBMIT_WAIT_SECONDS": "30",
            "VIDEO_SUBMITS_PER_SECOND": "20",
            "VIDEO_MAX_CONCURRENT_SUBMITS": "8",
        }

    def _start_gateway(self, index: int) -> None:
        self.gateway_ports.append(free_port())
        command = [sys.executable, "-m", "gateway"]
        ready = http_ok(f"http://127.0.0.1:{self.gateway_ports[index]}/healthz")
        process = Supervised(f"gateway-{index}", command, log_dir=self.logs, ready=ready, env=self.gateway_env(index))
        self.gateways.append(process)
        self._add(process)

    def _start_nginx(self) -> None:
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if binary is None:
            raise RuntimeError("nginx not found: run `make system-deps`")
        prefix = self.config.run_dir / "nginx"
        for folder in ("temp", "logs"):
            (prefix / folder).mkdir(parents=True, exist_ok=True)
            (prefix / folder).chmod(0o777)  # workers may run as another user when the soak runs as root
        config = prefix / "nginx.conf"
        config.write_text(
            nginx_config(prefix, self.config.run_dir / NGINX_ACCESS_LOG, self.nginx_port, self.gateway_ports)
        )
        command = [binary, "-p", str(prefix), "-c", str(config), "-e", str(self.logs / "nginx-error.log")]
        ready = tcp_open(self.nginx_port)
        self.nginx = self._add(Supervised("nginx", command, log_dir=self.logs, ready=ready))

    # ---------------------------------------------------------------- the supervisor

    def supervise(self) -> None:
        """Start the supervisor: a replica that exits without being told to is started again (a Deployment)."""
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        while True:
            for gateway in self.gateways:
                if not gateway.alive() and not gateway.held:
                    log.info("%s exited; starting it again", gateway.name)
                    self.restarts.append((time.time(), gateway.name))
                    with contextlib.suppress(RuntimeError):
                        await asyncio.to_thread(gateway.start)
            await asyncio.sleep(0.2)

    # ---------------------------------------------------------------- what the faults do

    async def kill_gateway(self, index: int) -> None:
        """SIGKILL; the supervisor starts it again."""
        gateway = self.gateways[index]
        gateway.signal(signal.SIGKILL)

    async def restart_gateway(self, index: int) -> None:
        """Graceful: SIGTERM, wait for the exit (in-flight requests finish), start, wait until it answers."""
        gateway = self.gateways[index]
        await asyncio.to_thread(gateway.stop, grace=30)
        await asyncio.to_thread(gateway.start)

    async def restart_triton(self, index: int, *, pause: float = 5.0) -> None:
        triton = self.tritons[index]
        await asyncio.to_thread(triton.stop, grace=self.config.triton_exit_timeout_seconds + 10)
        await asyncio.sleep(pause)
        await asyncio.to_thread(triton.start, timeout=300)

    async def kill_triton(self, index: int, *, down: float = 5.0) -> None:
        triton = self.tritons[index]
        await asyncio.to_thread(triton.kill)
        await asyncio.sleep(down)
        await asyncio.to_thread(triton.start, timeout=300)

    async def pause(self, process: Supervised, seconds: float) -> None:
        """SIGSTOP, then SIGCONT after `seconds`: a hung process whose sockets stay open."""
        process.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            process.signal(signal.SIGCONT)

    async def kill_and_start(self, process: Supervised, *, down: float = 2.0) -> None:
        await asyncio.to_thread(process.kill)
        await asyncio.sleep(down)
        await asyncio.to_thread(process.start, timeout=240)

    async def restart(self, process: Supervised, *, pause: float = 0.0) -> None:
        await asyncio.to_thread(process.stop, grace=30)
        await asyncio.sleep(pause)
        await asyncio.to_thread(process.start, timeout=240)

    async def simulator_config(self, simulator: Supervised | None, **changes: object) -> None:
        """Change a simulator's live config through its control route."""
        port = self.hunyuan_port if simulator is self.hunyuan else self.pika_port
        async with httpx.AsyncClient() as client:
            response = await client.patch(f"http://127.0.0.1:{port}/_simulator/config", json=changes, timeout=5)
            response.raise_for_status()

    async def simulator_stats(self, simulator: Supervised | None) -> dict[str, object]:
        port = self.hunyuan_port if simulator is self.hunyuan else self.pika_port
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/_simulator/stats", timeout=10)
            response.raise_for_status()
            stats: dict[str, object] = response.json()
            return stats

    def open_files(self) -> dict[str, dict[str, object]]:
        """Each live gateway's open files by kind and its TCP connections by the peer they reach (a snapshot the
        report keeps, which names the pool that grew when the leak rule breaks)."""
        peers = {port: "load balancer (in)" for port in self.gateway_ports}
        peers |= {port: f"triton-{n}" for n, port in enumerate(self.triton_ports)}
        peers |= {self.redis_port: "redis", self.milvus_port: "milvus", self.hunyuan_port: "chat upstream"}
        peers[self.pika_port] = "fal"
        snapshot: dict[str, dict[str, object]] = {}
        for gateway, port in zip(self.gateways, self.gateway_ports, strict=True):
            if gateway.alive():
                reached = Counter(
                    peers.get(local if local == port else remote, f"port {remote}")
                    for local, remote in gateway.tcp_connections()
                )
                snapshot[f"{gateway.name} (pid {gateway.pid})"] = {
                    "files": gateway.open_file_kinds(),
                    "connections": dict(reached),
                }
        return snapshot

    def http_port(self, process: Supervised) -> int | None:
        """The port the load balancer reaches a gateway replica on; None for other processes."""
        return self.gateway_ports[self.gateways.index(process)] if process in self.gateways else None

    def redis_memory(self) -> tuple[int, int, int] | None:
        """(used_memory, maxmemory) in bytes and the writes refused for lack of memory since Redis started; None
        while Redis does not answer."""
        try:
            client = redis.Redis(port=self.redis_port, socket_timeout=0.5)
            memory, errors = client.info("memory"), client.info("errorstats")
        except redis.RedisError:
            return None
        refused = errors.get("errorstat_OOM", {})
        return int(memory["used_memory"]), int(memory["maxmemory"]), int(refused.get("count", 0))
