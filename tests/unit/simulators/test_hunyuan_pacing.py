"""The Hunyuan simulator's pacing: pieces leave on the model's schedule, whatever delays one of them."""

from __future__ import annotations

import time

from simulators.hunyuan.config import SimulatorConfig
from simulators.hunyuan.pacing import events
from simulators.hunyuan.replies import answer


async def test_a_late_piece_does_not_push_the_rest_of_the_stream_back() -> None:
    config = SimulatorConfig(tokens_per_second=100, reply="一二三四五六七八九十一二三四五六七八九十")
    body = {"model": "hy3-preview", "messages": [{"role": "user", "content": "hi"}]}
    reply = answer(body, config)
    assert reply.piece_count >= 11  # at least 100 ms of pieces, 10 ms apart
    arrivals: list[float] = []
    async for _ in events(reply, config, include_usage=False):
        arrivals.append(time.monotonic())
        if len(arrivals) == 3:
            time.sleep(0.06)  # the simulator's loop is held up (blocked, on purpose) for six pieces' time, once
    schedule = (reply.piece_count - 1) / 100
    # Sleeping one interval per piece would end 60 ms later than the schedule; pieces on their deadlines catch up.
    assert arrivals[-1] - arrivals[1] < schedule + 0.03
    assert arrivals[-1] - arrivals[1] >= schedule - 0.005
