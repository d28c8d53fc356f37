"""The soak's rules on synthetic records: what fails availability, what is counted apart, what the usage record
may lack, and what the report writes."""

from __future__ import annotations

import json
from pathlib import Path

from bench.soak.records import Evidence, FaultEvent, NginxLine, Record, RedisMemory, Sample, Slo, parse_nginx_log
from bench.soak.rules import judge, phases, usage_rule
from bench.soak.traffic import parse_mix

KILLED = "127.0.0.1:7001"
OTHER = "127.0.0.1:7002"


def request(
    id_: str, route: str, start: float, status: int = 200, *, team: str = "search", counted: bool = True
) -> Record:
    return Record(id=id_, route=route, team=team, start=start, latency=0.05, status=status, counted=counted)


def evidence(records: list[Record], faults: list[FaultEvent], nginx: list[NginxLine] | None = None) -> Evidence:
    return Evidence(records, faults, warmup_end=0.0, load_end=100.0, nginx=nginx or [])


def slo(slos: list[Slo], name: str) -> Slo:
    return next(item for item in slos if item.name == name)


def test_phases_cover_the_run_with_steady_stretches_between_faults_and_their_recoveries() -> None:
    fault = FaultEvent("triton SIGTERM", "triton", start=40.0, end=50.0, redundant=True)
    names = [(phase.name, phase.start, phase.end) for phase in phases(evidence([], [fault]))]
    assert names == [
        ("steady", 0.0, 40.0),
        ("triton SIGTERM", 40.0, 50.0),
        ("triton SIGTERM recovery", 50.0, 55.0),
        ("steady", 55.0, 100.0),
    ]


def test_a_failure_while_a_redundant_peer_was_up_breaks_availability() -> None:
    fault = FaultEvent("triton SIGTERM", "triton", start=40.0, end=50.0, redundant=True)
    records = [request("a", "embeddings", 41.0, 503), request("b", "embeddings", 42.0), request("c", "search", 10.0)]
    slos, table = judge(evidence(records, [fault]))
    assert not slo(slos, "availability triton SIGTERM").met
    assert "1 failed" in slo(slos, "availability triton SIGTERM").measured
    assert slo(slos, "availability steady").met
    during = next(row for row in table if row["name"] == "triton SIGTERM")
    assert during["violations_by_route"] == {"embeddings": 1}


def test_a_route_a_fault_without_a_peer_degrades_is_allowed_to_fail_and_no_other() -> None:
    fault = FaultEvent("redis SIGSTOP 10 s", "redis", start=40.0, end=50.0, degrades=("video_submit",))
    allowed = evidence([request("a", "video_submit", 41.0, 503)], [fault])
    assert slo(judge(allowed)[0], "availability redis SIGSTOP 10 s").met
    other = evidence([request("a", "video_submit", 41.0, 503), request("b", "embeddings", 45.0, 0)], [fault])
    assert not slo(judge(other)[0], "availability redis SIGSTOP 10 s").met


def test_a_failure_in_overlapping_phases_is_excused_by_the_fault_that_degrades_its_route() -> None:
    triton = FaultEvent("triton SIGKILL", "triton", start=40.0, end=46.0, redundant=True)  # recovery until 51
    redis = FaultEvent("redis SIGSTOP 10 s", "redis", start=47.0, end=57.0, degrades=("video_poll",))
    slos, _ = judge(evidence([request("a", "video_poll", 48.0, 503)], [triton, redis]))
    assert slo(slos, "availability triton SIGKILL").met and slo(slos, "availability redis SIGSTOP 10 s").met
    slos, _ = judge(evidence([request("b", "embeddings", 48.0, 503)], [triton, redis]))
    assert not slo(slos, "availability triton SIGKILL").met


def test_requests_cut_in_flight_on_a_killed_replica_are_counted_apart_from_nginx_log() -> None:
    fault = FaultEvent("gateway SIGKILL", "gateway", start=40.0, end=45.0, redundant=True, target=KILLED)
    cut = request("cut", "chat", 39.5, 502)  # on the killed replica when it died
    cut.latency = 0.51
    later = request("later", "embeddings", 41.0, 502)  # sent after the kill: nginx should have used the peer
    nginx = [
        NginxLine(40.01, 502, 0.5, [KILLED], "502", "cut", "POST", "/v1/chat/completions"),
        NginxLine(41.05, 502, 0.05, [OTHER], "502", "later", "POST", "/v1/embeddings"),
    ]
    slos, table = judge(evidence([cut], [fault], nginx))
    assert slo(slos, "availability gateway SIGKILL").met
    measured = slo(slos, "availability gateway SIGKILL").measured
    assert "1 cut in flight on the killed replica (it held 1 at the kill; nginx sent 0 more" in measured
    assert next(row for row in table if row["name"] == "gateway SIGKILL")["cut_in_flight"] == 1
    assert not slo(judge(evidence([cut, later], [fault], nginx))[0], "availability gateway SIGKILL").met
    # Sent just after the kill on nginx's kept-alive connection to the dead replica: nginx's doing, counted apart.
    stale = request("stale", "embeddings", 40.02, 502)
    nginx.append(NginxLine(40.06, 502, 0.04, [KILLED], "502", "stale", "POST", "/v1/embeddings"))
    slos, _ = judge(evidence([cut, stale], [fault], nginx))
    assert slo(slos, "availability gateway SIGKILL").met
    assert "nginx sent 1 more" in slo(slos, "availability gateway SIGKILL").measured


def test_the_usage_record_may_lack_only_a_killed_replicas_flush_window() -> None:
    fault = FaultEvent("gateway SIGKILL", "gateway", start=40.0, end=45.0, redundant=True, target=KILLED)
    records = [request("early", "embeddings", 10.0), request("late", "embeddings", 39.8)]
    nginx = [
        NginxLine(10.05, 200, 0.05, [OTHER], "200", "early", "POST", "/v1/embeddings"),
        NginxLine(39.85, 200, 0.05, [KILLED], "200", "late", "POST", "/v1/embeddings"),  # 0.15 s before the kill
    ]
    window = evidence(records, [fault], nginx)
    window.usage_by_team = {"search": 1}
    assert usage_rule(window).met  # the one lost answered within 0.25 s before the kill
    window.usage_by_team = {"search": 0}
    assert not usage_rule(window).met
    window.usage_by_team = {"search": 3}  # recorded more often than answered: counted twice
    assert not usage_rule(window).met
    no_kill = evidence(records, [], nginx)
    no_kill.usage_by_team = {"search": 1}
    assert not usage_rule(no_kill).met


def test_money_and_data_rules_count_lost_and_twice_submitted_tasks_and_missing_documents() -> None:
    facts = evidence([], [])
    facts.video_status = {"t1": "completed", "t2": "processing"}
    facts.video_prompts = {"t1": "p1", "t2": "p2"}
    facts.upstream_submissions = {"p1": 2, "p2": 1}
    facts.missing_documents, facts.checked_documents = ["live-3"], 10
    slos, _ = judge(facts)
    assert slo(slos, "video tasks lost").measured.startswith("1 of 2")
    assert not slo(slos, "video tasks submitted upstream twice").met
    assert not slo(slos, "acknowledged search documents missing at the end").met


def test_latency_is_judged_in_steady_state_only_and_a_route_without_requests_is_not_met() -> None:
    fault = FaultEvent("cpu starvation 30 s", "cpu", start=40.0, end=70.0)
    slow_in_fault = Record("a", "embeddings", "search", 50.0, latency=3.0, status=200)
    fast = [Record(f"f{i}", "embeddings", "search", 10.0 + i * 0.1, latency=0.02, status=200) for i in range(100)]
    slos, _ = judge(evidence([slow_in_fault, *fast], [fault]))
    assert slo(slos, "latency embeddings p99").met
    assert not slo(slos, "latency search p99").met  # no search requests: nothing shows it holds


def test_a_gateway_whose_memory_grows_late_in_its_life_leaks() -> None:
    steady = [Sample(float(t), "gateway-0", 10, 100_000_000, 40, 1.0) for t in range(0, 300, 10)]
    grown = [
        Sample(float(t), "gateway-1", 11, 100_000_000 + (t > 200) * 30_000_000, 40, 1.0) for t in range(0, 300, 10)
    ]
    facts = evidence([], [])
    facts.samples = steady + grown
    facts.redis_memory = [RedisMemory(5.0, 1_000, 2_000, 0)]
    slos, _ = judge(facts)
    leak = slo(slos, "no leak in the gateways")
    assert not leak.met and "gateway-1" in leak.measured and "gateway-0" not in leak.measured
    assert slo(slos, "redis memory within maxmemory").met


def test_the_load_balancers_idle_connections_are_no_leak_and_the_gateways_own_files_are() -> None:
    """nginx keeps as many idle connections to a replica as a burst opened: the replica's open files rise to a
    plateau of them, which is not the replica's leak; its own files growing is."""
    plateau = [
        Sample(float(t), "gateway-0", 10, 10**8, 40 + (t > 150) * 8, 1.0, (t > 150) * 8) for t in range(0, 300, 10)
    ]
    leaking = [Sample(float(t), "gateway-1", 11, 10**8, 40 + (t > 150) * 8, 1.0, 2) for t in range(0, 300, 10)]
    facts = evidence([], [])
    facts.samples = plateau + leaking
    leak = slo(judge(facts)[0], "no leak in the gateways")
    assert not leak.met and "gateway-1" in leak.measured and "gateway-0" not in leak.measured
    assert "connections to a replica 0-8" in leak.measured


def test_redis_may_cross_maxmemory_by_a_write_but_never_refuse_one() -> None:
    limit = 256 * 2**20

    def redis_met(*readings: tuple[int, int]) -> bool:  # (used_memory, writes refused so far)
        facts = evidence([], [])
        facts.redis_memory = [RedisMemory(float(t), used, limit, refused) for t, (used, refused) in enumerate(readings)]
        return slo(judge(facts)[0], "redis memory within maxmemory").met

    assert redis_met((limit - 10, 0), (limit + 4_000, 0), (limit - 500, 0))  # evicted right after the write
    assert not redis_met((limit, 0), (limit + 8 * 2**20, 0))  # not evicting
    assert not redis_met((limit, 0), (limit, 3), (1_000, 0), (limit, 0))  # refused writes, then a restart


def test_the_nginx_log_lists_every_replica_a_request_was_tried_on(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(
        "1700000000.500|200|0.120|127.0.0.1:7001, 127.0.0.1:7002|502, 200|s1|POST|/v1/embeddings\n"
        "garbage line\n"
        "1700000001.000|502|0.001|-|-|-|GET|/healthz\n"
    )
    lines = parse_nginx_log(log)
    assert [line.upstreams for line in lines] == [[KILLED, OTHER], []]
    assert lines[0].soak_id == "s1" and abs(lines[0].start - 1700000000.38) < 1e-6


def test_the_report_writes_soak_json_with_the_named_slos_and_one_png_per_figure(tmp_path: Path) -> None:
    from bench.soak.report import write_report

    fault = FaultEvent("gateway SIGKILL", "gateway", start=40.0, end=45.0, redundant=True, target=KILLED)
    records = [Record(f"r{i}", "embeddings", "search", float(i), latency=0.02, status=200) for i in range(100)]
    facts = evidence(records, [fault])
    facts.samples = [Sample(float(t), "gateway-0", 10, 10**8, 40, 1.0) for t in range(0, 100, 5)]
    facts.redis_memory = [RedisMemory(float(t), 10**6, 2 * 10**8, 0) for t in range(0, 100, 5)]
    slos, table = judge(facts)
    write_report(tmp_path, facts, slos, table, {"notes": []})
    saved = json.loads((tmp_path / "soak.json").read_text())
    assert {"name", "goal", "measured", "met"} <= set(saved["slos"][0])
    assert any(item["name"].startswith("latency ") for item in saved["slos"])
    assert [phase["name"] for phase in saved["phases"]][:2] == ["steady", "gateway SIGKILL"]
    assert sorted(saved["figures"]) == ["errors.png", "latency.png", "redis-memory.png", "rss.png"]
    assert all((tmp_path / name).stat().st_size > 10_000 for name in saved["figures"])
    assert "| availability gateway SIGKILL |" in (tmp_path / "report.md").read_text()


def test_the_mix_flag_names_known_families_only() -> None:
    assert parse_mix("embeddings=50,chat=50") == {"embeddings": 50.0, "chat": 50.0}
    for wrong in ("pictures=10", "embeddings=0"):
        try:
            parse_mix(wrong)
        except ValueError:
            continue
        raise AssertionError(f"{wrong!r} was accepted")
