"""The chat part's servers: a Hunyuan simulator per measurement, a gateway in front of each, a gateway with
the exact cache on, and LiteLLM in front of all the simulators; started together, stopped on exit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from pathlib import Path

from bench.chat.clients import failure_reason
from bench.chat.litellm import LITELLM_NOTE, LITELLM_REQUIREMENTS, litellm_config, litellm_endpoint
from bench.chat.plan import API_KEY, CACHED, MODELS, SIM_TTFT, TTFT_TPS, Plan, stream_tps
from bench.chat.routes import Route, routes_to
from bench.peer_venvs import venv_python
from bench.processes import ServerProcess
from bench.stack import Endpoint, gateway, hunyuan_simulator


def gateway_env(simulator_url: str, *, cache: bool) -> dict[str, str]:
    """Chat only (Triton at a closed port); quota, pool and in-flight limits far above the load."""
    return {
        "TRITON_URL": "127.0.0.1:9",
        "GATEWAY_API_KEYS": API_KEY,
        "GATEWAY_MAX_IN_FLIGHT": "5000",
        "CHAT_BASE_URL": simulator_url,
        "CHAT_API_KEY": API_KEY,
        "CHAT_REQUESTS_PER_SECOND": "100000",
        "CHAT_MAX_CONCURRENT": "5000",
        "CHAT_MAX_CONNECTIONS": "2000",
        "CHAT_CACHE_MB": "64" if cache else "0",
        "CHAT_SEMANTIC_MATCHER": "off",
    }


def simulator_args(ttft: float, tps: float) -> list[str]:
    return ["--qps", "0", "--ttft", f"{ttft:g}", "--tps", f"{tps:.4f}", "--log-level", "warning"]


async def start(make: Callable[[], Endpoint], started: list[ServerProcess], attempts: int = 3) -> Endpoint:
    """Make a server (on fresh free ports) and start it; again if it fails, since another process may take
    a port `free_port()` chose before the server binds it."""
    for attempt in range(attempts):
        endpoint = make()
        started.append(endpoint.server)
        try:
            await asyncio.to_thread(endpoint.server.start, endpoint.ready_url)
            return endpoint
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    raise ValueError(f"attempts must be positive, got {attempts}")


async def start_all(makers: Mapping[str, Callable[[], Endpoint]], started: list[ServerProcess]) -> dict[str, Endpoint]:
    outcomes = await asyncio.gather(*(start(make, started) for make in makers.values()), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return {name: outcome for name, outcome in zip(makers, outcomes, strict=True) if isinstance(outcome, Endpoint)}


async def start_litellm(log_dir: Path, routes: Mapping[str, str], started: list[ServerProcess]) -> Endpoint:
    python = await asyncio.to_thread(venv_python, "litellm", LITELLM_REQUIREMENTS)
    log_dir.mkdir(parents=True, exist_ok=True)
    config = log_dir / "litellm-config.yaml"
    config.write_text(litellm_config(routes))
    return await start(partial(litellm_endpoint, python, config, log_dir), started)


@contextlib.asynccontextmanager
async def chat_stack(log_dir: Path, plan: Plan, notes: list[str]) -> AsyncIterator[dict[str, list[Route]]]:
    """Per measurement (see MODELS) a simulator, a gateway in front of it and LiteLLM in front of all three,
    plus a gateway with the exact cache on in front of the unpaced simulator. Yields each measurement's
    routes, the bare simulator first; stops everything on exit."""
    started: list[ServerProcess] = []
    peer: asyncio.Future[Endpoint] | None = None
    stream_args = simulator_args(SIM_TTFT, stream_tps(plan.stream_seconds))
    sim_args = {"ttft": simulator_args(SIM_TTFT, TTFT_TPS), "rps": simulator_args(0, 0), "streams": stream_args}
    try:
        makers = {phase: partial(hunyuan_simulator, log_dir / phase, *args) for phase, args in sim_args.items()}
        sims = await start_all(makers, started)
        if plan.litellm:
            peer_routes = {MODELS[phase]: sim.base_url for phase, sim in sims.items()}
            peer = asyncio.ensure_future(start_litellm(log_dir / "litellm", peer_routes, started))
        gateway_makers = {
            phase: partial(gateway, log_dir / phase, gateway_env(sim.base_url, cache=False))
            for phase, sim in sims.items()
        }
        cached_env = gateway_env(sims["rps"].base_url, cache=True)
        gateway_makers[CACHED] = partial(gateway, log_dir / "rps", cached_env, name="gateway-cached")
        gateways = await start_all(gateway_makers, started)
        litellm: Endpoint | None = None
        try:
            litellm = await peer if peer is not None else None
            notes.append(LITELLM_NOTE if litellm else "LiteLLM proxy not run (quick mode).")
        except Exception as exc:  # a peer that cannot run is reported, never fatal
            notes.append(f"LiteLLM proxy not run: {failure_reason(exc)}")
        yield {phase: routes_to(phase, sim, gateways, litellm) for phase, sim in sims.items()}
    finally:
        if peer is not None:
            await asyncio.gather(peer, return_exceptions=True)  # its server must be up before it can be stopped
        for server in started:
            server.stop()
