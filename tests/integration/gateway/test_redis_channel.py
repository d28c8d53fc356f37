"""The key limits' pipelined Redis channel against a real `redis-server`: concurrent calls each get their own
reply, an error reply goes to its call only, a frozen Redis's calls fail on `reset()`, and a restarted Redis is
reconnected to."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.keys.redis_channel import PipelinedChannel
from gateway.redis_client import redis_client
from tests.helpers.conditions import until
from tests.helpers.redis_fixtures import RedisServer


async def test_concurrent_calls_get_their_own_replies(own_redis: RedisServer) -> None:
    async with asyncio.timeout(30):
        client = redis_client(own_redis.url, 2.0)
        channel = PipelinedChannel(client)
        try:
            replies = await asyncio.gather(*(channel.execute("INCRBY", f"n{i % 7}", i) for i in range(300)))
            error = None
            try:
                await channel.execute("INCRBY", "n0", "not-a-number")
            except ResponseError as exc:
                error = exc
            after = await channel.execute("GET", "n0")
        finally:
            await channel.aclose()
            await client.aclose()
    # Each call its own INCRBY's reply: the running sum of its counter, in the order the calls were sent.
    assert replies == [sum(range(i % 7, i + 1, 7)) for i in range(300)]
    assert after == str(sum(range(0, 300, 7))).encode()
    assert error is not None, "the error reply reached its call"


async def test_reset_fails_the_calls_a_frozen_redis_holds_and_a_restarted_one_is_reconnected(
    own_redis: RedisServer,
) -> None:
    async with asyncio.timeout(30):
        client = redis_client(own_redis.url, 2.0)
        channel = PipelinedChannel(client)
        try:
            await channel.execute("SET", "k", "1")
            own_redis.freeze()
            waiting = asyncio.ensure_future(channel.execute("GET", "k"))
            await until(lambda: len(channel._waiting) == 1, what="the GET sent to the frozen Redis")
            channel.reset()
            failure = (await asyncio.gather(waiting, return_exceptions=True))[0]
            own_redis.thaw()
            own_redis.stop()
            own_redis.start()
            await channel.execute("SET", "k", "2")  # a new connection to the new server
            value = await channel.execute("GET", "k")
        finally:
            await channel.aclose()
            await client.aclose()
    assert isinstance(failure, RedisConnectionError)
    assert value == b"2"
