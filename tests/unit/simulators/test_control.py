"""The simulators' fault controls (`--control`): a soak changes the live config of a simulator in another
process and reads its stats over HTTP, ahead of the fal queue's catch-all submit route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from simulators.control import add_control_routes
from simulators.hunyuan import __main__ as hunyuan_command
from simulators.hunyuan.app import create_hunyuan_simulator
from simulators.hunyuan.config import SimulatorConfig
from simulators.pika.app import create_pika_simulator
from simulators.pika.config import PikaSimulatorConfig
from simulators.serve import command_parser


@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://simulator") as client:
            yield client


async def test_a_chat_fault_is_switched_on_and_off_through_the_config_route() -> None:
    config = SimulatorConfig()
    app = create_hunyuan_simulator(config)
    add_control_routes(app)
    body = {"model": "hy3-preview", "messages": [{"role": "user", "content": "hi"}]}
    async with served(app) as client:
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        changed = await client.patch("/_simulator/config", json={"error_rate": 1, "ttft_seconds": 0.0})
        assert changed.status_code == 200 and changed.json()["error_rate"] == 1.0
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 500
        await client.patch("/_simulator/config", json={"error_rate": 0.0})
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        stats = (await client.get("/_simulator/stats")).json()
        assert stats["requests_total"] == 3 and stats["responses_by_status"] == {"200": 2, "500": 1}
    assert config.error_rate == 0.0


async def test_an_unknown_field_or_a_wrong_type_changes_nothing() -> None:
    config = SimulatorConfig()
    app = create_hunyuan_simulator(config)
    add_control_routes(app)
    async with served(app) as client:
        unknown = await client.patch("/_simulator/config", json={"error_rate": 1.0, "no_such_field": 1})
        assert unknown.status_code == 400 and "no_such_field" in unknown.json()["error"]
        wrong = await client.patch("/_simulator/config", json={"split_utf8": "yes"})
        assert wrong.status_code == 400 and "split_utf8" in wrong.json()["error"]
    assert config.error_rate == 0.0 and config.split_utf8 is False


async def test_fal_counts_submissions_per_prompt_and_its_submit_route_does_not_shadow_the_controls() -> None:
    config = PikaSimulatorConfig(job_seconds=0.05)
    app = create_pika_simulator(config)
    add_control_routes(app)
    async with served(app) as client:
        changed = await client.patch("/_simulator/config", json={"submit_delay_seconds": 0.01})
        assert changed.status_code == 200 and changed.json()["submit_delay_seconds"] == 0.01
        for prompt in ("a cat", "a cat", "a dog"):
            submitted = await client.post("/fal-ai/pika/v2.2/text-to-video", json={"prompt": prompt})
            assert submitted.status_code == 200
        stats = (await client.get("/_simulator/stats")).json()
        assert stats["submitted"] == 3
        assert stats["submitted_by_prompt"] == {"a cat": 2, "a dog": 1}
    assert config.submit_delay_seconds == 0.01


async def test_the_controls_are_off_unless_asked_for() -> None:
    parser = command_parser(hunyuan_command.COMMAND)
    assert parser.parse_args([]).control is False
    assert parser.parse_args(["--control"]).control is True
    async with served(create_hunyuan_simulator(SimulatorConfig())) as client:
        assert (await client.get("/_simulator/stats")).status_code == 404
