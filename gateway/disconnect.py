"""Cancel work whose client has gone: a non-streamed answer that nobody will read.

Uvicorn goes on running a handler after its client disconnects; for a long call (a chat completion
can take a minute) that holds an upstream request and a quota slot for nothing. A streamed answer
notices at its next write; this is for answers sent in one piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from gateway.errors import ClientClosedRequestError

T = TypeVar("T")


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result; when the client disconnects first, `work` is cancelled (and waited for, so its
    clean-up has run) and `ClientClosedRequestError` raised. Call it once the request body has been read:
    from then on `receive` returns only `http.disconnect` (at a disconnect, or when the response is done)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request was cancelled (its deadline): its work goes with it
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))
        raise ClientClosedRequestError("the client closed the connection before the answer was ready")
    return task.result()


async def disconnected(receive: Receive) -> None:
    """Return when the client has disconnected (or the response is done: then `receive` says so too)."""
    while (await receive())["type"] != "http.disconnect":
        pass
