"""The scale step's figures and targets: p99 at the larger size over the smaller, recall@10 against exact search
in each mode, whether the engine's BM25 is exhaustive, and the gateway's resident memory against the budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.results import PartResult, Target
from bench.run_stats import median
from bench.search.exact_search import TIE, Scores, best
from bench.search.plan import GATEWAY, P99_CONCURRENCY, RECALL_GOAL
from bench.search.report import Measured, build_result
from bench.search.scale_build import Built, search_settings

LEXICAL_DEPTH = 100  # results of a lexical search compared with the exact BM25's
P99_SCALE_GOAL = 2.0  # p99 at the larger size over the smaller's, same run, same queries
# The documented budget (docs/operations.md, "Sizing the embedded store"): the gateway itself with the store's
# write-ahead log, plus the store per million 384-d documents with sentence-long texts (vectors, HNSW links,
# payload, full-text index; docs/benchmarks.md has the arithmetic).
GATEWAY_GIB = 0.35
STORE_GIB_PER_MILLION = 2.2
GIB = 2**30


def budget_gib(documents: int) -> float:
    return GATEWAY_GIB + STORE_GIB_PER_MILLION * documents / 1_000_000


def system(documents: int, mode: str) -> str:
    return f"{GATEWAY}, {documents:,} documents{', hybrid' if mode == 'hybrid' else ''}"


@dataclass
class ScaleFigures:
    """What the scale step measured besides the latency, filled in as it goes."""

    sizes: tuple[int, int]
    builds: dict[int, Built] = field(default_factory=dict)
    memory_at_start: dict[int, dict[str, int]] = field(default_factory=dict)  # the gateway's tree, shard not open
    memory: dict[int, dict[str, int]] = field(default_factory=dict)  # after the load
    memory_peak: dict[int, int] = field(default_factory=dict)  # the gateway process's VmHWM
    matches: dict[tuple[str, int, bool], list[int]] = field(default_factory=dict)  # matched, out of
    by_language: dict[tuple[str, int, bool, str], list[int]] = field(default_factory=dict)  # the same, per language
    languages: list[str] = field(default_factory=list)  # per query position: its answer's language
    ties: dict[int, list[int]] = field(default_factory=dict)  # queries; BM25 ties across the 10th, the 20th
    lexical_score_error: float = 0.0  # largest relative difference of a lexical hit's score from the exact BM25

    def add(self, mode: str, documents: int, filtered: bool, matched: int, out_of: int, at: int) -> None:
        """Query `at`'s count of right answers (`matched` of `out_of`)."""
        language = self.languages[at] if at < len(self.languages) else "?"
        for counts in (self.matches.setdefault((mode, documents, filtered), [0, 0]),
                       self.by_language.setdefault((mode, documents, filtered, language), [0, 0])):  # fmt: skip
            counts[0] += matched
            counts[1] += out_of

    def recall(self, mode: str, documents: int, filtered: bool) -> float:
        matched, out_of = self.matches.get((mode, documents, filtered), [0, 0])
        return matched / out_of if out_of else float("nan")

    def count_ties(self, documents: int, scores: Scores) -> None:
        """Whether the query's exact BM25 ranking has a tie across the 10th place (a top 10 drawn among equals)
        and across the 20th (the hybrid candidates' cut)."""
        top = best(scores, 21, matched_only=True)
        counts = self.ties.setdefault(documents, [0, 0, 0])
        counts[0] += 1
        for slot, cut in ((1, 10), (2, 20)):
            counts[slot] += len(top) > cut and float(scores[top[cut - 1]] - scores[top[cut]]) <= TIE

    def recall_line(self, documents: int) -> str:
        """Recall per mode, and per language of the queries' answers."""
        parts = []
        for (mode, size, filtered, language), (matched, out_of) in sorted(self.by_language.items()):
            if size == documents:
                parts.append(f"{mode}{' filter' if filtered else ''} {language} {matched / max(out_of, 1):.4f}")
        return ", ".join(parts)


def build_scale_result(measured: Measured, figures: ScaleFigures, notes: Sequence[str]) -> PartResult:
    result = build_result(measured, [*notes_of(measured, figures), *notes])
    small, large = figures.sizes
    result.targets += [
        target
        for filtered in (False, True)
        for mode in ("dense", "hybrid")
        if (target := p99_target(measured, small, large, mode, filtered)) is not None
    ]
    for documents in (large, small):
        result.targets += recall_targets(figures, documents)
        if documents in figures.memory:
            resident, budget = figures.memory[documents]["VmRSS"] / GIB, budget_gib(documents)
            name = f"gateway resident memory after the load, {documents:,} documents"
            met = resident <= budget
            result.targets.append(Target(name, f"<= {budget:.2f} GiB (budget)", f"{resident:.2f} GiB", met))
    return result


def p99_target(measured: Measured, small: int, large: int, mode: str, filtered: bool) -> Target | None:
    """The larger size's p99 over the smaller's at concurrency 8: each run's two sizes ran back to back, so the
    ratio of each run, then the median."""
    runs = [measured.latency.get((system(d, mode), P99_CONCURRENCY, filtered), []) for d in (small, large)]
    if not (runs[0] and runs[1]):
        return None
    ratio = median([b.p(99) / a.p(99) for a, b in zip(*runs, strict=False)])
    p99 = [median([run.p(99) for run in sized]) for sized in runs]
    name = f"search p99 at {large:,} vs {small:,} documents, {mode}, concurrency {P99_CONCURRENCY}"
    return Target(name + (", filter" if filtered else ""), f"<= {P99_SCALE_GOAL:g} x",
                  f"{ratio:.2f} x ({p99[1]:.1f} vs {p99[0]:.1f} ms)", ratio <= P99_SCALE_GOAL)  # fmt: skip


def recall_targets(figures: ScaleFigures, documents: int) -> list[Target]:
    """Recall@10 against exact search per mode, and the lexical check: the engine's BM25 top 100 and scores
    against the exact BM25 (all equal: its lexical search is exhaustive)."""
    targets = []
    for mode in ("dense", "hybrid", "lexical"):
        for filtered in (False, True):
            counts = figures.matches.get((mode, documents, filtered))
            if counts is None:
                continue
            recall, where = counts[0] / max(counts[1], 1), ", filter" if filtered else ""
            if mode == "lexical":
                targets.append(Target(f"lexical top {LEXICAL_DEPTH} through the API vs exact BM25{where}, "
                                      f"{documents:,} documents", "1.0000 (exhaustive)", f"{recall:.4f} (scores "
                                      f"within {figures.lexical_score_error:.1e})", recall == 1.0))  # fmt: skip
            else:
                targets.append(Target(f"recall@10 through the API vs exact {mode} search{where}, {documents:,} "
                                      f"documents", f">= {RECALL_GOAL}", f"{recall:.4f} ({counts[0]} of {counts[1]})",
                                      recall >= RECALL_GOAL))  # fmt: skip
    return targets


def notes_of(measured: Measured, figures: ScaleFigures) -> list[str]:
    lines = [f"Search settings: {search_settings()}; hybrid with the default fusion."]
    for documents, built in sorted(figures.builds.items()):
        lines.append(
            f"{documents:,} documents: top-up written in {built.write_s:.0f} s, indexed in {built.index_s:.0f} s"
            f"{' (built by an earlier run, reused)' if built.reused else ''}; {built.disk_bytes / GIB:.2f} GiB on "
            f"disk, {built.segments} segments; peak resident while building {built.peak_rss_bytes / GIB:.2f} GiB "
            f"(the bench process, which holds the top-up, and the index build's child), of which the child "
            f"{built.peak_child_rss_bytes / GIB:.2f} GiB. On disk by part: "
            + ", ".join(f"{part} {size / GIB:.3f} GiB" for part, size in sorted(built.parts_bytes.items()))
            + "."
        )
    for documents, memory in sorted(figures.memory.items()):
        start = figures.memory_at_start.get(documents, {})
        lines.append(
            f"{documents:,} documents, the gateway after the load: resident {gib(memory, 'VmRSS')} GiB (anonymous "
            f"{gib(memory, 'RssAnon')}, file-backed {gib(memory, 'RssFile')}; {memory['processes']} process(es)), "
            f"peak {figures.memory_peak.get(documents, 0) / GIB:.2f} GiB; at start, before the shard was opened, "
            f"{gib(start, 'VmRSS')} GiB."
        )
    lines += run_lines(measured, figures)
    for documents, (queries, at_10, at_20) in sorted(figures.ties.items()):
        lines.append(
            f"{documents:,} documents, exact BM25 ties: {at_10} of {queries} queries tie across the 10th place, "
            f"{at_20} across the 20th (hybrid's candidates); recall counts a tie with the last exact answer as a "
            f"right answer. Recall per mode and language: {figures.recall_line(documents)}."
        )
    return lines


def gib(memory: dict[str, int], name: str) -> str:
    return f"{memory.get(name, 0) / GIB:.2f}"


def run_lines(measured: Measured, figures: ScaleFigures) -> list[str]:
    """Each run's p99 at concurrency 8 per size and mode, with the languages of the run's queries (run r asks
    queries r x count onwards: the corpus lists its English queries first)."""
    small, large = figures.sizes
    lines = []
    runs = len(measured.latency.get((system(small, "dense"), P99_CONCURRENCY, False), []))
    for run in range(runs):
        cells = []
        for mode in ("dense", "hybrid"):
            for filtered in (False, True):
                key = [(system(d, mode), P99_CONCURRENCY, filtered) for d in (small, large)]
                if all(len(measured.latency.get(k, [])) > run for k in key):
                    a, b = (measured.latency[k][run].p(99) for k in key)
                    cells.append(f"{mode}{' filter' if filtered else ''} {b:.1f} / {a:.1f} ms = {b / a:.2f} x")
        count = len(measured.latency[(system(small, "dense"), P99_CONCURRENCY, False)][run].latencies)
        asked = figures.languages[run * count : (run + 1) * count]
        share = sum(language == "zh" for language in asked) / max(len(asked), 1)
        span = f"queries {run * count}-{(run + 1) * count - 1}, {share:.0%} Chinese"
        lines.append(f"Run {run + 1} ({span}), p99 at concurrency {P99_CONCURRENCY}, {large:,} / {small:,} documents: "
                     f"{'; '.join(cells)}.")  # fmt: skip
    return lines
