"""What the chat part measures: the systems (one series each), the simulators' pacing and how much load each
measurement gets."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from simulators.hunyuan import echo_reply, reasoning_reply, split_pieces

PART = "chat"
API_KEY = "sk-bench-" + secrets.token_hex(24)  # the gateway's and LiteLLM's client key this session
SIM_TTFT = 0.05  # seconds the simulator waits before the first token
TTFT_TPS = 1000  # pieces per second of the TTFT simulator: answers end soon after their first token
PROMPT = "question {:08d}"  # every prompt the same length, so every answer has the same number of pieces
CACHED_INDEX = 99_999_999  # the one prompt repeated for exact-cache hits
# One simulator each; all three think by default (TokenHub's thinking switch table), so streams carry reasoning.
MODELS = {"ttft": "glm-5", "rps": "deepseek-v4-flash", "streams": "kimi-k2.5"}
TARGET_STREAMS = 1000
TTFT_P50_MS, TTFT_P99_MS, RPS_VS_LITELLM = 2.0, 10.0, 3.0

# System names: one series each in the plots.
BARE, GATEWAY, CACHED, LITELLM = "bare simulator", "gateway", "gateway (exact-cache hits)", "LiteLLM proxy"


@dataclass(frozen=True)
class Plan:
    """How much load each measurement gets."""

    runs: int = 3
    ttft_concurrency: tuple[int, ...] = (1, 16)
    rps_concurrency: tuple[int, ...] = (1, 8, 32, 128)  # the ratio to LiteLLM is judged at 32
    ttft_seconds: float = 8.0  # length of one run; its request count comes from a warm-up run...
    ttft_min_requests: int = 100  # ...but at least this many, so that p99 is not just the maximum
    rps_seconds: float = 3.0
    streams: int = TARGET_STREAMS
    stream_seconds: float = 10.0
    litellm: bool = True


QUICK = Plan(1, (1, 4), (1, 8), 1.0, 20, rps_seconds=0.5, streams=50, stream_seconds=2.0, litellm=False)


def stream_tps(seconds: float, ttft: float = SIM_TTFT) -> float:
    """Simulator pieces per second so that a streamed answer to PROMPT, its reasoning first, lasts `seconds`."""
    return (answer_pieces() - 1) / max(seconds - ttft, 0.1)


def answer_pieces() -> int:
    """The simulator's pieces (tokens) in a reasoning model's streamed answer to PROMPT: thoughts and answer."""
    messages = [{"role": "user", "content": PROMPT.format(0)}]
    return len(split_pieces(reasoning_reply(messages))) + len(split_pieces(echo_reply(messages)))


def run_size(rate: float, seconds: float, concurrency: int, minimum: int = 0) -> int:
    """Requests for a run of about `seconds` at `rate` requests/s; at least `minimum` and 4 per slot."""
    return max(4 * concurrency, minimum, min(int(rate * seconds), 100_000))
