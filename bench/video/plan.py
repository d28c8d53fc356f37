"""What the video part measures: the submit rates, the completion run with lost webhooks, the simulated jobs'
length and the targets; by quick where a quick run differs."""

from __future__ import annotations

PART = "video"  # the CLI's part name and the result's key
API_KEY = "bench-fal-key"
JOB_SECONDS = {False: 5.0, True: 1.0}  # by quick; a real Pika job takes 10-20 s, the protocol is the same
RATES = (50.0, 200.0)
LOAD_SECONDS = {False: 10.0, True: 1.0}  # per rate and run; by quick
COMPLETION_TASKS = {False: 200, True: 20}
COMPLETION_RATE = 50.0
LOSS_RATE = 0.3
GRACE_AFTER_JOB_SECONDS = 1.0  # polling starts this long after a job should have ended: lost webhooks only
TASK_TIMEOUT_SECONDS = 60.0
DEADLINE_MARGIN_SECONDS = 15.0
WARMUP_REQUESTS = 20
TARGET_RATE = 200.0
TARGET_P99_MS = 10.0
TERMINAL = ("completed", "failed", "cancelled")
PROMPT = "a paper boat drifting on a pond at dawn, soft light"
