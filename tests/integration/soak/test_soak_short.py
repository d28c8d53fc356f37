"""The soak's short version: the whole platform (nginx, 2 gateway replicas, 2 Tritons, Redis, Milvus standalone,
the simulators) under mixed traffic from five teams while a gateway replica is SIGKILLed, a Triton is stopped
gracefully and started again, and Redis is paused (SIGSTOP) for 10 s. The availability, money and data rules must
hold; the latency figures are the full soak's (`make soak`), not judged on this shared machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.soak.part import run_soak, short_options


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment names `text` (every process of a run names its folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for part in ("cmdline", "environ"):
            try:
                if text.encode() in Path(f"/proc/{entry}/{part}").read_bytes():
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found


@pytest.mark.slow
async def test_no_request_task_or_record_is_lost_through_a_replica_kill_a_triton_stop_and_a_redis_pause(
    minilm_repository: Path, tmp_path: Path
) -> None:
    out = await run_soak(short_options(tmp_path / "soak", minilm_repository))

    report = json.loads((out / "soak.json").read_text())
    assert [(fault["name"], fault.get("error")) for fault in report["faults"]] == [
        ("gateway SIGKILL", None),
        ("triton SIGTERM", None),
        ("redis SIGSTOP 10 s", None),
    ]
    assert report["restarts"], "the supervisor did not start the killed replica again"
    judged = [slo for slo in report["slos"] if slo["kind"] in ("availability", "money", "data")]
    assert {slo["name"] for slo in judged} >= {
        "availability steady",
        "availability gateway SIGKILL",
        "availability triton SIGTERM",
        "availability redis SIGSTOP 10 s",
        "video tasks lost",
        "video tasks submitted upstream twice",
        "usage record exactly once per key",
        "acknowledged search documents missing at the end",
        "read-your-writes misses",
    }
    broken = [f"{slo['name']}: {slo['measured']} (goal: {slo['goal']})" for slo in judged if not slo["met"]]
    assert not broken, "\n".join(broken)
    assert report["requests"] > 500  # the load ran: about 6 requests/s for two minutes, plus the followers
    assert {path.name for path in out.glob("*.png")} == {"latency.png", "errors.png", "rss.png", "redis-memory.png"}
    assert processes_mentioning(str(out)) == [], "a process of the platform outlived the soak"
