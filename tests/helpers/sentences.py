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
