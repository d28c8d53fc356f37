"""A video generation task: its states, the only moves between them, and its record.

    pending ──> processing ──> completed
       │            │
       └────────────┴──────> failed | cancelled

A submit call is recorded before it is made (`attempt`, `submitting_since`), so after a crash a task
whose last call's outcome is unknown is not blindly submitted again (`VideoSubmitter`).

States only move forward; a terminal task never changes again. Every saved change bumps
`version`, and stores save with compare-and-set on it, so two replicas (or a webhook and a
poller) racing on one task cannot both win.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any


class TaskState(str, Enum):
    PENDING = "pending"  # stored and queued; not yet accepted by the upstream
    PROCESSING = "processing"  # the upstream has the job (its request id is on the task)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


# The replica that accepts a task queues it at once; other replicas' scanners only look at it once it has been
# pending this long (its replica may have died), so a healthy replica's fresh tasks are not read by every scan.
PENDING_PICKUP_SECONDS = 5.0
TERMINAL_STATES = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED})
OPEN_STATES = tuple(state for state in TaskState if state not in TERMINAL_STATES)  # pending, processing
_NEXT: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.PROCESSING, *TERMINAL_STATES}),
    TaskState.PROCESSING: TERMINAL_STATES,
}


def can_move(current: TaskState, new: TaskState) -> bool:
    """True for the forward moves only (staying in a non-terminal state is an update, not a move)."""
    return (new == current and not current.terminal) or new in _NEXT.get(current, frozenset())


class IllegalTransitionError(ValueError):
    """A change that would move a task backwards or out of a terminal state: a bug in the caller, which no
    client input can cause.

    Do: report it with the traceback; the task stays as it was.
    """


@dataclass(frozen=True)
class TaskError:
    code: str  # bounded: timeout | upstream_error | upstream_rejected | cancelled
    message: str


@dataclass(frozen=True)
class Task:
    """One task record. Times are Unix seconds (float) so replicas on different hosts agree."""

    id: str
    state: TaskState
    arguments: dict[str, Any]  # what is sent to the upstream
    created_at: float
    updated_at: float
    deadline_at: float  # past it, an unfinished task fails with reason "timeout"
    version: int = 0
    idempotency_key: str | None = None  # already scoped to the caller (a hash), never the raw header
    request_hash: str | None = None  # of the client's request, to refuse a reused key with another body
    upstream_request_id: str | None = None
    status_url: str | None = None
    response_url: str | None = None
    cancel_url: str | None = None
    submit_attempts: int = 0
    attempt: int = 0  # the latest submit attempt started (its number is in the job's webhook URL)
    submitting_since: float | None = None  # set, durably, before a submit call; cleared when its outcome is known
    next_attempt_at: float | None = None  # a pending task whose submission failed is retried from then
    submitted_at: float | None = None  # when the upstream accepted the job
    poll_after: float | None = None  # the next status poll is due then (no callback has come)
    polls: int = 0
    ended_at: float | None = None
    expires_at: float | None = None  # set when the task ends: `ended_at` + retention
    result: dict[str, Any] | None = None  # the upstream's payload, as it gave it
    error: TaskError | None = None
    completed_by: str | None = None  # callback | polling (which path delivered the outcome)

    @staticmethod
    def new_id() -> str:
        return f"task_{uuid.uuid4().hex}"

    @property
    def due_at(self) -> float:
        """When a scanner must look at this unfinished task next: its deadline, or sooner its next submit
        attempt (pending) or its next status poll (processing). Stores index unfinished tasks by it."""
        if self.state == TaskState.PENDING:
            due = self.next_attempt_at if self.next_attempt_at is not None else self.created_at + PENDING_PICKUP_SECONDS
        else:
            due = self.poll_after if self.poll_after is not None else self.deadline_at
        return min(due, self.deadline_at)

    def moved(self, state: TaskState, now: float, **changes: Any) -> Task:
        """A copy in `state` with `changes`, next version; raises on a backward move."""
        if not can_move(self.state, state):
            raise IllegalTransitionError(f"task {self.id} cannot move from {self.state.value} to {state.value}")
        return dataclasses.replace(self, state=state, updated_at=now, version=self.version + 1, **changes)

    def to_json(self) -> str:
        # Not dataclasses.asdict, which deep-copies arguments and result first: several times the cost of this.
        error = dataclasses.asdict(self.error) if self.error is not None else None
        record = {**vars(self), "state": self.state.value, "error": error}
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Task:
        record = json.loads(text)
        record["state"] = TaskState(record["state"])
        if record.get("error") is not None:
            record["error"] = TaskError(**record["error"])
        return cls(**record)
