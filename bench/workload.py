"""Deterministic benchmark texts: English and Chinese sentences built from fixed word lists.

No corpus is downloaded: `texts(count, seed)` draws sentences from the templates and
vocabularies below with `random.Random(seed)`, so every machine and every run gets the
same list. Half the texts are English and half Chinese (shuffled together), each of
`min_words` to `max_words` words; a Chinese "word" is one token of 1 to 3 characters.
The parts reuse them: embeddings embed them, chat sends them as prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Language = Literal["en", "zh"]

DEFAULT_SEED = 20240601
MIN_WORDS = 5
MAX_WORDS = 60
MAX_DRAWS = 1000

# -- English ------------------------------------------------------------------------------------------

EN_DETERMINERS = ("the", "a", "every", "this", "our", "their", "one", "each", "some", "another")
EN_ADJECTIVES = (
    "quick", "quiet", "bright", "small", "large", "careful", "modern", "ancient", "local", "remote",
    "simple", "complex", "early", "late", "useful", "broken", "secure", "public", "private", "shared",
    "fresh", "heavy", "light", "slow", "rapid", "green", "distant", "friendly", "noisy", "precise",
)  # fmt: skip
EN_NOUNS = (
    "customer", "engineer", "teacher", "river", "city", "server", "request", "report", "garden", "market",
    "library", "student", "invoice", "message", "window", "network", "recipe", "village", "train", "camera",
    "contract", "doctor", "museum", "database", "painting", "bridge", "festival", "question", "answer", "model",
    "kitchen", "mountain", "harbor", "ticket", "budget", "schedule", "letter", "journey", "factory", "forecast",
)  # fmt: skip
EN_VERBS = (
    "reads", "builds", "checks", "sends", "finds", "opens", "repairs", "describes", "prefers", "visits",
    "updates", "explains", "follows", "collects", "measures", "delivers", "approves", "watches", "paints", "cleans",
)  # fmt: skip
EN_ADVERBS = ("quickly", "quietly", "carefully", "rarely", "often", "slowly", "gladly", "early", "again", "together")
EN_PREPOSITIONS = ("near", "behind", "after", "before", "inside", "across", "without", "during", "above", "beside")
EN_CONNECTORS = ("and", "but", "while", "because", "so", "although", "when", "then")

# -- Chinese (1 to 3 characters a word) -----------------------------------------------------------------

ZH_SUBJECTS = (
    "我们", "他们", "用户", "老师", "学生", "工程师", "医生", "客户", "公司", "团队",
    "妈妈", "朋友", "记者", "司机", "厨师", "经理", "孩子", "邻居", "作者", "银行",
)  # fmt: skip
ZH_ADVERBS = (
    "今天",
    "昨天",
    "明天",
    "已经",
    "经常",
    "马上",
    "终于",
    "也",
    "还",
    "一起",
    "认真",
    "慢慢",
    "很快",
    "总是",
)
ZH_VERBS = (
    "看", "买", "写", "查询", "发布", "修复", "讨论", "喜欢", "参观", "更新",
    "学习", "准备", "检查", "打开", "完成", "介绍", "收到", "寄", "计算", "整理",
)  # fmt: skip
ZH_MEASURES = ("一个", "一份", "这个", "那个", "几本", "两张", "一些", "新的", "旧的", "所有的")
ZH_ADJECTIVES = ("漂亮", "重要", "复杂", "简单", "便宜", "安静", "热闹", "安全", "快速", "详细", "有趣", "古老")
ZH_OBJECTS = (
    "报告", "订单", "手机", "电脑", "模型", "数据", "向量", "文章", "照片", "合同",
    "地图", "菜单", "火车票", "博物馆", "服务器", "数据库", "天气", "问题", "答案", "方案",
    "公园", "城市", "河流", "图书馆", "小说", "电影", "会议", "预算", "邮件", "包裹",
)  # fmt: skip
ZH_PLACES = ("在家里", "在公司", "在北京", "在上海", "在路上", "在学校", "在医院", "在网上")
ZH_CONNECTORS = ("然后", "但是", "所以", "因为", "而且", "同时", "于是", "不过")


@dataclass(frozen=True)
class Sample:
    """One text, its language and how many words it was built from."""

    text: str
    language: Language
    words: int


def texts(count: int = 2000, seed: int = DEFAULT_SEED) -> list[str]:
    """`count` distinct texts, half English and half Chinese, the same for the same seed."""
    return [sample.text for sample in samples(count, seed)]


def samples(
    count: int = 2000, seed: int = DEFAULT_SEED, *, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS
) -> list[Sample]:
    """Like `texts`, with each text's language and word count."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words} and {max_words}")
    rng = random.Random(seed)
    english_texts: list[Language] = ["en"] * (count - count // 2)
    chinese_texts: list[Language] = ["zh"] * (count // 2)
    languages = english_texts + chinese_texts
    rng.shuffle(languages)
    seen: set[str] = set()
    result = []
    for language in languages:
        for _ in range(MAX_DRAWS):  # redraw the rare duplicate: a cache must not see repeats it was not meant to
            words = rng.randint(min_words, max_words)
            text = english(rng, words) if language == "en" else chinese(rng, words)
            if text not in seen:
                break
        else:
            raise ValueError(f"cannot draw {count} distinct texts of {min_words} to {max_words} words")
        seen.add(text)
        result.append(Sample(text, language, words))
    return result


def english(rng: random.Random, words: int) -> str:
    """A sentence of exactly `words` space-separated words, capitalised, ending in a full stop."""
    tokens: list[str] = []
    while len(tokens) < words:
        if tokens:
            tokens.append(rng.choice(EN_CONNECTORS))
        tokens.extend(_english_clause(rng))
    tokens = tokens[:words]
    return " ".join(tokens).capitalize() + "."


def _english_clause(rng: random.Random) -> list[str]:
    clause = [rng.choice(EN_DETERMINERS)]
    if rng.random() < 0.6:
        clause.append(rng.choice(EN_ADJECTIVES))
    clause.append(rng.choice(EN_NOUNS))
    if rng.random() < 0.3:
        clause.append(rng.choice(EN_ADVERBS))
    clause += [rng.choice(EN_VERBS), rng.choice(EN_DETERMINERS), rng.choice(EN_NOUNS)]
    if rng.random() < 0.4:
        clause += [rng.choice(EN_PREPOSITIONS), "the", rng.choice(EN_NOUNS)]
    return clause


def chinese(rng: random.Random, words: int) -> str:
    """A sentence of exactly `words` Chinese words (no spaces): clauses joined by full-width commas, a full stop."""
    clauses: list[list[str]] = []
    used = 0
    while used < words:
        connector = [rng.choice(ZH_CONNECTORS)] if clauses and words - used > 2 else []
        clause = connector + _chinese_clause(rng)
        clause = clause[: words - used]
        clauses.append(clause)
        used += len(clause)
    return "，".join("".join(clause) for clause in clauses) + "。"


def _chinese_clause(rng: random.Random) -> list[str]:
    clause = [rng.choice(ZH_SUBJECTS)]
    if rng.random() < 0.5:
        clause.append(rng.choice(ZH_ADVERBS))
    if rng.random() < 0.3:
        clause.append(rng.choice(ZH_PLACES))
    clause += [rng.choice(ZH_VERBS), rng.choice(ZH_MEASURES)]
    if rng.random() < 0.5:
        clause += [rng.choice(ZH_ADJECTIVES), "的"]
    clause.append(rng.choice(ZH_OBJECTS))
    return clause
