"""Part 3, video (generation through fal, Pika text-to-video by default, behind `/v1/images/generations`): how fast a
generation request is accepted, and whether every task ends when webhooks get lost.

- Submit latency: `POST /v1/images/generations` (202 once the task is stored; the upstream call happens
  later) in an open loop at 50 and 200 requests/s, p50/p99 from the scheduled send to the answer. With
  the SQLite task store and, where `redis-server` is installed, the Redis one. The Pika simulator runs
  5 s jobs and sends signed webhooks, so meanwhile the gateway also submits upstream and takes callbacks.
- Completion: tasks submitted at 50/s while the simulator loses 30 % of the webhooks, each watched over
  SSE until it ends. Time to completion (send to the final event), wall clock, lost tasks (every job
  succeeds upstream, so a task not `completed` by its deadline is lost) and the tasks the gateway found
  by polling (`gateway_video_tasks_completed_by_polling_total`).

The part was named `images` before 0.2 (`make bench-images` still runs it). The modules: `plan` (rates, job
length, targets), `servers` (simulator, gateway, redis-server), `submits` (submit latency), `completion`
(tasks followed to their end), `report` (table, targets, notes) and `part` (the run).

    python -m bench video [--runs 3] [--quick] [--out DIR]
"""

from __future__ import annotations

from bench.video.part import run

__all__ = ["run"]
