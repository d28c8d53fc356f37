"""The English and Chinese texts the embedding tests send, to Triton directly or through the gateway."""

from __future__ import annotations

ENGLISH = [
    "How do I reset my password?",
    "The cat sat on the mat while the rain kept falling outside.",
    "Dynamic batching groups requests from many clients.",
]
CHINESE = ["如何重置我的密码？", "今天天气很好，我们去公园散步吧。", "深度学习模型在图像识别任务中取得了显著的进步。"]

SHORT_ENGLISH = ["How do I reset my password?", "The weather is lovely today.", "Triton batches requests together."]
SHORT_CHINESE = ["如何重置我的密码？", "今天天气很好。", "深度学习模型取得了显著的进步。"]

# Long enough to keep the encoder busy while a test does something else (a shutdown, a timeout, a limit).
SLOW_BATCH = ["a long sentence about many things " * 60 + str(i) for i in range(256)]


def mixed_texts(count: int, tag: str = "") -> list[str]:
    """Distinct English and Chinese texts, deterministic."""
    return [
        f"{SHORT_ENGLISH[i % 3]} {tag}#{i}" if i % 2 == 0 else f"{SHORT_CHINESE[i % 3]} {tag}第{i}条"
        for i in range(count)
    ]


def paraphrase_pairs() -> list[tuple[str, str]]:
    """(question, passage) pairs, English and Chinese, deterministic: each question asks for its own passage in
    other words, while other passages share its people, deeds or places (near misses for a search to rank)."""
    people = [("the baker", "面包师"), ("my neighbour", "我的邻居"), ("a young pilot", "一位年轻的飞行员"),
              ("the old fisherman", "老渔夫"), ("our teacher", "我们的老师"), ("the mayor", "市长"),
              ("a tired nurse", "一位疲惫的护士"), ("the chess champion", "象棋冠军")]  # fmt: skip
    deeds = [
        ("repaired the bicycle", "fixed the bike", "修好了自行车", "把单车修理好了"),
        ("painted the garden fence", "put new paint on the fence", "给花园的篱笆刷了漆", "重新粉刷了篱笆"),
        ("lost the house keys", "could not find the keys to the house", "丢了家里的钥匙", "找不到房门钥匙"),
        ("baked a chocolate cake", "made a cake with chocolate", "烤了一个巧克力蛋糕", "做了巧克力蛋糕"),
        ("planted three apple trees", "put three apple trees in the ground", "种了三棵苹果树", "栽下了三棵苹果树"),
        ("wrote a letter to the newspaper", "sent the paper a letter", "给报社写了一封信", "寄信给报纸编辑部"),
    ]
    places = [("near the harbour", "在港口附近"), ("in the mountains", "在山里"), ("at the airport", "在机场")]
    pairs = []
    for p, (person, person_zh) in enumerate(people):
        for d, (deed, asked, deed_zh, asked_zh) in enumerate(deeds):
            place, place_zh = places[(p + d) % len(places)]
            pairs.append((f"Who {asked} {place}?", f"{person.capitalize()} {deed} {place} last week."))
            pairs.append((f"谁{place_zh}{asked_zh}？", f"上周{person_zh}{place_zh}{deed_zh}。"))
    return pairs
