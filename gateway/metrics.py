"""Every metric the gateway exports, declared once (prefix `gateway_`, Prometheus suffixes).

`http_requests_in_flight` keeps its contract name: the autoscaler reads it.
Failure counters carry a bounded `reason` label. The families renamed in 0.4 (`gateway_llm_*` -> `gateway_chat_*`,
`gateway_image_*` -> `gateway_video_*`) are also exported under their old names for one release
(`RenamedFamilies`), so that dashboards and alerts can move at their own pace.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

HTTP_IN_FLIGHT = Gauge(
    "http_requests_in_flight", "HTTP requests and gRPC calls being served now (the autoscaling signal)."
)
HTTP_LATENCY = Histogram(
    "gateway_http_request_duration_seconds",
    "HTTP request latency by route template and status.",
    ["method", "route", "status"],
    buckets=LATENCY_BUCKETS,
)
GRPC_LATENCY = Histogram(
    "gateway_grpc_request_duration_seconds",
    "gRPC call latency by method and code.",
    ["method", "code"],
    buckets=LATENCY_BUCKETS,
)
REQUESTS_SHED = Counter(
    "gateway_requests_shed_total",
    "Requests refused with 429 because their in-flight limit (requests or watchers) was full.",
)
TASK_WATCHERS = Gauge(
    "gateway_task_watchers",
    "Task watchers now: event streams (REST and gRPC) and WebSocket subscriptions (at least one a socket); not in "
    "http_requests_in_flight.",
)
TASK_SOCKETS = Gauge("gateway_task_sockets", "Task WebSockets open now (GET /v1/tasks/{id}/ws and /v1/ws).")
TASK_SOCKET_CLOSES = Counter(
    "gateway_task_socket_closes_total",
    "Task WebSockets ended, by the gateway's close code (1000 the task ended, 1008 refused: credentials, limits, a "
    "bad request; 1011 and 1013 an error), or `client` where the client closed or vanished first.",
    ["code"],
)

CACHE_LOOKUPS = Counter(
    "gateway_cache_lookups_total", "Cache lookups per text by cache and result.", ["cache", "result"]
)  # result: hit | miss
CACHE_ERRORS = Counter(
    "gateway_cache_errors_total", "Cache store failures (served without the cache).", ["cache", "operation"]
)  # operation: get | set

TRITON_LATENCY = Histogram(
    "gateway_triton_request_duration_seconds", "Latency of one Triton inference call.", buckets=LATENCY_BUCKETS
)
TRITON_ERRORS = Counter("gateway_triton_errors_total", "Failed Triton calls by reason.", ["reason"])
# reason: unavailable | timeout | invalid | queue_full | error
MODEL_QUEUE_REJECTIONS = Counter(
    "gateway_model_queue_rejections_total",
    "Calls refused with 429 because a model queue was full: the gateway's own for embeddings (more encoding "
    "waiting than TRITON_MAX_QUEUE_SECONDS) or Triton's (its queue policy; once per refusal the caller gets, not "
    "for one another Triton then served).",
    ["queue"],
)  # queue: gateway | triton
TRITON_UP = Gauge(
    "gateway_triton_up", "0 while no Triton address is reachable and serving the model (uncached embeddings 503)."
)
TRITON_ADDRESSES = Gauge(
    "gateway_triton_addresses", "Triton addresses known to the gateway, by state.", ["state"]
)  # state: serving | out (out of rotation until the model is ready there again)
TRITON_RETRIES = Counter(
    "gateway_triton_retries_total", "Triton calls tried again on another Triton after the first one was unavailable."
)
TRITON_CHANNELS = Gauge(
    "gateway_triton_channels",
    "gRPC channels to Triton open now: one per address, and one more while a replaced one finishes its calls.",
)
TRITON_IN_FLIGHT_LIMIT = Gauge(
    "gateway_triton_in_flight_limit",
    "Coalesced embedding calls the gateway keeps in flight to Triton now: TRITON_MAX_IN_FLIGHT_CALLS, lower while "
    "every Triton is throttled (reranks and chunker calls are not limited by it).",
)
GPU_STATE = Gauge(
    "gateway_gpu_state", "1 for each state a GPU under Triton is in now, by GPU UUID.", ["gpu", "state"]
)  # state: normal | degraded (memory high: bulk work refused) | throttled (hot: fewer Triton calls in flight)
GPU_MEMORY_USED_RATIO = Gauge(
    "gateway_gpu_memory_used_ratio",
    "A GPU's used memory over its budget (GPU_MEMORY_BUDGET_BYTES, else its total).",
    ["gpu"],
)
GPU_TEMPERATURE = Gauge("gateway_gpu_temperature_celsius", "A GPU's temperature (from the DCGM exporter).", ["gpu"])
GPU_REFUSALS = Counter(
    "gateway_gpu_refusals_total", "Requests refused with 503 gpu_memory_high, by work.", ["work"]
)  # work: embeddings | upsert | rerank
EMBEDDING_BATCH_SIZE = Histogram(
    "gateway_embedding_batch_size", "Texts per Triton call (after cache hits are removed).", buckets=BATCH_BUCKETS
)
EMBEDDING_COALESCED_REQUESTS = Histogram(
    "gateway_embedding_coalesced_requests",
    "Requests merged into one Triton call because every call slot was busy.",
    buckets=BATCH_BUCKETS,
)
EMBEDDING_TEXTS_TRUNCATED = Counter("gateway_embedding_texts_truncated_total", "Texts cut at the model's max tokens.")

SEARCH_STORE_LATENCY = Histogram(
    "gateway_search_store_duration_seconds",
    "Latency of one vector store call by store (embedded | milvus) and operation (search, upsert, ...).",
    ["store", "operation"],
    buckets=LATENCY_BUCKETS,
)
SEARCH_STORE_ERRORS = Counter(
    "gateway_search_store_errors_total", "Failed vector store calls (answered 503).", ["store", "operation"]
)
REINDEX_SCAN_FAILURES = Counter(
    "gateway_reindex_scan_failures_total",
    "Scans for re-index jobs that failed (the next scan tries again), by reason: store (the job store did not "
    "answer) | internal (any other exception, logged with its traceback).",
    ["reason"],
)

CHAT_UPSTREAM_CALLS = Counter(
    "gateway_chat_upstream_calls_total",
    "Chat calls that reached the upstream, by model and serving host.",
    ["model", "host"],
)
CHAT_UPSTREAM_ERRORS = Counter(
    "gateway_chat_upstream_errors_total", "Failed chat upstream attempts by reason and host.", ["reason", "host"]
)
# reason: timeout | connection | stream_broken | <HTTP status>; host: host[:port] of a configured base URL (never
# a string a client sent)
CHAT_TOKENS = Counter("gateway_chat_tokens_total", "Tokens billed by the upstream.", ["model", "kind"])
# kind: prompt | completion | reasoning (part of completion, as OpenAI counts it)
CHAT_SAVED_CALLS = Counter("gateway_chat_calls_saved_total", "Chat calls answered by a cache layer.", ["layer"])
CHAT_SAVED_TOKENS = Counter(
    "gateway_chat_tokens_saved_total", "Upstream tokens not spent thanks to a cache layer.", ["layer"]
)
# layer: exact | semantic
QUOTA_WAIT = Histogram(
    "gateway_quota_wait_seconds", "Time a call waited for an upstream quota slot.", ["limiter"], buckets=LATENCY_BUCKETS
)
QUOTA_WAITS = Counter(
    "gateway_quota_waits_total",
    "Times a call had to wait for an upstream quota slot, by the limit that held it back (rate, concurrency, tokens).",
    ["limiter", "reason"],
)
QUOTA_REFUSALS = Counter(
    "gateway_quota_refusals_total", "Calls refused (429) for want of a quota slot.", ["limiter", "reason"]
)  # reason: rate | concurrency | tokens | queue
QUOTA_FALLBACKS = Counter(
    "gateway_quota_fallbacks_total", "Slots granted by this replica alone because Redis failed.", ["limiter"]
)
QUOTA_DEGRADED = Gauge("gateway_quota_degraded", "1 while the shared quota falls back to this replica.", ["limiter"])
REDIS_CIRCUIT_OPEN = Gauge(
    "gateway_redis_circuit_open",
    "1 while calls to a Redis client are skipped after a failure (its circuit is open or probing), else 0.",
    ["client"],
)
REDIS_POOL_BUSY = Counter(
    "gateway_redis_pool_busy_total",
    "Redis calls that failed because every pooled connection stayed in use for the call's timeout (not counted "
    "as a Redis outage).",
)
REDIS_CALL_FAILURES = Counter(
    "gateway_redis_call_failures_total",
    "Redis calls of the gateway's users that got no answer, by client and reason: timeout (fails alone; a health "
    "PING follows) | pool_busy (fails alone) | connection (refused or reset: opens the circuit).",
    ["client", "reason"],
)
BREAKER_STATE = Gauge("gateway_chat_breaker_open", "1 while a model's circuit breaker is open.", ["model"])
HOST_BREAKER_STATE = Gauge(
    "gateway_chat_host_breaker_open", "1 while a chat upstream host's circuit breaker is open.", ["host"]
)

TASK_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)
VIDEO_TASKS = Gauge(
    "gateway_video_tasks", "Unfinished video tasks in the store by state (seen by this replica).", ["state"]
)
VIDEO_TASK_TRANSITIONS = Counter(
    "gateway_video_task_transitions_total", "Video tasks moved into a state by this replica.", ["state"]
)
VIDEO_TASK_DURATION = Histogram(
    "gateway_video_task_duration_seconds", "Task creation to its end, by final state.", ["state"], buckets=TASK_BUCKETS
)
VIDEO_SUBMIT_LATENCY = Histogram(
    "gateway_video_submit_duration_seconds",
    "Time to accept a generation request (store write, no upstream call).",
    buckets=LATENCY_BUCKETS,
)
VIDEO_UPSTREAM_SUBMITS = Counter(
    "gateway_video_upstream_submits_total", "Submissions to the video upstream by result.", ["result"]
)  # result: accepted | retry | rejected | unknown (cut off: the upstream may have the job; video/submitter.py)
VIDEO_CALLBACKS = Counter("gateway_video_callbacks_total", "Webhook calls received, by result.", ["result"])
# result: applied | adopted (the job of a submit whose answer was lost) | duplicate | stale | rejected (signature)
# | bad_token (wrong or missing URL token: refused before anything else) | unknown_task
VIDEO_ORPHAN_JOBS = Counter(
    "gateway_video_orphan_jobs_total", "Upstream jobs found running for a task that tracks another one; cancelled."
)
VIDEO_LOST_JOB_LOOKUPS = Counter(
    "gateway_video_lost_job_lookups_total",
    "Lookups in fal's request history for the job of a submit whose answer was lost, by result.",
    ["result"],
)  # result: found (adopted) | not_found (looked again later, or submitted again) | unavailable (as not_found)
VIDEO_TASKS_COMPLETED_BY_POLLING = Counter(
    "gateway_video_tasks_completed_by_polling_total", "Tasks whose webhook never came: their end was found by polling."
)
VIDEO_SCAN_FAILURES = Counter(
    "gateway_video_scan_failures_total",
    "Scans for due video tasks that failed (the next scan tries again), by reason: store (the task store did not "
    "answer) | internal (any other exception, logged with its traceback).",
    ["reason"],
)
VIDEO_POLLS = Counter("gateway_video_polls_total", "Status polls of the video upstream by result.", ["result"])
# result: in_queue | in_progress | completed | failed (the job ended in an error) | error (the poll failed)

# Usage per team (teams come from the keys file and the admin API, never from a client: the label set is bounded).
USAGE_REQUESTS = Counter("gateway_usage_requests_total", "Answered requests by team.", ["team"])
USAGE_TOKENS = Counter("gateway_usage_tokens_total", "Tokens used by team and kind.", ["team", "kind"])
# kind: prompt | completion | reasoning | embedding
USAGE_COST = Counter(
    "gateway_usage_cost_total", "Cost of the answered requests by team (GATEWAY_PRICES' currency).", ["team"]
)
USAGE_WRITE_ERRORS = Counter("gateway_usage_write_errors_total", "Usage records that could not be stored.")
USAGE_SPOOLED = Counter(
    "gateway_usage_spooled_total", "Usage records Redis did not take, kept in the local spool to be replayed."
)
USAGE_REPLAYED = Counter("gateway_usage_replayed_total", "Spooled usage records written to Redis.")
USAGE_SPOOL_DROPPED = Counter(
    "gateway_usage_spool_dropped_total", "Usage records dropped because the spool was full (lost)."
)


class RenamedFamilies(Collector):
    """`families` again under their names before 0.2 (`renamed`: new prefix -> old prefix), marked deprecated."""

    def __init__(self, families: list[Counter | Gauge | Histogram], renamed: dict[str, str]) -> None:
        self._families = families
        self._renamed = renamed

    def _old(self, name: str) -> str:
        for new, old in self._renamed.items():
            if name.startswith(new):
                return old + name.removeprefix(new)
        return name

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            for metric in family.collect():
                old = Metric(self._old(metric.name), f"Deprecated: {metric.name}. {metric.documentation}", metric.type)
                old.samples = [sample._replace(name=self._old(sample.name)) for sample in metric.samples]
                yield old


RENAMED_PREFIXES = {"gateway_chat_": "gateway_llm_", "gateway_video_": "gateway_image_"}
REGISTRY.register(
    RenamedFamilies(
        [
            metric
            for metric in list(globals().values())
            if isinstance(metric, Counter | Gauge | Histogram)
            and next(iter(metric.describe())).name.startswith(tuple(RENAMED_PREFIXES))
        ],
        RENAMED_PREFIXES,
    )
)
