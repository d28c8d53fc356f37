"""One replica of the gateway's quota limiter in its own OS process, for tests/integration/gateway/test_quota_redis.py.

    python -m tests.helpers.quota_worker burst URL [options]   # prints "ready", waits for a line on stdin, fires
                                                       # --count calls at once, prints one JSON object
    python -m tests.helpers.quota_worker hold URL [options]    # takes one slot, prints "held", sleeps until killed

Each call records the Redis time of its admission and the wall-clock span it spent inside the block,
so the test can check the rate on Redis' clock and the concurrency on the one machine's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from gateway.errors import OverloadedError
from gateway.quota import QuotaConfig, RedisQuotaLimiter


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.quota_worker")
    parser.add_argument("mode", choices=["burst", "hold"])
    parser.add_argument("url")
    parser.add_argument("--name", default="test")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=5)
    parser.add_argument("--max-wait", type=float, default=30.0)
    parser.add_argument("--lease", type=float, default=120.0)
    parser.add_argument("--short-hold", type=float, default=0.02, help="seconds in the block for even calls")
    parser.add_argument("--long-hold", type=float, default=0.15, help="seconds in the block for odd calls")
    return parser.parse_args(argv)


def make_limiter(args: argparse.Namespace) -> RedisQuotaLimiter:
    config = QuotaConfig(
        requests_per_second=args.rps,
        max_concurrent=args.concurrency,
        max_wait_seconds=args.max_wait,
        lease_seconds=args.lease,
    )
    return RedisQuotaLimiter(args.url, config, name=args.name)


async def call(limiter: RedisQuotaLimiter, hold_seconds: float) -> dict[str, Any] | None:
    try:
        async with limiter.slot() as slot:
            entered = time.time()
            await asyncio.sleep(hold_seconds)
            return {"admitted_at": slot.admitted_at, "shared": slot.shared, "span": [entered, time.time()]}
    except OverloadedError:
        return None


async def burst(args: argparse.Namespace) -> dict[str, Any]:
    async with make_limiter(args) as limiter:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        holds = [args.long_hold if i % 2 else args.short_hold for i in range(args.count)]
        outcomes = await asyncio.gather(*(call(limiter, seconds) for seconds in holds))
    calls = [outcome for outcome in outcomes if outcome is not None]
    return {"calls": calls, "refused": len(outcomes) - len(calls)}


async def hold(args: argparse.Namespace) -> None:
    async with make_limiter(args) as limiter, limiter.slot():
        print("held", flush=True)
        await asyncio.sleep(3600)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.mode == "hold":
        asyncio.run(hold(args))
        return
    print(json.dumps(asyncio.run(burst(args))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
