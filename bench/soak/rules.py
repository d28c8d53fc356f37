"""The soak's rules, judged per phase from what it recorded: availability, latency in steady state, money and data,
leaks. Pure functions of `Evidence`, so the unit tests judge synthetic records the same way.

Phases: each fault from its start to its end, then its recovery (until the component's clients are back: the
gateway's Redis back-off, a chat breaker's reset); `steady` is every moment after the warm-up that is in no fault
or recovery; the step-load phase before it (capacity) is reported, never judged. A request belongs to the phase
in which it ended (answered or failed): one cut by a fault that began while it ran counts in the fault's phase.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from statistics import median
from typing import Any

from bench.soak.records import Evidence, Phase, Record, Sample, Slo

# How long after a fault's end its clients may still see it, by component. The chat upstream's: a model's breaker
# may open at the fault's last moment and answers 503 for CHAT_BREAKER_RESET_SECONDS (30), then lets one probe
# through, a stream whose success counts at its end (the simulator's answers take up to 5 s); 5 s to spare.
RECOVERY_SECONDS = {"gateway": 5, "triton": 5, "redis": 10, "milvus": 15, "chat-upstream": 40, "fal": 10, "cpu": 10}
LATENCY_GOALS_MS = {  # route group -> (routes, p99 goal in ms): the seed's SLAs for the whole platform
    "embeddings": (("embeddings", "embeddings_batch"), 200.0),
    "search": (("search", "search_filter"), 350.0),
    "video submit": (("video_submit",), 200.0),
}
CHAT_TTFT_GOAL_MS = 50.0  # added by the gateway: the client's time to first token minus the simulator's
USAGE_FLUSH_WINDOW_SECONDS = 0.25  # docs/operations.md: a killed replica loses at most this much of its records
USAGE_ROUTES = frozenset({"embeddings", "embeddings_batch", "search", "search_filter", "upsert", "search_after_upsert"})
USAGE_ROUTES_PAID = frozenset({"chat", "chat_stream", "video_submit"})  # recorded before the last byte: never lost
LEAK_TOLERANCE = 0.10
NGINX_NOTICE_SECONDS = 1.0  # after a kill, requests nginx still sends to the dead replica's open connections
LEAK_MIN_LIFE_SECONDS = 120.0
REDIS_OVERSHOOT_BYTES = 1 << 20  # a write's worth above maxmemory before Redis evicts (32 cached vectors: ~0.1 MB)


def phases(evidence: Evidence) -> list[Phase]:
    """Fault and recovery phases in time order, and the steady stretches between them."""
    judged: list[Phase] = []
    for fault in sorted(evidence.faults, key=lambda event: event.start):
        end = fault.end or evidence.load_end
        judged.append(Phase(fault.name, fault.start, end, "fault", fault))
        recovery = end + RECOVERY_SECONDS.get(fault.component, 10)
        judged.append(Phase(f"{fault.name} recovery", end, recovery, "recovery", fault))
    steady: list[Phase] = []
    cursor = evidence.warmup_end
    for phase in judged:
        if phase.start > cursor:
            steady.append(Phase("steady", cursor, phase.start, "steady"))
        cursor = max(cursor, phase.end)
    if cursor < evidence.load_end:
        steady.append(Phase("steady", cursor, evidence.load_end, "steady"))
    return sorted(judged + steady, key=lambda phase: phase.start)


def in_steady(phases_: list[Phase], moment: float) -> bool:
    return any(phase.kind == "steady" and phase.holds(moment) for phase in phases_)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[rank]


def excused(record: Record, phases_: list[Phase]) -> bool:
    """A failure while a fault (or its recovery) that degrades its route was on: phases of faults that follow
    each other closely overlap, and the one that allows it is what users saw."""
    return any(
        phase.fault is not None and record.route in phase.fault.degrades and phase.holds(record.end)
        for phase in phases_
    )


def cut_in_flight(evidence: Evidence) -> tuple[set[str], dict[str, tuple[int, int]]]:
    """Requests on a SIGKILLed replica when it died, from nginx's log of the replica each went to: those open at
    the kill, and those nginx sent on its kept-alive connections to the dead process before it marked it down
    (within NGINX_NOTICE_SECONDS; nginx does not send a POST already written to one replica to another). Per kill:
    (open at the kill, sent after it)."""
    cut: set[str] = set()
    held: dict[str, tuple[int, int]] = {}
    for fault in evidence.faults:
        if fault.name != "gateway SIGKILL" or not fault.target:
            continue
        kill = fault.start
        open_ = [
            line for line in evidence.nginx if fault.target in line.upstreams and line.start <= kill <= line.end + 0.05
        ]
        stale = [
            line
            for line in evidence.nginx
            if line.upstreams[-1:] == [fault.target]
            and kill < line.start <= kill + NGINX_NOTICE_SECONDS
            and line.status >= 500
        ]
        before = held.get(fault.name, (0, 0))
        held[fault.name] = (before[0] + len(open_), before[1] + len(stale))
        cut |= {line.soak_id for line in open_ + stale}
    return cut, held


def availability(evidence: Evidence, phases_: list[Phase]) -> tuple[list[Slo], list[dict[str, Any]]]:
    """One SLO per fault (its phase and recovery together) and one for steady state; the per-phase table."""
    cut, held = cut_in_flight(evidence)
    slos: list[Slo] = []
    table: list[dict[str, Any]] = []
    by_fault: dict[str, list[tuple[Phase, list[Record], list[Record]]]] = defaultdict(list)
    for phase in phases_:
        records = [record for record in evidence.records if phase.holds(record.end)]
        failed = [record for record in records if record.failed]
        allowed = phase.fault.degrades if phase.fault else ()
        in_flight = [record for record in failed if record.id in cut]
        violations = [record for record in failed if record.id not in cut and not excused(record, phases_)]
        table.append(
            {
                "name": phase.name,
                "kind": phase.kind,
                "start": phase.start,
                "end": phase.end,
                "requests": len(records),
                "failed": len(failed),
                "failed_by_route": dict(Counter(record.route for record in failed)),
                "degraded_allowed": list(allowed),
                "cut_in_flight": len(in_flight),
                "violations": len(violations),
                "violations_by_route": dict(Counter(record.route for record in violations)),
                "first_violations": [f"{r.route} {r.status} {r.error[:80]}" for r in violations[:5]],
                "p99_ms": _p99_by_route(records),
                "load_lag_p99_ms": round(1000 * percentile([r.lag for r in records], 99), 1) if records else None,
            }
        )
        key = phase.fault.name if phase.fault else "steady"
        by_fault[key].append((phase, violations, in_flight))
    for name, parts in by_fault.items():
        broken = [record for _, bad, _ in parts for record in bad]
        cut_count = sum(len(cut_part) for _, _, cut_part in parts)
        fault = parts[0][0].fault
        goal = "0 failed requests (5xx or no answer)"
        if fault is not None and not fault.redundant:
            goal += f" outside the routes it degrades ({', '.join(fault.degrades) or 'none'})"
        measured = f"{len(broken)} failed" + (f" ({dict(Counter(r.route for r in broken))})" if broken else "")
        met = not broken
        if name in held:
            open_, stale = held[name]
            measured += (
                f"; {cut_count} cut in flight on the killed replica (it held {open_} at the kill; nginx sent "
                f"{stale} more to its dead connections before marking it down)"
            )
            met = met and cut_count <= open_ + stale
        slos.append(Slo(f"availability {name}", goal, measured, met))
    return slos, table


def _p99_by_route(records: Iterable[Record]) -> dict[str, float]:
    latencies: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if 200 <= record.status < 300 and not record.error:
            latencies[record.route].append(record.latency)
    return {route: round(1000 * percentile(values, 99), 1) for route, values in sorted(latencies.items())}


def latency(evidence: Evidence, phases_: list[Phase]) -> list[Slo]:
    steady = [r for r in evidence.records if in_steady(phases_, r.end) and 200 <= r.status < 300 and not r.error]
    slos = []
    for name, (routes, goal) in LATENCY_GOALS_MS.items():
        values = [1000 * r.latency for r in steady if r.route in routes]
        p99 = percentile(values, 99)
        measured = f"p99 {p99:.0f} ms over {len(values)} requests" if values else "no requests in steady state"
        slos.append(
            Slo(
                f"latency {name} p99",
                f"<= {goal:.0f} ms in steady state",
                measured,
                bool(values) and p99 <= goal,
                "latency",
            )
        )
    added = [
        1000 * max(0.0, r.ttft - evidence.chat_ttft_seconds)
        for r in steady
        if r.route == "chat_stream" and r.ttft is not None and r.cache in ("", "miss")
    ]
    p99 = percentile(added, 99)
    measured = f"p99 {p99:.0f} ms over {len(added)} streams" if added else "no uncached streams in steady state"
    ttft_goal = f"<= {CHAT_TTFT_GOAL_MS:.0f} ms added to the upstream's time to first token, steady state"
    slos.append(
        Slo(
            "latency chat time to first token added by the gateway p99",
            ttft_goal,
            measured,
            bool(added) and p99 <= CHAT_TTFT_GOAL_MS,
            "latency",
        )
    )
    return slos


def money_and_data(evidence: Evidence) -> list[Slo]:
    slos = []
    lost = sorted(task for task, status in evidence.video_status.items() if status != "completed")
    slos.append(
        Slo(
            "video tasks lost",
            "0 (every accepted task completes)",
            f"{len(lost)} of {len(evidence.video_status)}" + (f": {lost[:3]}" if lost else ""),
            not lost,
            "money",
        )
    )
    twice = [
        task for task, prompt in evidence.video_prompts.items() if evidence.upstream_submissions.get(prompt, 0) > 1
    ]
    never = [
        task for task, prompt in evidence.video_prompts.items() if evidence.upstream_submissions.get(prompt, 0) == 0
    ]
    slos.append(
        Slo(
            "video tasks submitted upstream twice",
            "0",
            f"{len(twice)} (and {len(never)} never submitted)",
            not twice,
            "money",
        )
    )
    slos.append(usage_rule(evidence))
    rps, concurrent = evidence.chat_quota
    seen_rps, seen_concurrent = evidence.chat_upstream
    slos.append(
        Slo(
            "chat upstream within the account's quota",
            f"<= {rps} requests in any 1 s and <= {concurrent} in flight, outside Redis faults",
            f"{seen_rps} in 1 s, {seen_concurrent} in flight",
            seen_rps <= rps and seen_concurrent <= concurrent,
            "money",
        )
    )
    missing = evidence.missing_documents
    slos.append(
        Slo(
            "acknowledged search documents missing at the end",
            "0",
            f"{len(missing)} of {evidence.checked_documents}" + (f": {missing[:3]}" if missing else ""),
            not missing,
            "data",
        )
    )
    stale = [r for r in evidence.records if r.check.startswith("read-your-writes")]
    checks = sum(1 for r in evidence.records if r.route == "search_after_upsert" and r.status == 200)
    slos.append(
        Slo(
            "read-your-writes misses",
            "0 (a document is found right after its upsert returns, on any replica)",
            f"{len(stale)} of {checks}" + (f" ({stale[0].check})" if stale else ""),
            not stale,
            "data",
        )
    )
    hits = evidence.semantic_hits
    rate = evidence.false_hits / hits if hits else 0.0
    measured = (
        f"{evidence.false_hits} of {hits} semantic hits ({100 * rate:.2f} %); {evidence.exact_hits} exact hits; "
        f"{hits + evidence.exact_hits} upstream calls saved"
    )
    if evidence.false_hit_examples:
        asked, generated_for = evidence.false_hit_examples[0]
        measured += f"; e.g. {asked!r} answered with the answer to {generated_for!r}"
    slos.append(Slo("semantic cache false hits", "<= 1 % of semantic hits", measured, rate <= 0.01, "data"))
    return slos


def usage_rule(evidence: Evidence) -> Slo:
    """Every answered request on the usage record exactly once, per key (each team has one key): the load
    generator's count against GET /v1/usage, less what a SIGKILLed replica had not yet written (its flush window,
    counted from nginx's log), plus streams cut after their first byte (the client cannot know)."""
    answered: Counter[str] = Counter(r.team for r in evidence.records if r.counted)
    answered.update(evidence.answered_outside)
    uncertain: Counter[str] = Counter(r.team for r in evidence.records if r.uncertain)
    team_of = {r.id: r for r in evidence.records}
    window: Counter[str] = Counter()
    for fault in evidence.faults:
        if fault.name != "gateway SIGKILL" or not fault.target:
            continue
        for line in evidence.nginx:
            record = team_of.get(line.soak_id)
            if (
                record is not None
                and record.counted
                and record.route in USAGE_ROUTES
                and line.upstreams[-1:] == [fault.target]
                and fault.start - USAGE_FLUSH_WINDOW_SECONDS <= line.end <= fault.start
            ):
                window[record.team] += 1
    problems = []
    for team in sorted(set(answered) | set(evidence.usage_by_team)):
        recorded = evidence.usage_by_team.get(team, 0)
        low, high = answered[team] - window[team], answered[team] + uncertain[team]
        if not low <= recorded <= high:
            problems.append(f"{team}: {recorded} recorded, {answered[team]} answered (allowed {low}..{high})")
    measured = "; ".join(problems) or (
        f"every team within its bounds ({sum(answered.values())} answered, {sum(evidence.usage_by_team.values())} "
        f"recorded, {sum(window.values())} in a killed replica's flush window, {sum(uncertain.values())} uncertain)"
    )
    goal = "recorded == answered per key, less a SIGKILLed replica's 0.25 s flush window"
    return Slo("usage record exactly once per key", goal, measured, not problems, "money")


def leaks(evidence: Evidence) -> list[Slo]:
    """Each gateway process's RSS and open files in the last third of its life (their median) within 10 % of their
    value after its warm-up (the median over the second half of its first third), both under the steady load (the
    seeding and the step load before it hold fewer connections); lives shorter than LEAK_MIN_LIFE_SECONDS under
    that load are not judged."""
    lives: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in evidence.samples:
        if sample.name.startswith("gateway-") and sample.time >= evidence.warmup_end:  # under the steady load
            lives[(sample.name, sample.pid)].append(sample)
    judged, problems = 0, []
    for (name, pid), samples in sorted(lives.items()):
        if len(samples) < 6 or samples[-1].time - samples[0].time < LEAK_MIN_LIFE_SECONDS:
            continue
        judged += 1
        third = len(samples) // 3
        own_files = [s.fds - s.balancer_connections for s in samples]
        for label, values in (("RSS", [s.rss for s in samples]), ("open files", own_files)):
            # Medians: open files count the connections in flight at the sample's moment (a band of a few either
            # way under steady load); a leak moves the whole band up. The load balancer's connections are left out:
            # nginx keeps as many idle ones as a burst opened (up to its `keepalive`), a plateau, not a leak.
            baseline, late = median(values[third // 2 : third] or values[:1]), median(values[-third:])
            if late > baseline * (1 + LEAK_TOLERANCE):
                problems.append(f"{name} (pid {pid}) {label} {baseline} -> {late}")
    balancer = [s.balancer_connections for samples in lives.values() for s in samples]
    held = f"; the load balancer's connections to a replica {min(balancer, default=0)}-{max(balancer, default=0)}"
    measured = ("; ".join(problems) or f"{judged} gateway lives judged, none grew") + held
    slos = [
        Slo(
            "no leak in the gateways",
            "RSS and open files (besides the load balancer's connections) in the last third within 10 % of after "
            "warm-up",
            measured,
            not problems,
            "leak",
        )
    ]
    memory = evidence.redis_memory
    peak = max((m.used for m in memory), default=0)
    limit = max((m.maxmemory for m in memory), default=0)
    # Redis' count of refused writes starts again at 0 when it restarts: add up the rises.
    refused = sum(max(0, b.refused - a.refused) for a, b in itertools.pairwise(memory)) + (
        memory[0].refused if memory else 0
    )
    slos.append(
        Slo(
            "redis memory within maxmemory",
            f"<= {limit} bytes, give or take one write (Redis evicts once a command has crossed it), "
            "0 writes refused for memory",
            f"peak {peak} bytes ({peak - limit:+d} against maxmemory); {refused} writes refused",
            bool(memory) and peak <= limit + REDIS_OVERSHOOT_BYTES and refused == 0,
            "leak",
        )
    )
    return slos


def capacity(evidence: Evidence) -> list[Slo]:
    if not evidence.capacity:
        return []
    held = evidence.capacity.get("highest_rate_held", 0.0)
    return [
        Slo(
            "capacity highest rate held",
            "reported, not judged (every latency SLO held at this rate in the step-load phase)",
            f"{held:.1f} requests/s; first to run out: {evidence.capacity.get('first_exhausted', 'n/a')}",
            held > 0,
            "capacity",
        )
    ]


def judge(evidence: Evidence) -> tuple[list[Slo], list[dict[str, Any]]]:
    """Every SLO and the per-phase table."""
    phases_ = phases(evidence)
    slos, table = availability(evidence, phases_)
    slos += latency(evidence, phases_) + money_and_data(evidence) + leaks(evidence) + capacity(evidence)
    return slos, table
