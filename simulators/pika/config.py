"""How the simulated Pika-on-fal behaves: job timing and the faults it is told to inject."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL_PATH = "fal-ai/pika/v2.2/text-to-video"


@dataclass
class PikaSimulatorConfig:
    """How the simulated Pika-on-fal behaves. Mutable at run time: a job reads it when it is submitted."""

    api_key: str | None = None  # the only accepted `Authorization: Key` key; None accepts any or none
    job_seconds: float = 0.3  # submission to end of job
    submit_delay_seconds: float = 0.0  # how long the submit call takes to answer (a slow upstream)
    status_delay_seconds: float = 0.0  # how long a status call takes to answer
    status_failure_rate: float = 0.0  # probability a status call answers 503
    queue_fraction: float = 0.3  # the first part of job_seconds spent IN_QUEUE, the rest IN_PROGRESS
    failure_rate: float = 0.0  # probability a job ends in ERROR
    fail_next: int = 0  # the next N jobs end in ERROR (decremented per job)
    error_message: str = "Simulated Pika generation failure"
    callback_loss_rate: float = 0.0  # probability a job's webhook is never sent
    duplicate_callbacks: bool = False  # send each webhook twice
    out_of_order: bool = False  # after the final webhook, send a stale copy (older timestamp, signed)
    out_of_order_age_seconds: int = 30  # how much older the stale copy's timestamp is
    callback_delay_seconds: float = 0.0  # between the end of a job and its webhook
    callback_attempts: int = 3  # tries per webhook delivery (exception, timeout or non-2xx: try again)
    callback_retry_seconds: float = 0.1  # pause between tries
    callback_timeout_seconds: float = 5.0
    payload_errors: bool = False  # OK webhooks carry "payload": null and a payload_error (fal could not attach it)
    sign_with_wrong_key: bool = False  # sign webhooks with a key not in the JWKS (forged)
    stale_timestamp_seconds: int = 0  # shift the webhook timestamp (negative: into the past)
    user_id: str = "sim-user"
    seed: int = 0  # seeds the random failures and losses (changing it reseeds)
    video_base_url: str = "https://v3.fal.media/files/pika-sim"
