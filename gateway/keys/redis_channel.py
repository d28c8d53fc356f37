"""`PipelinedChannel`: one Redis connection on which calls are pipelined: each call writes its command at once and
waits for its reply, which one reader task matches to the calls in the order they were sent.

It carries the key limits' script, run on every request: a call checks out no pool connection and starts no task
or timer of redis-py's (the caller's `RedisConnection.call` bounds its wait) and is packed by hiredis in C, so it
costs little Python on top of the round trip, and concurrent calls share the socket. The connection is opened with
the client's own settings (address, TLS, password, database) on first use, and again after a failure; a failure,
or `reset()`, fails every call waiting on that connection.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class ChannelResetError(RedisConnectionError):
    """A call that was waiting on a connection `reset()` dropped (after a call on it timed out); unlike a lost
    connection, it is not tried again.

    Do: nothing: its caller treats it as a failed Redis call, and the next call opens a new connection.
    """


class PipelinedChannel:
    def __init__(self, client: aioredis.Redis) -> None:
        pool = client.connection_pool
        # No socket timeout (the reader waits for replies however long the connection is idle) and no health
        # check (its PING would take a reply meant for a call).
        self._settings = {**pool.connection_kwargs, "socket_timeout": None, "health_check_interval": 0}
        self._connection_class = pool.connection_class
        self._connection: AbstractConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._connecting = asyncio.Lock()

    def __repr__(self) -> str:
        return "PipelinedChannel()"  # no address: the settings may hold a password

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply (a Redis error reply is raised). A lost connection is tried
        once more on a new one, as redis-py's pool retries: one that died while idle (a Redis restart) is only
        found out by the call that writes to it."""
        try:
            return await self._send(args)
        except ChannelResetError:
            raise
        except RedisConnectionError:
            return await self._send(args)

    async def _send(self, args: tuple[Any, ...]) -> Any:
        connection = self._connection
        if connection is None or not connection.is_connected:
            connection = await self._connect()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        # Connected: the write happens now, with no await before it, so the replies' order is the calls' order.
        await connection.send_packed_command(hiredis.pack_command(args), check_health=False)
        return await waiter

    def reset(self) -> None:
        """Drop the connection (e.g. after a call timed out on it: it may never answer); the next call opens one."""
        if self._reader is not None:
            self._reader.cancel()

    async def aclose(self) -> None:
        self.reset()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _connect(self) -> AbstractConnection:
        async with self._connecting:
            if self._connection is not None and self._connection.is_connected:
                return self._connection
            connection = self._connection_class(**self._settings)
            try:
                await connection.connect()  # type: ignore[no-untyped-call]
            except BaseException:  # e.g. the caller's deadline, on a Redis that accepts but does not answer
                await connection.disconnect(nowait=True)
                raise
            self._connection = connection
            self._reader = asyncio.ensure_future(self._read(connection))
            return connection

    async def _read(self, connection: AbstractConnection) -> None:
        try:
            while True:
                try:
                    reply: Any = await connection.read_response(timeout=math.inf)
                except ResponseError as exc:  # the reply is an error: it belongs to its call
                    reply = exc
                waiter = self._waiting.popleft()
                if not waiter.done():  # its caller may have given up waiting
                    if isinstance(reply, Exception):
                        waiter.set_exception(reply)
                    else:
                        waiter.set_result(reply)
        except BaseException as exc:
            self._failed(connection, exc)
            await connection.disconnect(nowait=True)
            if not isinstance(exc, Exception):
                raise

    def _failed(self, connection: AbstractConnection, exc: BaseException) -> None:
        if self._connection is connection:
            self._connection = None
        waiting, self._waiting = self._waiting, deque()
        for waiter in waiting:
            if not waiter.done():
                if isinstance(exc, asyncio.CancelledError):
                    waiter.set_exception(ChannelResetError("Redis connection dropped (a call on it timed out)"))
                else:
                    waiter.set_exception(RedisConnectionError(f"Redis connection lost ({type(exc).__name__})"))
