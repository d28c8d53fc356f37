"""The ways to a simulator (`Route`): straight, through the gateway, through the gateway's exact cache, or
through LiteLLM; each measurement runs every one of them."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.chat.plan import API_KEY, BARE, CACHED, CACHED_INDEX, GATEWAY, LITELLM, MODELS, PROMPT
from bench.processes import ServerProcess
from bench.stack import Endpoint

_prompts = itertools.count()


@dataclass(frozen=True)
class Route:
    """One way to a simulator: straight, through the gateway, or through LiteLLM."""

    system: str
    base_url: str  # OpenAI base URL, ending in /v1
    model: str
    proxy: ServerProcess | None  # the process whose cost is measured; None: bare simulator
    upstream: ServerProcess
    repeat: bool = False  # the same request every time (exact-cache hits)
    headers: Mapping[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {API_KEY}"})

    def body(self, *, stream: bool) -> dict[str, Any]:
        index = CACHED_INDEX if self.repeat else next(_prompts)
        messages = [{"role": "user", "content": PROMPT.format(index)}]
        return {"model": self.model, "messages": messages, "stream": stream}

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of (proxy, simulator); the proxy's is 0 for the bare simulator."""
        return (self.proxy.cpu_seconds() if self.proxy else 0.0), self.upstream.cpu_seconds()


def routes_to(phase: str, sim: Endpoint, gateways: Mapping[str, Endpoint], litellm: Endpoint | None) -> list[Route]:
    """The ways to one measurement's simulator, the bare one first."""
    model, gw, cached = MODELS[phase], gateways[phase], gateways[CACHED]
    found = [Route(BARE, sim.base_url, model, None, sim.server)]
    found.append(Route(GATEWAY, f"{gw.base_url}/v1", model, gw.server, sim.server))
    if phase == "rps":
        found.append(Route(CACHED, f"{cached.base_url}/v1", model, cached.server, sim.server, repeat=True))
    if litellm is not None:
        found.append(Route(LITELLM, litellm.base_url, model, litellm.server, sim.server))
    return found
