"""Part 4, caches: upstream chat calls the exact and the semantic cache save on a replayed workload, and wrong answers.

The workload comes from labelled paraphrase pairs (MRPC test, English; LCQMC test, Chinese; research-only,
read from `--data`, never copied here). Each pair gives three questions: its first sentence (new), the same
text again (repeated) and its second sentence, a paraphrase (label 1) or a similar-looking new question
(label 0). They are replayed one at a time, in a seeded shuffled order where each pair's first sentence comes
first, through a gateway (exact cache on, semantic cache at its default matcher, threshold and size) in front
of the Hunyuan simulator. The simulator's answer echoes the question, so every served answer says which
question it was made for: one made for another question than the one asked (or, for a paraphrase, its
original) is a false hit. Measured per run, with a fresh gateway: upstream calls and calls saved per layer
(`gateway_chat_upstream_calls_total`, `gateway_chat_calls_saved_total`), hits and false hits per kind.

    python -m bench caches [--data DIR] [--runs 3] [--quick] [--out DIR]
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from bench.eval_cache import DATA_FILES, Pair, load_pairs, sample_pairs
from bench.gateway_metrics import metric
from bench.paths import ROOT
from bench.processes import running
from bench.results import PartResult, load_note, machine
from bench.run_stats import median, percentile
from bench.stack import gateway, hunyuan_simulator
from gateway.cache.semantic import simhash64, simhash_similarity
from gateway.settings import SemanticCacheSettings
from simulators.hunyuan import DEFAULT_MODELS, echo_reply

log = logging.getLogger("bench.caches")

Kind = Literal["new", "repeat", "paraphrase", "non_paraphrase"]
KINDS: tuple[Kind, ...] = ("new", "repeat", "paraphrase", "non_paraphrase")
DEFAULT_DATA = ROOT / ".run" / "eval-data"  # where `--data` is not given: put (or link) the pairs here
PAIRS_PER_LANGUAGE = {False: 500, True: 25}  # by quick
API_KEY = "bench-hunyuan-key"
MODEL = DEFAULT_MODELS[0]
SEMANTIC = SemanticCacheSettings.model_fields
DEFAULT_ENTRIES = int(SEMANTIC["max_entries_per_context"].default)
THRESHOLD = float(SEMANTIC["threshold"].default)
LARGE_ENTRIES = 10_000
# (name, gateway variables): the product's defaults, then a semantic index large enough for every question.
CONFIGS: tuple[tuple[str, dict[str, str]], ...] = (
    (f"defaults ({DEFAULT_ENTRIES} questions per context)", {}),
    (f"{LARGE_ENTRIES} questions per context", {"CHAT_SEMANTIC_MAX_ENTRIES_PER_CONTEXT": str(LARGE_ENTRIES)}),
)


@dataclass(frozen=True)
class Question:
    text: str
    kind: Kind
    pair: int
    language: str
    original: str  # the pair's first sentence

    def right_answers(self) -> tuple[str, ...]:
        """The questions whose answer is right for this one: itself, and for a paraphrase its original."""
        return (self.text, self.original) if self.kind == "paraphrase" else (self.text,)


# -- the workload -------------------------------------------------------------------------------------


def distinct_pairs(pairs: Iterable[tuple[str, Pair]]) -> list[tuple[str, Pair]]:
    """(language, pair)s whose two sentences differ and occur in no earlier pair, so a new question is new."""
    seen: set[str] = set()
    kept = []
    for language, pair in pairs:
        if pair.sentence1 != pair.sentence2 and not {pair.sentence1, pair.sentence2} & seen:
            seen |= {pair.sentence1, pair.sentence2}
            kept.append((language, pair))
    return kept


def build_workload(pairs: Mapping[str, Sequence[Pair]], *, seed: int) -> list[Question]:
    """Three questions per distinct pair (new, repeat, second sentence), shuffled; the new one comes first."""
    chosen = distinct_pairs((language, pair) for language, group in pairs.items() for pair in group)
    rng = random.Random(seed)
    slots = [index for index in range(len(chosen)) for _ in range(3)]
    rng.shuffle(slots)
    later = [rng.sample(["repeat", "second"], 2) for _ in chosen]  # the order of the two that follow the new one
    seen: Counter[int] = Counter()
    workload = []
    for index in slots:
        language, pair = chosen[index]
        role = "new" if not seen[index] else later[index][seen[index] - 1]
        seen[index] += 1
        if role == "second":
            kind: Kind = "paraphrase" if pair.label == 1 else "non_paraphrase"
            workload.append(Question(pair.sentence2, kind, index, language, pair.sentence1))
        else:
            workload.append(
                Question(pair.sentence1, "new" if role == "new" else "repeat", index, language, pair.sentence1)
            )
    return workload


def load_data(data: Path, per_language: int, seed: int = 0) -> dict[str, list[Pair]]:
    """`per_language` distinct pairs of each language, drawn with `seed`; a clear error when the data is missing."""
    missing = [str(data / file) for file in DATA_FILES.values() if not (data / file).is_file()]
    if missing:
        raise FileNotFoundError(f"paraphrase data not found: {', '.join(missing)}; pass --data <folder with en/, zh/>")
    pairs = {}
    for language, file in DATA_FILES.items():
        shuffled = sample_pairs(load_pairs(data / file), 10**9, seed)  # every pair, in a seeded order
        pairs[language] = [pair for _, pair in distinct_pairs([(language, p) for p in shuffled])[:per_language]]
    return pairs


# -- replaying it -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    question: Question
    cache: str  # the X-Cache header: hit (exact) | semantic | miss
    right: bool  # the answer was made for one of question.right_answers()
    pair_original: bool  # the answer was made for the pair's first sentence (a non-paraphrase's labelled false hit)
    seconds: float


@dataclass
class CacheRun:
    answered: list[Answered]
    upstream_calls: float
    saved: dict[str, float]  # layer -> calls answered by it, from the gateway's metrics


def gateway_env(simulator_url: str, extra: Mapping[str, str]) -> dict[str, str]:
    """Chat only (no Triton); a quota far above the replay, so every miss reaches the simulator."""
    return {
        "TRITON_URL": "127.0.0.1:9",
        "CHAT_BASE_URL": simulator_url,
        "CHAT_API_KEY": API_KEY,
        "CHAT_REQUESTS_PER_SECOND": "100000",
        "CHAT_MAX_CONCURRENT": "1000",
        **extra,
    }


async def replay(base_url: str, workload: Sequence[Question]) -> list[Answered]:
    """Ask each question in order, one at a time, so every answer is cached before the next question."""
    answered = []
    async with httpx.AsyncClient(timeout=60.0) as client:
        for question in workload:
            body = {"model": MODEL, "messages": [{"role": "user", "content": question.text}]}
            started = time.perf_counter()
            response = await client.post(f"{base_url}/v1/chat/completions", json=body)
            seconds = time.perf_counter() - started
            response.raise_for_status()
            content = response.json()["choices"][0]["message"]["content"]
            answered.append(
                Answered(
                    question,
                    response.headers.get("x-cache", "miss"),
                    content in {_echo(text) for text in question.right_answers()},
                    content == _echo(question.original),
                    seconds,
                )
            )
    return answered


def _echo(text: str) -> str:
    return echo_reply([{"role": "user", "content": text}])


async def cache_run(log_dir: Path, name: str, extra: Mapping[str, str], workload: Sequence[Question]) -> CacheRun:
    """A fresh simulator and gateway (empty caches), the replay, and the gateway's counters after it."""
    # No --api-key: the simulator would then refuse stack's readiness probe (GET /v1/models without a key).
    simulator = hunyuan_simulator(log_dir, "--ttft", "0", "--tps", "0", "--qps", "0", "--log-level", "warning")
    gw = gateway(log_dir, gateway_env(simulator.base_url, extra), name=name)
    gw.server.env.pop("REDIS_URL", None)  # the in-process caches, whatever this shell has set
    with running((simulator.server, simulator.ready_url), (gw.server, gw.ready_url)):
        answered = await replay(gw.base_url, workload)
        async with httpx.AsyncClient(timeout=10) as client:
            text = (await client.get(f"{gw.base_url}/metrics")).text
    return CacheRun(
        answered=answered,
        upstream_calls=metric(text, "gateway_chat_upstream_calls_total"),
        saved={layer: metric(text, "gateway_chat_calls_saved_total", layer=layer) for layer in ("exact", "semantic")},
    )


# -- summaries ----------------------------------------------------------------------------------------


def tally(answered: Sequence[Answered]) -> dict[str, float]:
    """Counts of one replay (of any subset): requests, hits per layer, right and false semantic hits."""
    semantic = [a for a in answered if a.cache == "semantic"]
    return {
        "requests": len(answered),
        "exact hits": sum(a.cache == "hit" for a in answered),
        "semantic hits": len(semantic),
        "right semantic hits": sum(a.right for a in semantic),
        "false hits": sum(not a.right for a in answered if a.cache != "miss"),
        "labelled false hits": sum(not a.right and a.pair_original for a in semantic),
        "misses": sum(a.cache == "miss" for a in answered),
    }


def rates(answered: Sequence[Answered], language: str | None = None) -> dict[str, float]:
    """Paraphrases answered right by the semantic layer, and non-paraphrases given a wrong answer."""
    chosen = [a for a in answered if language is None or a.question.language == language]
    paraphrases = [a for a in chosen if a.question.kind == "paraphrase"]
    others = [a for a in chosen if a.question.kind == "non_paraphrase"]
    return {
        "paraphrase hit rate": _share(sum(a.cache == "semantic" and a.right for a in paraphrases), len(paraphrases)),
        "non-paraphrase false-hit rate": _share(sum(not a.right for a in others), len(others)),
    }


def _share(count: float, total: int) -> float:
    return count / total if total else float("nan")


def medians(values: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {key: median([v[key] for v in values]) for key in values[0]} if values else {}


def config_rows(config: str, runs: Sequence[CacheRun]) -> list[dict[str, Any]]:
    """One row per kind of question and one for all of them: medians over the runs."""
    rows = []
    for kind in (*KINDS, None):
        counts = medians([tally([a for a in run.answered if kind in (None, a.question.kind)]) for run in runs])
        row: dict[str, Any] = {"configuration": config, "questions": kind or "all", **counts}
        if kind is None:
            requests = counts["requests"]
            saved = {layer: median([run.saved[layer] for run in runs]) for layer in ("exact", "semantic")}
            row["upstream calls"] = median([run.upstream_calls for run in runs])
            row["saved by exact"] = saved["exact"]
            row["saved by semantic"] = saved["semantic"]
            row["saved %"] = 100 * (saved["exact"] + saved["semantic"]) / requests if requests else float("nan")
        rows.append(row)
    return rows


def offline_rates(pairs: Mapping[str, Sequence[Pair]]) -> dict[str, float]:
    """Share of the pairs of each label whose two sentences reach the threshold under the gateway's SimHash."""
    chosen = [pair for _, pair in distinct_pairs([(lang, p) for lang, group in pairs.items() for p in group])]
    shares = {}
    for label in (1, 0):
        group = [p for p in chosen if p.label == label]
        reach = sum(simhash_similarity(simhash64(p.sentence1), simhash64(p.sentence2)) >= THRESHOLD for p in group)
        shares[f"label {label}"] = _share(reach, len(group))
    return shares


def latency_note(runs: Sequence[CacheRun]) -> str:
    parts = []
    for outcome, label in (("hit", "exact hit"), ("semantic", "semantic hit"), ("miss", "miss (upstream)")):
        seconds = [a.seconds for run in runs for a in run.answered if a.cache == outcome]
        if seconds:
            parts.append(f"{label} {1000 * percentile(seconds, 50):.1f} / {1000 * percentile(seconds, 99):.1f} ms")
    return "Latency p50 / p99 by outcome (all runs pooled): " + ", ".join(parts) + "."


# -- the part -----------------------------------------------------------------------------------------


async def run(
    out_dir: Path,
    *,
    runs: int = 3,
    quick: bool = False,
    data: Path = DEFAULT_DATA,
    pairs: Mapping[str, Sequence[Pair]] | None = None,
) -> PartResult:
    """Replay the workload (a new shuffle per run) through each configuration; medians over the runs."""
    pairs = pairs if pairs is not None else load_data(data, PAIRS_PER_LANGUAGE[quick])
    log_dir = out_dir / "logs" / "caches"
    load_at_start = os.getloadavg()[0]
    result = PartResult(part="caches", x_label="", throughput_unit="")
    measured: dict[str, list[CacheRun]] = {}
    for number, (config, extra) in enumerate(CONFIGS):
        measured[config] = []
        for index in range(runs):
            workload = build_workload(pairs, seed=index)
            name = f"gateway-caches-{number}-{index}"
            measured[config].append(await cache_run(log_dir, name, extra, workload))
            log.info("%s run %d: %s", config, index + 1, tally(measured[config][-1].answered))
        result.table += config_rows(config, measured[config])
    result.notes += notes(pairs, measured, runs, quick)
    result.notes.append(load_note(load_at_start))
    return result


def notes(
    pairs: Mapping[str, Sequence[Pair]], measured: Mapping[str, Sequence[CacheRun]], runs: int, quick: bool
) -> list[str]:
    sizes = {language: len(group) for language, group in pairs.items()}
    questions = len(next(iter(measured.values()))[0].answered) if measured and runs else 0
    lines = [
        f"{machine()['cores']} CPU cores. {questions} questions per run from {sizes} pairs; medians of {runs} runs, "
        "each a new shuffle (seed = run index) through a fresh gateway and simulator.",
        f"Semantic matcher {SEMANTIC['matcher'].default}, threshold {THRESHOLD:g}. Every question shares one "
        "context (same model, no history), so the semantic index holds only the newest questions per context.",
        "False hits: answers made for another question (the simulator echoes the question); labelled: a "
        "non-paraphrase served its pair's first sentence's answer; the rest matched some other pair's question.",
    ]
    offline = offline_rates(pairs)
    lines.append(
        f"Offline, {offline['label 1']:.1%} of the paraphrase pairs and {offline['label 0']:.1%} of the non-paraphrase "
        f"pairs reach the threshold (bench.eval_cache's measure on these pairs): the most the semantic layer can serve."
    )
    for config, config_runs in measured.items():
        per_language = {language: medians([rates(run.answered, language) for run in config_runs]) for language in sizes}
        text = "; ".join(
            f"{language}: paraphrase hit rate {r['paraphrase hit rate']:.1%}, non-paraphrase false-hit rate "
            f"{r['non-paraphrase false-hit rate']:.1%}"
            for language, r in per_language.items()
        )
        lines.append(f"{config}: {text}. {latency_note(config_runs)}")
    if quick:
        lines.append("Quick mode: a small workload; the numbers check the harness, not the caches.")
    return lines
