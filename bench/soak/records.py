"""What the soak writes down as it runs: one `Record` per request the load generator sent, one `FaultEvent` per
fault, the resource samples, and the nginx access log's lines, all on the Unix clock so they can be lined up."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Record:
    """One request as the client saw it."""

    id: str  # X-Soak-Id, also in nginx's access log
    route: str  # embeddings, embeddings_batch, search, search_filter, upsert, delete, chat, chat_stream, ...
    team: str
    start: float  # Unix seconds the request was sent
    latency: float = 0.0  # seconds to the whole answer (a stream: to its end)
    status: int = 0  # HTTP status; 0: no answer (connection error, timeout)
    error: str = ""  # the exception, or the error event of a stream
    lag: float = 0.0  # how late the load generator sent it after its scheduled time (its own lag)
    ttft: float | None = None  # chat streams: seconds to the first token
    cache: str = ""  # X-Cache
    counted: bool = False  # the client holds an answer that goes on the usage record
    uncertain: bool = False  # the usage record may or may not hold it (a stream cut after its first byte)
    check: str = ""  # a data check that failed on this request, e.g. "read-your-writes"

    @property
    def end(self) -> float:
        """When the answer ended (or the request failed): the moment that places it in a phase."""
        return self.start + self.latency

    @property
    def failed(self) -> bool:
        """A 5xx or no answer: what availability counts (4xx are the client's, 429 the limits')."""
        return self.status == 0 or self.status >= 500 or bool(self.error and self.status == 200)


@dataclass
class FaultEvent:
    name: str
    component: str  # gateway, triton, redis, milvus, chat-upstream, fal, cpu
    start: float  # Unix seconds
    end: float = 0.0
    redundant: bool = False  # the component has a peer: no request may fail
    # Routes that may fail while it lasts, as docs/operations.md says (a component without a peer).
    degrades: tuple[str, ...] = ()
    target: str = ""  # e.g. gateway-1, 127.0.0.1:PORT
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One reading of one process, every few seconds."""

    time: float
    name: str  # gateway-0, triton-1, redis, ...
    pid: int
    rss: int  # bytes
    fds: int
    cpu: float  # CPU seconds since the process started
    # A gateway: of its open files, the connections the load balancer holds to it (nginx keeps up to `keepalive`
    # idle ones after a burst).
    balancer_connections: int = 0


@dataclass
class RedisMemory:
    """One reading of Redis' INFO, with the process samples."""

    time: float
    used: int  # used_memory, bytes
    maxmemory: int
    refused: int  # writes refused for lack of memory since Redis started (errorstat_OOM)


@dataclass
class NginxLine:
    end: float  # Unix seconds the request ended
    status: int
    request_time: float
    upstreams: list[str]  # each replica tried, in order
    upstream_status: str
    soak_id: str
    method: str
    uri: str

    @property
    def start(self) -> float:
        return self.end - self.request_time


@dataclass
class Slo:
    name: str
    goal: str
    measured: str
    met: bool
    kind: str = "availability"  # availability, latency, money, data, leak, capacity


@dataclass
class Phase:
    name: str
    start: float
    end: float
    kind: str  # steady, fault, recovery, capacity, warmup
    fault: FaultEvent | None = None

    def holds(self, moment: float) -> bool:
        return self.start <= moment < self.end


@dataclass
class Evidence:
    """Everything the rules read."""

    records: list[Record]
    faults: list[FaultEvent]
    warmup_end: float  # steady state starts (after the step-load phase and the warm-up)
    load_end: float
    nginx: list[NginxLine] = field(default_factory=list)
    usage_by_team: dict[str, int] = field(default_factory=dict)  # GET /v1/usage's requests per team
    answered_outside: dict[str, int] = field(default_factory=dict)  # answered requests not in `records` (seeding)
    video_status: dict[str, str] = field(default_factory=dict)  # task id -> final status seen by the client
    video_prompts: dict[str, str] = field(default_factory=dict)  # task id -> prompt
    upstream_submissions: dict[str, int] = field(default_factory=dict)  # prompt -> submissions fal saw
    missing_documents: list[str] = field(default_factory=list)  # acknowledged, not found at the end
    checked_documents: int = 0
    chat_ttft_seconds: float = 0.0  # the simulator's own time to first token
    chat_quota: tuple[int, int] = (0, 0)  # the account's (requests per second, concurrent)
    chat_upstream: tuple[int, int] = (0, 0)  # what the simulator saw outside Redis faults: (max per 1 s, max in flight)
    semantic_hits: int = 0
    false_hits: int = 0
    false_hit_examples: list[tuple[str, str]] = field(default_factory=list)  # (asked, answer generated for)
    exact_hits: int = 0
    samples: list[Sample] = field(default_factory=list)
    redis_memory: list[RedisMemory] = field(default_factory=list)
    capacity: dict[str, Any] = field(default_factory=dict)


def parse_nginx_log(path: Path) -> list[NginxLine]:
    """Lines in bench/soak/platform.py's NGINX_LOG_FORMAT; lines that do not parse are skipped."""
    lines: list[NginxLine] = []
    if not path.exists():
        return lines
    for text in path.read_text(errors="replace").splitlines():
        fields = text.split("|")
        if len(fields) != 8:
            continue
        try:
            end, status, request_time = float(fields[0]), int(fields[1]), float(fields[2])
        except ValueError:
            continue
        upstreams = [address.strip() for address in fields[3].split(",") if address.strip() not in ("", "-")]
        lines.append(NginxLine(end, status, request_time, upstreams, fields[4], fields[5], fields[6], fields[7]))
    return lines


def write_jsonl(path: Path, items: list[Any]) -> None:
    with path.open("w") as out:
        for item in items:
            out.write(json.dumps(asdict(item)) + "\n")


def read_jsonl(path: Path, kind: type[Any]) -> list[Any]:
    return [kind(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
