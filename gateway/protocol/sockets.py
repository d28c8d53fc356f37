"""Wire models of task push over WebSocket: the watch token's answer, the client's messages, and the server's.

Every message is one JSON text frame. The client sends (on `GET /v1/ws` only):

    {"type": "subscribe", "task_ids": ["task_…"], "last_event_ids": {"task_…": 3}}
    {"type": "unsubscribe", "task_ids": ["task_…"]}

and the server sends:

    {"type": "subscribed", "task_ids": [...]}            a subscribe's answer, before any of its events
    {"type": "unsubscribed", "task_ids": [...]}
    {"type": "event", "id": 3, "task": {...}}            the task object of GET /v1/tasks/{id}; id: its version
    {"type": "done", "task_id": "task_…"}                after the final event: nothing more comes for it
    {"type": "error", "error": {...}, "task_id": "…"}    OpenAI's error object; task_id when about one task
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gateway.protocol.base import RequestModel

SUBPROTOCOL = "ai-gateway.v1"  # what the server answers in Sec-WebSocket-Protocol
TOKEN_SUBPROTOCOL_PREFIX = "token."  # a watch token offered as a subprotocol: never echoed back
MAX_TASKS_PER_MESSAGE = 100


class WatchTokenObject(BaseModel):
    object: Literal["task.watch_token"] = "task.watch_token"
    token: str = Field(
        description='Opens WebSockets on this task: offer the subprotocols ["ai-gateway.v1", "token.<token>"].'
    )
    task_id: str
    expires_at: int = Field(description="Unix seconds; after it the token opens no socket (open ones stay).")


class SubscriptionMessage(RequestModel):
    """A client's message on `GET /v1/ws`."""

    type: Literal["subscribe", "unsubscribe"]
    task_ids: list[str] = Field(min_length=1, max_length=MAX_TASKS_PER_MESSAGE)
    last_event_ids: dict[str, int] = Field(
        default_factory=dict, description="Per task, the id of the last event read: only later changes are sent."
    )
