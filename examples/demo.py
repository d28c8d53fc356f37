"""`make demo`: embeddings, chat and the caches through the gateway (official `openai` client); search over a
small collection of English and Chinese documents by meaning, by words and both, reranked where a reranker is
exported; then a video task: submitted (202), watched over server-sent events until the simulated Pika job ends.

Runs against what `make demo` starts: Triton, the TokenHub and fal simulators and the gateway on their
default ports.
"""

from __future__ import annotations

import json
import os
import sys
import time

import httpx
from openai import OpenAI

GATEWAY = os.environ.get("GATEWAY_URL", "http://127.0.0.1:8080")


def main() -> int:
    client = OpenAI(base_url=f"{GATEWAY}/v1", api_key=os.environ.get("GATEWAY_API_KEY", "demo"))
    texts = ["How do I reset my password?", "I forgot my password, how can I change it?", "The weather is nice today."]
    vectors = [item.embedding for item in client.embeddings.create(model="bge", input=texts).data]
    print(f"embeddings: {len(vectors)} x {len(vectors[0])}")
    for i, text in enumerate(texts[1:], start=1):
        similarity = sum(a * b for a, b in zip(vectors[0], vectors[i], strict=True))
        print(f"  cos({texts[0]!r}, {text!r}) = {similarity:.3f}")

    question = [{"role": "user", "content": "用一句话介绍 Triton 推理服务器。"}]
    started = time.perf_counter()
    stream = client.chat.completions.create(model="hy3-preview", messages=question, stream=True)
    first = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - started
            print(chunk.choices[0].delta.content, end="", flush=True)
    print(f"\nstreamed chat: first token after {first or 0:.2f} s, done after {time.perf_counter() - started:.2f} s")

    with httpx.Client(timeout=60) as http:
        body = {"model": "hy3-preview", "messages": [{"role": "user", "content": "What is an embedding?"}]}
        for attempt in ("first", "repeat"):
            started = time.perf_counter()
            response = http.post(f"{GATEWAY}/v1/chat/completions", json=body)
            elapsed = time.perf_counter() - started
            print(f"chat ({attempt}): {response.status_code} X-Cache={response.headers.get('x-cache')} {elapsed:.2f} s")
        search_walkthrough(http)
        image_task(http)
    return 0


DOCUMENTS = [
    {"id": "reset", "text": "How do I reset the password of my account?", "metadata": {"lang": "en"}},
    {"id": "login", "text": "I forgot my credentials and cannot sign in.", "metadata": {"lang": "en"}},
    {
        "id": "filter",
        "text": "Replacement filter cartridge, part XK-4711, fits every model.",
        "metadata": {"lang": "en"},
    },
    {"id": "gpu", "text": "推理服务器在 GPU 上运行嵌入模型。", "metadata": {"lang": "zh"}},
    {"id": "weather", "text": "明天北京的天气怎么样？", "metadata": {"lang": "zh"}},
]
QUERIES = ["unable to log into my profile", "XK-4711", "北京天气"]
MANUAL = " ".join(
    [
        "Installation. Unpack the archive, run the installer and accept the licence; the service starts on port 8080.",
        "Accounts. To reset a password, open Settings, choose Security and click 'Reset password'.",
        "Backups. The nightly backup copies every collection to the bucket named in BACKUP_BUCKET.",
        "Troubleshooting. If the service does not start, check that port 8080 is free and read the log.",
    ]
    * 3
)


def search_walkthrough(http: httpx.Client) -> None:
    """A collection, an upsert, each query in each mode side by side; a rerank where a reranker is served."""
    http.delete(f"{GATEWAY}/v1/collections/demo")  # left by an earlier run, if any
    created = http.post(f"{GATEWAY}/v1/collections", json={"name": "demo"})
    if created.status_code != 201:
        print(f"search: {created.status_code} {created.json()['error']['message']}")
        return
    upserted = http.post(f"{GATEWAY}/v1/collections/demo/documents", json={"documents": DOCUMENTS}).json()
    print(f"search: {len(upserted['data'])} documents upserted into collection 'demo'")
    for query in QUERIES:
        print(f"  {query!r}")
        for mode in ("dense", "lexical", "hybrid"):
            body = {"query": query, "mode": mode, "top_k": 2}
            hits = http.post(f"{GATEWAY}/v1/collections/demo/search", json=body).json()["data"]
            shown = ", ".join(f"{hit['id']} ({hit['score_type']} {hit['score']:.3f})" for hit in hits) or "nothing"
            print(f"    {mode:>7}: {shown}")
    chunked_document(http)
    texts = [d["text"] for d in DOCUMENTS]
    reranked = http.post(f"{GATEWAY}/v1/rerank", json={"query": "password problems", "documents": texts, "top_n": 2})
    if reranked.status_code == 200:
        best = ", ".join(
            f"{DOCUMENTS[r['index']]['id']} {r['relevance_score']:.3f}" for r in reranked.json()["results"]
        )
        print(f"  rerank 'password problems': {best}")
    else:
        print(f"  rerank: {reranked.json()['error']['message']}")


def chunked_document(http: httpx.Client) -> None:
    """A long document in a collection that chunks: the search answers it once, with the chunk that matched."""
    http.delete(f"{GATEWAY}/v1/collections/demo-manuals")
    chunking = {"max_tokens": 48, "overlap": 8}
    http.post(f"{GATEWAY}/v1/collections", json={"name": "demo-manuals", "chunking": chunking})
    http.post(f"{GATEWAY}/v1/collections/demo-manuals/documents", json={"documents": [{"id": "guide", "text": MANUAL}]})
    body = {"query": "where do backups go?", "top_k": 1}
    (hit,) = http.post(f"{GATEWAY}/v1/collections/demo-manuals/search", json=body).json()["data"]
    chunk = hit["chunk"]
    print(f"  chunked ({len(MANUAL)} characters, {chunking}): 'where do backups go?' -> {hit['id']}, characters "
          f"{chunk['start']}-{chunk['end']}: {chunk['text'][:70]!r}...")  # fmt: skip


def image_task(http: httpx.Client) -> None:
    started = time.perf_counter()
    body = {"prompt": "a paper boat on a lake", "size": "1280x720"}
    answer = http.post(f"{GATEWAY}/v1/images/generations", json=body)
    task = answer.json()
    print(f"video task: {answer.status_code} {task['id']} {task['status']} after {time.perf_counter() - started:.3f} s")
    with http.stream("GET", f"{GATEWAY}/v1/tasks/{task['id']}/events") as events:
        for line in events.iter_lines():
            if line.startswith("data: {"):
                task = json.loads(line[len("data: ") :])
                print(f"  {time.perf_counter() - started:5.2f} s  {task['status']}")
    print(f"  result (short-lived URL): {task['urls'] or task['error']}")


if __name__ == "__main__":
    sys.exit(main())
