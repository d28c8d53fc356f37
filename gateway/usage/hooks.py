"""What a route calls once it has answered: `record_usage(request, model, Usage(...))` adds the request to its
key's usage record and returns the `X-Request-Cost` header (empty when the model has no price);
`await record_usage_durably(...)` does the same and returns once the record is stored."""

from __future__ import annotations

from starlette.requests import Request

from gateway.keys.middleware import request_key
from gateway.usage.pricing import format_cost
from gateway.usage.record import Usage
from gateway.usage.recorder import UsageRecorder


def usage_recorder(request: Request) -> UsageRecorder:
    recorder: UsageRecorder = request.app.state.usage
    return recorder


def record_usage(request: Request, model: str, usage: Usage, *, request_id: str | None = None) -> dict[str, str]:
    priced, has_price = usage_recorder(request).record(request_key(request), model, usage, request_id)
    return cost_header(priced) if has_price else {}


async def record_usage_durably(
    request: Request, model: str, usage: Usage, *, request_id: str | None = None
) -> dict[str, str]:
    """`record_usage`, returning once the record is stored: for paid answers (chat, video)."""
    recorder = usage_recorder(request)
    priced, has_price = await recorder.record_durably(request_key(request), model, usage, request_id)
    return cost_header(priced) if has_price else {}


def cost_header(usage: Usage) -> dict[str, str]:
    return {"X-Request-Cost": format_cost(usage.cost)}
