"""What the soak sends: a seeded synthetic corpus (documents with a topic, questions with known paraphrases), or the
labelled paraphrase pairs `--data` points at (bench/eval_cache.py's TSV format: sentence1, sentence2, label).

Every question belongs to a group: two questions in one group are paraphrases (an answer to one is right for the
other), two in different groups are not. A semantic cache hit whose answer was generated for a question of another
group is a false hit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from bench.eval_cache import DATA_FILES, load_pairs

TOPICS = ("billing", "storage", "network", "security", "search", "video", "chat", "embeddings")
SUBJECTS = (
    "the invoice", "a backup", "the load balancer", "an API key", "the index", "a render job", "the assistant",
    "the vector store", "a replica", "the quota", "the webhook", "a collection", "the cache", "the model",
    "a team budget", "the upstream", "the encoder", "a stream", "the dashboard", "the scheduler",
)  # fmt: skip
VERBS = (
    "fails after", "slows down during", "recovers from", "is billed for", "is limited by", "is rebuilt after",
    "is retried on", "is cached for", "times out under", "is audited for", "scales with", "is paused by",
)  # fmt: skip
OBJECTS = (
    "a rolling restart", "heavy traffic", "a lost connection", "the monthly report", "a cold start",
    "an expired key", "a full disk", "a slow upstream", "a network partition", "a schema change",
    "the nightly batch", "a region failover", "a memory spike", "a burst of uploads", "a config change",
)  # fmt: skip
# One question, several wordings: some a word apart (a user asking again), some reworded.
TEMPLATES = (
    "why is it that {s} {v} {o}?",
    "so why is it that {s} {v} {o}?",
    "can you explain why {s} {v} {o}?",
    "can you explain why {s} {v} {o}? thanks",
    "please tell me why {s} {v} {o}.",
)


@dataclass
class Question:
    text: str
    group: int


@dataclass
class Corpus:
    seed: int
    questions: list[Question] = field(default_factory=list)
    group_of: dict[str, int] = field(default_factory=dict)  # question text -> group
    # question text -> the texts it is paired with: a paraphrase, or in labelled data also a near miss (label 0)
    partners: dict[str, list[str]] = field(default_factory=dict)

    def document(self, number: int) -> tuple[str, str, dict[str, str | int]]:
        """Document `number` of the seeded collection: (id, text, metadata), the same for the same seed."""
        rng = random.Random(self.seed * 1_000_003 + number)
        topic = TOPICS[number % len(TOPICS)]
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
        text = f"{topic} note {number}: {' '.join(words)}; see runbook {rng.randrange(1000)}."
        return f"doc-{number}", text, {"topic": topic, "shard": number % 16}

    def same_meaning(self, asked: str, answered_for: str) -> bool | None:
        """Whether an answer generated for `answered_for` is right for `asked`; None when either is unknown."""
        first, second = self.group_of.get(asked), self.group_of.get(answered_for)
        if first is None or second is None:
            return None
        return first == second


def synthetic(seed: int, groups: int = 180) -> Corpus:
    """Up to `groups` questions, each in every wording of TEMPLATES. Two questions of different groups share at most
    one of subject, verb and object: different questions, not one word apart (that near miss is a cache's hardest
    case, which `make eval-cache` measures on labelled data)."""
    rng = random.Random(seed)
    corpus = Corpus(seed)
    combos = [(s, v, o) for s in SUBJECTS for v in VERBS for o in OBJECTS]
    rng.shuffle(combos)
    chosen: list[tuple[str, str, str]] = []
    used: set[tuple[int, str, str]] = set()
    for subject, verb, obj in combos:
        pairs = {(0, subject, verb), (1, subject, obj), (2, verb, obj)}
        if pairs & used:
            continue
        used |= pairs
        chosen.append((subject, verb, obj))
        if len(chosen) == groups:
            break
    for group, (subject, verb, obj) in enumerate(chosen):
        wordings = [template.format(s=subject, v=verb, o=obj) for template in TEMPLATES]
        for text in wordings:
            corpus.questions.append(Question(text, group))
            corpus.group_of[text] = group
            corpus.partners[text] = [other for other in wordings if other != text]
    return corpus


def labelled(folder: Path, seed: int) -> Corpus:
    """The labelled pairs under `folder` (en/mrpc_test.tsv, zh/lcqmc_test.tsv, whichever exist): a pair labelled
    1 shares a group, any other sentence has a group of its own. Each sentence's partners are the other sides of
    its pairs, whatever their label: the load asks them in the data's own mix of paraphrases and near misses."""
    corpus = Corpus(seed)
    next_group = 0
    for relative in DATA_FILES.values():
        path = folder / relative
        if not path.exists():
            continue
        for pair in load_pairs(path):
            for text in (pair.sentence1, pair.sentence2):
                if text not in corpus.group_of:
                    corpus.group_of[text] = next_group
                    next_group += 1
            corpus.partners.setdefault(pair.sentence1, []).append(pair.sentence2)
            corpus.partners.setdefault(pair.sentence2, []).append(pair.sentence1)
            if pair.label == 1:
                merged = corpus.group_of[pair.sentence1]
                corpus.group_of[pair.sentence2] = merged
    if not corpus.group_of:
        raise FileNotFoundError(
            f"no labelled pairs under {folder} (expected {', '.join(map(str, DATA_FILES.values()))})"
        )
    corpus.questions = [Question(text, group) for text, group in corpus.group_of.items()]
    return corpus
