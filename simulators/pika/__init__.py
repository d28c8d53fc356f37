"""A simulator of Pika's video API as fal.ai serves it (the fal queue protocol), for the tests and the demo.

It speaks the real protocol:

- `POST /{model_path}?fal_webhook=<url>` (any path, e.g. `fal-ai/pika/v2.2/text-to-video`; header
  `Authorization: Key <key>`; a JSON body with `prompt` etc.) queues a job and answers
  `{"request_id", "status_url", "response_url", "cancel_url", "queue_position"}`. The URLs use the app id,
  the first two segments of the path: `/{owner}/{app}/requests/{request_id}[/status|/cancel]`.
- `GET .../requests/{id}/status` answers `{"status": "IN_QUEUE", "queue_position": n}`, `{"status":
  "IN_PROGRESS"}` or `{"status": "COMPLETED"}` (a job is IN_QUEUE for `queue_fraction` of `job_seconds`).
- `GET .../requests/{id}` answers the result `{"video": {"url": ...}}` once the job succeeded, 400
  `{"detail": "request is still in progress"}` before, or for a failed job 500 `{"detail": <error>}`
  (a cancelled one: 400 `{"detail": "request was cancelled"}`).
- `PUT .../requests/{id}/cancel` answers 202 `{"status": "CANCELLATION_REQUESTED"}` if not completed
  (the job then ends in ERROR), else 400 `{"status": "ALREADY_COMPLETED"}`.
- Unknown request ids answer 404, a wrong key 401 `{"detail": ...}`.
- When a job ends it POSTs the webhook to `fal_webhook`: JSON `{"request_id", "gateway_request_id",
  "status": "OK"|"ERROR", "payload": result|null, "error": str|null}` with the headers
  `X-Fal-Webhook-Request-Id`, `-User-Id`, `-Timestamp` (unix seconds) and `-Signature`: the hex Ed25519
  signature of `"\\n".join([request_id, user_id, timestamp, sha256_hex(raw_body)])` (see `webhook_message`).
- `GET /.well-known/jwks.json` publishes the simulator's Ed25519 public key (`kid` "sim-1").
- `GET /v1/models/requests/by-endpoint` is fal's Platform API request history (on api.fal.ai there; here beside the
  queue, same key): the ended jobs of an endpoint, paginated, with their input and output under `expand=payloads`
  (see `platform`).

On request it misbehaves: slow submits, slow or failing (503) status calls, failed jobs (`failure_rate`,
`fail_next`), lost webhooks, duplicated webhooks, a stale copy sent after the final webhook (`out_of_order`),
late webhooks, forged signatures and stale timestamps. Webhooks are retried (`callback_attempts`) when the
receiver fails or answers non-2xx.

`PikaSimulatorConfig` may be changed while the server runs (a job reads it when it is submitted);
`PikaSimulatorStats` (`app.state.stats`) records what happened.

The modules: `config` (what to simulate), `stats` (what happened), `jobs` (one job, its states and result),
`fal_queue` (the jobs' lives and the random faults), `webhooks` (signing, the JWKS, delivery), `platform` (the
request history), `app` (the routes and `create_pika_simulator`).

Standalone: `python -m simulators.pika --host 127.0.0.1 --port 9200 --job-seconds 5` (`__main__`).
"""

from __future__ import annotations

from simulators.pika.app import create_pika_simulator
from simulators.pika.config import DEFAULT_MODEL_PATH, PikaSimulatorConfig
from simulators.pika.jobs import CANCELLED, COMPLETED, FAILED, IN_PROGRESS, IN_QUEUE
from simulators.pika.stats import PikaSimulatorStats
from simulators.pika.webhooks import JWKS_PATH, KEY_ID, public_jwk, webhook_message

__all__ = [
    "CANCELLED",
    "COMPLETED",
    "DEFAULT_MODEL_PATH",
    "FAILED",
    "IN_PROGRESS",
    "IN_QUEUE",
    "JWKS_PATH",
    "KEY_ID",
    "PikaSimulatorConfig",
    "PikaSimulatorStats",
    "create_pika_simulator",
    "public_jwk",
    "webhook_message",
]
