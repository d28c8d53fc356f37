"""The public retrieval sets the search bench reads from a `--data` folder (never from the repository): BEIR's
SciFact and NFCorpus (`<data>/beir/<set>/corpus.jsonl`, `queries.jsonl`, `qrels/test.tsv` and the train or dev
judgements, as BEIR publishes them) and a Chinese set built from LCQMC (`<data>/zh/lcqmc_test.tsv` and
`lcqmc_dev.tsv`: every distinct second sentence a document, the first sentences of the first 2,000 positive pairs
the queries, their pairs' documents the answers)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Qrels = dict[str, dict[str, int]]  # query id -> document id -> grade
LCQMC_QUERIES = 2000
BEIR_TUNING = {"scifact": "train", "nfcorpus": "dev"}


@dataclass(frozen=True)
class Split:
    documents: dict[str, str]
    queries: dict[str, str]
    qrels: Qrels


@dataclass(frozen=True)
class RetrievalSet:
    name: str
    test: Split
    tuning: Split | None  # other queries' judgements (train or dev), for choosing the fusion


def beir_set(folder: Path) -> RetrievalSet:
    """A BEIR set as published: a document's text is its title and its text (BEIR's own convention); the tuning
    queries search the same corpus."""
    documents = {}
    for line in (folder / "corpus.jsonl").read_text().splitlines():
        row = json.loads(line)
        documents[str(row["_id"])] = f"{row.get('title', '')} {row['text']}".strip()
    queries = {
        str(row["_id"]): row["text"] for row in map(json.loads, (folder / "queries.jsonl").read_text().splitlines())
    }
    test = read_qrels(folder / "qrels" / "test.tsv")
    tuning_path = folder / "qrels" / f"{BEIR_TUNING.get(folder.name, 'dev')}.tsv"
    tuning = None
    if tuning_path.exists():
        qrels = read_qrels(tuning_path)
        tuning = Split(documents, {q: queries[q] for q in qrels}, qrels)
    return RetrievalSet(folder.name, Split(documents, {q: queries[q] for q in test}, test), tuning)


def read_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    with path.open(newline="") as file:
        for row in csv.DictReader(file, delimiter="\t"):
            qrels.setdefault(row["query-id"].strip(), {})[row["corpus-id"].strip()] = int(row["score"])
    return qrels


def lcqmc_set(zh: Path) -> RetrievalSet:
    return RetrievalSet("lcqmc", lcqmc_split(zh / "lcqmc_test.tsv"), lcqmc_split(zh / "lcqmc_dev.tsv"))


def lcqmc_split(path: Path) -> Split:
    """Every distinct second sentence a document; the first `LCQMC_QUERIES` distinct first sentences of positive
    pairs the queries, each answered by its positive pairs' second sentences."""
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t"))
    ids = {text: str(n) for n, text in enumerate(sorted({row["sentence2"] for row in rows}))}
    qrels: Qrels = {}
    queries: dict[str, str] = {}
    for row in rows:
        if row["label"] == "1":
            query_id = queries.setdefault(row["sentence1"], f"q{len(queries)}")
            qrels.setdefault(query_id, {})[ids[row["sentence2"]]] = 1
    chosen = {text: query_id for text, query_id in list(queries.items())[:LCQMC_QUERIES]}
    return Split(
        {i: text for text, i in ids.items()},
        {i: text for text, i in chosen.items()},
        {i: qrels[i] for i in chosen.values()},
    )


def sets_in(data: Path, names: Sequence[str]) -> list[RetrievalSet]:
    """The named sets found under `data` (beir/<name>/ or zh/lcqmc_*.tsv); missing ones are skipped."""
    found = []
    for name in names:
        if name == "lcqmc" and (data / "zh" / "lcqmc_test.tsv").exists():
            found.append(lcqmc_set(data / "zh"))
        elif (data / "beir" / name / "corpus.jsonl").exists():
            found.append(beir_set(data / "beir" / name))
    return found
