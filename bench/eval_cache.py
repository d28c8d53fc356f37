"""Offline evaluation of the semantic prompt cache: hit and false-hit rates across similarity thresholds.

Labelled sentence pairs (MRPC test for English, LCQMC test for Chinese; research-only
data read from `--data`, never copied here) are scored by both gateway matchers, the
embedding model this project exports (run here with onnxruntime, as Triton would) and
SimHash, through the same `Matcher` code the gateway uses. For each threshold t:

- hit rate: share of paraphrases (label 1) with similarity >= t, the answers the cache serves;
- false-hit rate: share of non-paraphrases (label 0) with similarity >= t, wrong answers served;
- false share: the false hits' share of all hits at t, what a user of the cache sees.

The recommended threshold of a matcher is the lowest at which false hits are at most 1 % of its hits, on all the
labelled pairs pooled (the soak's rule for the semantic cache). LCQMC's non-paraphrases are often one character
away from their pair, so a threshold held to 1 % of the non-paraphrases alone serves several times that share of
wrong answers among its hits.

    python -m bench.eval_cache --data /path/to/data --out /tmp/cache-eval
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from bench.padding import padded_inputs
from gateway.cache.semantic import EmbeddingMatcher, Matcher, SimHashMatcher

log = logging.getLogger("bench.eval_cache")

DATA_FILES = {"en": Path("en/mrpc_test.tsv"), "zh": Path("zh/lcqmc_test.tsv")}
THRESHOLDS = {
    "embedding": [round(0.70 + 0.01 * i, 2) for i in range(30)],  # 0.70 .. 0.99
    "simhash": [round(0.70 + 0.01 * i, 2) for i in range(31)],  # 0.70 .. 1.00
}
MAX_FALSE_SHARE = 0.01  # false hits over all hits
BATCH_SIZE = 64
MAX_TOKENS = 512
OVERALL = "overall"

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Pair:
    sentence1: str
    sentence2: str
    label: int  # 1: paraphrase, 0: not


@dataclass(frozen=True)
class SweepRow:
    threshold: float
    hit_rate: float  # paraphrases with similarity >= threshold
    false_hit_rate: float  # non-paraphrases with similarity >= threshold
    positives: int
    negatives: int
    false_share: float  # false hits over all hits at the threshold (0.0 without hits)


@dataclass(frozen=True)
class Recommendation:
    threshold: float
    hit_rate: float
    false_hit_rate: float
    false_share: float


# --- data ---------------------------------------------------------------------------------------


def load_pairs(path: Path) -> list[Pair]:
    """A TSV with one header line and columns sentence1, sentence2, label (0 or 1)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    pairs = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 3 or fields[2] not in ("0", "1"):
            raise ValueError(f"{path}:{number}: expected 3 tab-separated fields ending in label 0 or 1, got {line!r}")
        pairs.append(Pair(fields[0], fields[1], int(fields[2])))
    return pairs


def sample_pairs(pairs: Sequence[Pair], count: int, seed: int) -> list[Pair]:
    """`count` pairs drawn without replacement (all of them when there are fewer), the same for the same seed."""
    return random.Random(seed).sample(list(pairs), min(count, len(pairs)))


# --- the exported embedding model -----------------------------------------------------------


class OnnxEmbedder:
    """The exported encoder and its tokenizer from a Triton model repository, on the CPU."""

    def __init__(self, repository: Path, model_file: str = "model.onnx", threads: int | None = None) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
        options.inter_op_num_threads = 1
        model = repository / "bge_onnx" / "1" / model_file
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(repository / "bge_tokenizer" / "1" / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0

    async def embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Unit vectors [len(texts), d]; texts are batched by length so that little padding is run."""
        encodings = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        vectors: list[npt.NDArray[np.float32]] = [np.empty(0, np.float32)] * len(texts)
        for start in range(0, len(order), BATCH_SIZE):
            rows = order[start : start + BATCH_SIZE]
            for row, vector in zip(rows, self._run([encodings[i].ids for i in rows]), strict=True):
                vectors[row] = vector
        return np.stack(vectors) if vectors else np.zeros((0, 0), np.float32)

    def _run(self, batch: list[list[int]]) -> npt.NDArray[np.float32]:
        (embedding,) = self._session.run(["EMBEDDING"], padded_inputs(batch, self._pad_id))
        return np.asarray(embedding, dtype=np.float32)


async def pair_similarities(matcher: Matcher, pairs: Sequence[Pair]) -> FloatArray:
    """Each pair's similarity under `matcher`, through the gateway's own fingerprints and comparison."""
    first = await matcher.fingerprints([p.sentence1 for p in pairs])
    second = await matcher.fingerprints([p.sentence2 for p in pairs])
    return np.array([matcher.similarity(a, b) for a, b in zip(first, second, strict=True)], dtype=np.float64)


# --- the sweep ----------------------------------------------------------------------------------


def sweep(similarities: FloatArray, labels: IntArray, thresholds: Sequence[float]) -> list[SweepRow]:
    """Hit and false-hit rates at every threshold (0.0 where a class has no pairs)."""
    positives = similarities[labels == 1]
    negatives = similarities[labels == 0]
    rows = []
    for t in thresholds:
        hits, false_hits = int(np.sum(positives >= t)), int(np.sum(negatives >= t))
        share = false_hits / (hits + false_hits) if hits + false_hits else 0.0
        rows.append(
            SweepRow(t, _share_at_least(positives, t), _share_at_least(negatives, t), len(positives), len(negatives),
                     share)
        )  # fmt: skip
    return rows


def _share_at_least(values: FloatArray, threshold: float) -> float:
    return float(np.mean(values >= threshold)) if len(values) else 0.0


def recommend(rows: Sequence[SweepRow], max_false_share: float = MAX_FALSE_SHARE) -> Recommendation | None:
    """The lowest threshold that serves hits, at most `max_false_share` of them false; None when none does."""
    for row in sorted(rows, key=lambda r: r.threshold):
        if row.hit_rate > 0 and row.false_share <= max_false_share:
            return Recommendation(row.threshold, row.hit_rate, row.false_hit_rate, row.false_share)
    return None


def roc_auc(similarities: FloatArray, labels: IntArray) -> float:
    """Probability that a random paraphrase scores above a random non-paraphrase (ties count half)."""
    positives = similarities[labels == 1]
    negatives = similarities[labels == 0]
    if not len(positives) or not len(negatives):
        return float("nan")
    above = (positives[:, None] > negatives[None, :]).sum() + 0.5 * (positives[:, None] == negatives[None, :]).sum()
    return float(above / (len(positives) * len(negatives)))


def evaluate(
    similarities: dict[str, FloatArray], labels: dict[str, IntArray], thresholds: Sequence[float]
) -> dict[str, Any]:
    """Per language and overall (all languages pooled): the sweep, ROC-AUC and the recommendation."""
    groups = {**similarities, OVERALL: np.concatenate(list(similarities.values()))}
    group_labels = {**labels, OVERALL: np.concatenate(list(labels.values()))}
    sweeps = {name: sweep(groups[name], group_labels[name], thresholds) for name in groups}
    return {
        "sweep": {name: [asdict(row) for row in rows] for name, rows in sweeps.items()},
        "roc_auc": {name: roc_auc(groups[name], group_labels[name]) for name in groups},
        "recommended": {name: _as_dict(recommend(rows)) for name, rows in sweeps.items()},
    }


def _as_dict(recommendation: Recommendation | None) -> dict[str, float] | None:
    return None if recommendation is None else asdict(recommendation)


# --- reports ------------------------------------------------------------------------------------


def markdown_report(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Semantic cache evaluation",
        "",
        f"Pairs per language: {meta['pairs_per_language']} (seed {meta['seed']}); "
        f"embedding model: `{meta['embedding_model']}`; wall time {meta['wall_seconds']:.1f} s.",
        "Hit rate: paraphrases at or above the threshold; false-hit rate: non-paraphrases at or above it.",
        "False share: the false hits' share of all hits.",
        f"Recommended: the lowest threshold at which false hits are <= {MAX_FALSE_SHARE:.0%} of the hits, overall.",
    ]
    for matcher, result in results.items():
        lines += ["", f"## {matcher}", "", *_recommendation_lines(result), "", *_sweep_table(result["sweep"])]
    return "\n".join(lines) + "\n"


def _recommendation_lines(result: dict[str, Any]) -> list[str]:
    overall = result["recommended"][OVERALL]
    lines = [
        f"No threshold keeps false hits <= {MAX_FALSE_SHARE:.0%} of the hits."
        if overall is None
        else f"**Recommended threshold: {overall['threshold']:.2f}** (hit rate {overall['hit_rate']:.3f}, false-hit "
        f"rate {overall['false_hit_rate']:.3f}, false share {overall['false_share']:.3f} overall)",
        "",
        "| set | ROC-AUC | at the recommended threshold: hit / false hit / false share | the set's own lowest "
        f"threshold with false hits <= {MAX_FALSE_SHARE:.0%} of its hits: threshold, hit / false hit / false share |",
        "|---|---|---|---|",
    ]
    for name, rows in result["sweep"].items():
        at = "–" if overall is None else _rates(next(r for r in rows if r["threshold"] == overall["threshold"]))
        own = result["recommended"][name]
        alone = "none" if own is None else f"{own['threshold']:.2f}: {_rates(own)}"
        lines.append(f"| {name} | {result['roc_auc'][name]:.3f} | {at} | {alone} |")
    return lines


def _rates(row: dict[str, Any]) -> str:
    return f"{row['hit_rate']:.3f} / {row['false_hit_rate']:.3f} / {row['false_share']:.3f}"


def _sweep_table(sweeps: dict[str, list[dict[str, Any]]]) -> list[str]:
    names = list(sweeps)
    header = "| threshold | " + " | ".join(f"{n} hit | {n} false hit | {n} false share" for n in names) + " |"
    lines = [header, "|---" * (1 + 3 * len(names)) + "|"]
    for index, first in enumerate(sweeps[names[0]]):
        cells = [
            f"{row['hit_rate']:.3f} | {row['false_hit_rate']:.3f} | {row['false_share']:.3f}"
            for row in (sweeps[n][index] for n in names)
        ]
        lines.append(f"| {first['threshold']:.2f} | " + " | ".join(cells) + " |")
    return lines


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Hit rate and the false hits' share of the hits against the threshold, one line per matcher and set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (hits, false_hits) = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    for matcher, result in results.items():
        for name, rows in result["sweep"].items():
            style = "-" if name == OVERALL else "--" if name == "en" else ":"
            thresholds = [r["threshold"] for r in rows]
            label = f"{matcher} {name}"
            hits.plot(thresholds, [r["hit_rate"] for r in rows], style, label=label)
            false_hits.plot(thresholds, [r["false_share"] for r in rows], style, label=label)
    false_hits.axhline(MAX_FALSE_SHARE, color="grey", linewidth=0.8)
    for axes, title in (
        (hits, "hit rate (paraphrases served)"),
        (false_hits, "false share (wrong answers among hits)"),
    ):
        axes.set_title(title)
        axes.set_xlabel("similarity threshold")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# --- command line -------------------------------------------------------------------------------


def main_eval(data: Path, out: Path, pairs: int, seed: int, repository: Path, model_file: str) -> dict[str, Any]:
    started = time.monotonic()
    samples = {lang: sample_pairs(load_pairs(data / file), pairs, seed) for lang, file in DATA_FILES.items()}
    labels = {lang: np.array([p.label for p in chosen], dtype=np.int64) for lang, chosen in samples.items()}
    matchers: dict[str, Matcher] = {
        "embedding": EmbeddingMatcher(OnnxEmbedder(repository, model_file)),
        "simhash": SimHashMatcher(),
    }
    results = {}
    for kind, matcher in matchers.items():
        scored = {lang: asyncio.run(pair_similarities(matcher, chosen)) for lang, chosen in samples.items()}
        results[kind] = evaluate(scored, labels, THRESHOLDS[kind])
        log.info("%s scored in %.1f s", kind, time.monotonic() - started)
    meta = {
        "pairs_per_language": {lang: len(chosen) for lang, chosen in samples.items()},
        "seed": seed,
        "embedding_model": str(repository / "bge_onnx" / "1" / model_file),
        "simhash_ngram": 3,
        "wall_seconds": time.monotonic() - started,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache_eval.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    (out / "cache_eval.md").write_text(markdown_report(results, meta), encoding="utf-8")
    plot(results, out / "cache_eval.png")
    return {"meta": meta, "results": results}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.eval_cache", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder holding en/mrpc_test.tsv, zh/lcqmc_test.tsv")
    parser.add_argument("--out", type=Path, required=True, help="folder for cache_eval.{md,json,png}")
    parser.add_argument("--pairs", type=int, default=20_000, help="pairs sampled per language (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"), help="Triton model repository")
    parser.add_argument("--model-file", default="model.onnx", help="graph in bge_onnx/1 (model_int8.onnx: CPU serving)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    report = main_eval(args.data, args.out, args.pairs, args.seed, args.repository, args.model_file)
    for kind, result in report["results"].items():
        log.info("%s: recommended %s", kind, result["recommended"][OVERALL])
    log.info("wrote %s in %.1f s", args.out, report["meta"]["wall_seconds"])


if __name__ == "__main__":
    main()
