"""The load: open loop (Poisson arrivals at a target rate, so a slow platform cannot slow its own load), from the
teams, in a mix by requests, through nginx. Each request is one coroutine that writes one `Record`; a video submit
also follows its task (polling or its event stream) to the end, a document upsert is searched for at once.

The mix's families: embeddings (single texts and batches of 32, with repeats), search (with and without a
filter), chat (streamed and not), video (submit with an Idempotency-Key, then follow), writes (upserts and
deletes of the live documents, usage and admin reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field

import httpx

from bench.soak.data import Corpus
from bench.soak.platform import CHAT_MODEL
from bench.soak.records import Record
from bench.soak.teams import ADMIN_KEY, Team

COLLECTION = "soak"
DEFAULT_MIX = {"embeddings": 40.0, "search": 25.0, "chat": 20.0, "video": 5.0, "writes": 10.0}
EMBEDDING_REPEAT_RATE = 0.3  # share of texts seen recently: the cache's hits
CHAT_REPEAT_RATE = 0.2  # a recent question asked again word for word: the exact prompt cache's hits
CHAT_PARTNER_RATE = 0.3  # the other side of a recent question's pair: the semantic cache's chances (and traps)
RECENT_QUESTIONS = 50  # well within what the semantic cache remembers per context
TERMINAL = frozenset({"completed", "failed", "cancelled", "missing"})  # missing: 404, the task is lost


def parse_mix(text: str) -> dict[str, float]:
    """'embeddings=40,search=25,...' -> weights; families not named keep no share."""
    mix: dict[str, float] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in DEFAULT_MIX:
            raise ValueError(f"unknown family {name!r} in --mix; known: {', '.join(DEFAULT_MIX)}")
        mix[name] = float(weight)
    if not mix or sum(mix.values()) <= 0:
        raise ValueError(f"--mix {text!r} gives no family a share")
    return mix


@dataclass
class VideoTask:
    id: str
    prompt: str
    team: str
    accepted_at: float
    status: str = "pending"
    ended_at: float | None = None


@dataclass
class Load:
    """The load generator's state: what it sent, what it was told, what it must find again."""

    base_url: str
    corpus: Corpus
    teams: list[Team]
    collection_size: int
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    seed: int = 0
    rate: float = 10.0  # requests per second now; the schedule changes it
    records: list[Record] = field(default_factory=list)
    videos: dict[str, VideoTask] = field(default_factory=dict)  # by task id
    live_documents: dict[str, str] = field(default_factory=dict)  # acknowledged upserts not deleted: id -> text
    uncertain_documents: set[str] = field(default_factory=set)  # a write whose outcome the client does not know
    answers: dict[str, str] = field(default_factory=dict)  # chat answer text -> question it was generated for
    false_hits: int = 0
    false_hit_examples: list[tuple[str, str]] = field(default_factory=list)  # (asked, answer generated for)
    semantic_hits: int = 0
    exact_hits: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.ids = itertools.count()
        self.recent_texts: list[str] = []
        self.recent_questions: deque[str] = deque(maxlen=RECENT_QUESTIONS)
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(120.0, connect=5.0),
            limits=httpx.Limits(max_connections=2000, max_keepalive_connections=200),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------------ the open loop

    async def run(self, seconds: float, *, until: asyncio.Event | None = None) -> None:
        """Send requests at Poisson arrivals of `self.rate` for `seconds` (or, given `until`, at least `seconds` and
        until it is set); do not wait for their answers."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        scheduled = loop.time()
        while True:
            scheduled += self.rng.expovariate(max(self.rate, 0.01))
            if scheduled >= end and (until is None or until.is_set()):
                return
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(0.0, loop.time() - scheduled)
            task = loop.create_task(self.one(lag))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Wait for the requests and task watchers still running, then cancel what is left."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def pick_team(self) -> Team:
        return self.rng.choices(self.teams, weights=[team.weight for team in self.teams])[0]

    async def one(self, lag: float) -> None:
        family = self.rng.choices(list(self.mix), weights=list(self.mix.values()))[0]
        team = self.pick_team()
        if family == "embeddings":
            await self.embeddings(team, lag, batch=self.rng.random() < 0.25)
        elif family == "search":
            await self.search(team, lag, filtered=self.rng.random() < 0.5)
        elif family == "chat":
            await self.chat(team, lag, stream=self.rng.random() < 0.5)
        elif family == "video":
            await self.video(team, lag)
        else:
            roll = self.rng.random()
            if roll < 0.5:
                await self.upsert(team, lag)
            elif roll < 0.7:
                await self.delete(team, lag)
            elif roll < 0.85:
                await self.usage_read(team, lag)
            else:
                await self.admin_read(lag)

    # ------------------------------------------------------------------ one request

    def record(self, route: str, team: str, lag: float) -> Record:
        record = Record(id=f"s{next(self.ids)}", route=route, team=team, start=time.time(), lag=lag)
        self.records.append(record)
        return record

    async def send(
        self,
        record: Record,
        method: str,
        path: str,
        key: str,
        *,
        json_body: object = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response | None:
        """One request; its status, latency and error go into `record`. None: no answer."""
        started = time.perf_counter()
        try:
            response = await self.client.request(
                method,
                path,
                json=json_body,
                headers={"Authorization": f"Bearer {key}", "X-Soak-Id": record.id, **(headers or {})},
            )
        except httpx.HTTPError as exc:
            record.latency = time.perf_counter() - started
            record.error = f"{type(exc).__name__}: {exc}"[:200]
            return None
        record.latency = time.perf_counter() - started
        record.status = response.status_code
        if response.status_code >= 500:
            record.error = response.text[:200]
        return response

    def text(self) -> str:
        """A text to embed: one seen recently (a cache hit) at EMBEDDING_REPEAT_RATE, else a new one."""
        if self.recent_texts and self.rng.random() < EMBEDDING_REPEAT_RATE:
            return self.rng.choice(self.recent_texts)
        text = self.corpus.document(self.rng.randrange(10**9))[1]
        self.recent_texts.append(text)
        if len(self.recent_texts) > 500:
            self.recent_texts.pop(0)
        return text

    async def embeddings(self, team: Team, lag: float, *, batch: bool) -> None:
        record = self.record("embeddings_batch" if batch else "embeddings", team.name, lag)
        texts = [self.text() for _ in range(32)] if batch else self.text()
        response = await self.send(
            record, "POST", "/v1/embeddings", team.key, json_body={"input": texts, "model": "bge"}
        )
        record.counted = response is not None and response.status_code == 200

    async def search(self, team: Team, lag: float, *, filtered: bool) -> None:
        record = self.record("search_filter" if filtered else "search", team.name, lag)
        _, text, metadata = self.corpus.document(self.rng.randrange(self.collection_size))
        body: dict[str, object] = {"query": text.split(":", 1)[1], "top_k": 10}
        if filtered:
            body["filter"] = {"topic": metadata["topic"]}
        response = await self.send(record, "POST", f"/v1/collections/{COLLECTION}/search", team.key, json_body=body)
        record.counted = response is not None and response.status_code == 200

    async def upsert(self, team: Team, lag: float) -> None:
        """Upsert one live document, then search for it at once (any replica): read-your-writes."""
        record = self.record("upsert", team.name, lag)
        document_id = f"live-{record.id}"
        text = f"live document {record.id}: {self.corpus.document(self.rng.randrange(10**9))[1]}"
        body = {"documents": [{"id": document_id, "text": text, "metadata": {"topic": "live", "soak": document_id}}]}
        self.uncertain_documents.add(document_id)
        response = await self.send(record, "POST", f"/v1/collections/{COLLECTION}/documents", team.key, json_body=body)
        if response is None or response.status_code >= 500:
            return  # unknown outcome: not acknowledged, not checked
        self.uncertain_documents.discard(document_id)
        if response.status_code != 200:
            return
        record.counted = True
        self.live_documents[document_id] = text
        check = self.record("search_after_upsert", team.name, 0.0)
        query = {"query": text, "top_k": 1, "filter": {"soak": document_id}}
        found = await self.send(check, "POST", f"/v1/collections/{COLLECTION}/search", team.key, json_body=query)
        if found is not None and found.status_code == 200:
            check.counted = True
            hits = found.json().get("data", [])
            if not hits or hits[0].get("id") != document_id:
                check.check = f"read-your-writes: found {[hit.get('id') for hit in hits]}"

    async def delete(self, team: Team, lag: float) -> None:
        if not self.live_documents:
            return
        document_id = self.rng.choice(sorted(self.live_documents))
        record = self.record("delete", team.name, lag)
        self.live_documents.pop(document_id)
        self.uncertain_documents.add(document_id)  # until the answer says
        body = {"ids": [document_id]}
        response = await self.send(
            record, "POST", f"/v1/collections/{COLLECTION}/documents/delete", team.key, json_body=body
        )
        if response is not None and response.status_code == 200:
            self.uncertain_documents.discard(document_id)  # gone, and known to be
        elif response is not None and response.status_code < 500:
            self.uncertain_documents.discard(document_id)
            self.live_documents[document_id] = ""  # refused (e.g. 429): still there

    async def chat(self, team: Team, lag: float, *, stream: bool) -> None:
        record = self.record("chat_stream" if stream else "chat", team.name, lag)
        question = self.question()
        body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": question}], "stream": stream}
        headers = {"Authorization": f"Bearer {team.key}", "X-Soak-Id": record.id}
        started = time.perf_counter()
        answer = ""
        try:
            if not stream:
                response = await self.client.post("/v1/chat/completions", json=body, headers=headers)
                record.status = response.status_code
                if response.status_code == 200:
                    answer = response.json()["choices"][0]["message"].get("content") or ""
                elif response.status_code >= 500:
                    record.error = response.text[:200]
                record.cache = response.headers.get("x-cache", "")
            else:
                async with self.client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                    record.status = response.status_code
                    record.cache = response.headers.get("x-cache", "")
                    if response.status_code != 200:
                        record.error = (await response.aread()).decode(errors="replace")[:200]
                    else:
                        answer = await self._read_stream(response, record, started)
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"[:200]
            record.uncertain = record.status == 200  # cut after the first byte: the gateway may have recorded it
        record.latency = time.perf_counter() - started
        if record.status == 200 and not record.error:
            record.counted = True
            self._judge_cache(question, answer, record.cache)
        elif record.status == 200:
            record.uncertain = True

    async def _read_stream(self, response: httpx.Response, record: Record, started: float) -> str:
        pieces: list[str] = []
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                record.error = str(event["error"].get("message", event["error"]))[:200]
                continue
            for choice in event.get("choices", []):
                delta = choice.get("delta", {})
                if record.ttft is None and (delta.get("content") or delta.get("reasoning_content")):
                    record.ttft = time.perf_counter() - started
                pieces.append(delta.get("content") or "")
        return "".join(pieces)

    def question(self) -> str:
        """A chat question: a recent one again (CHAT_REPEAT_RATE), a partner of a recent one (CHAT_PARTNER_RATE:
        its paraphrase, or in labelled data a near miss as often as the data pairs them), else a new one."""
        roll = self.rng.random()
        if self.recent_questions and roll < CHAT_REPEAT_RATE:
            return self.rng.choice(self.recent_questions)
        partners = self.corpus.partners.get(self.rng.choice(self.recent_questions)) if self.recent_questions else None
        if partners and roll < CHAT_REPEAT_RATE + CHAT_PARTNER_RATE:
            question = self.rng.choice(partners)
        else:
            question = self.rng.choice(self.corpus.questions).text
        self.recent_questions.append(question)
        return question

    def _judge_cache(self, question: str, answer: str, cache: str) -> None:
        """The simulator answers with the question it was asked: a cached answer names the question it was
        generated for, which the paraphrase labels judge."""
        if cache == "miss" or not cache:
            self.answers.setdefault(answer, question)
            return
        if cache == "hit":
            self.exact_hits += 1
            return
        self.semantic_hits += 1
        generated_for = self.answers.get(answer)
        if generated_for is not None and self.corpus.same_meaning(question, generated_for) is False:
            self.false_hits += 1
            self.false_hit_examples.append((question, generated_for))

    async def video(self, team: Team, lag: float) -> None:
        """Submit (retried with the same Idempotency-Key when no answer came, as a client does), then follow the
        task to its end by polling or by its event stream."""
        record = self.record("video_submit", team.name, lag)
        prompt = f"soak video {record.id}: {self.rng.choice(self.corpus.questions).text}"
        headers = {"Idempotency-Key": f"idem-{record.id}"}
        response = None
        for _attempt in range(3):
            response = await self.send(
                record, "POST", "/v1/images/generations", team.key, json_body={"prompt": prompt}, headers=headers
            )
            if response is not None and response.status_code < 500:
                break
            await asyncio.sleep(1.0)
        if response is None or response.status_code != 202:
            return
        task = VideoTask(response.json()["id"], prompt, team.name, time.time())
        record.counted = task.id not in self.videos
        self.videos[task.id] = task
        if self.rng.random() < 0.5:
            await self._poll(task, team)
        else:
            await self._watch(task, team)

    async def _poll(self, task: VideoTask, team: Team) -> None:
        while task.status not in TERMINAL:
            await asyncio.sleep(2.0)
            record = self.record("video_poll", team.name, 0.0)
            response = await self.send(record, "GET", f"/v1/tasks/{task.id}", team.key)
            if response is not None and response.status_code == 200:
                task.status = response.json()["status"]
            elif response is not None and response.status_code == 404:
                task.status = "missing"
        task.ended_at = time.time()

    async def _watch(self, task: VideoTask, team: Team) -> None:
        """The task's event stream until a terminal state; a stream that breaks is opened again."""
        while task.status not in TERMINAL:
            record = self.record("video_watch", team.name, 0.0)
            started = time.perf_counter()
            headers = {"Authorization": f"Bearer {team.key}", "X-Soak-Id": record.id}
            try:
                async with self.client.stream("GET", f"/v1/tasks/{task.id}/events", headers=headers) as response:
                    record.status = response.status_code
                    if response.status_code == 200:
                        async for line in response.aiter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                with contextlib.suppress(ValueError, KeyError, TypeError):
                                    task.status = json.loads(line[6:])["status"]
                    elif response.status_code == 404:
                        task.status = "missing"
                    elif response.status_code >= 500:
                        record.error = (await response.aread()).decode(errors="replace")[:200]
            except httpx.HTTPError as exc:
                record.error = f"{type(exc).__name__}: {exc}"[:200]
            record.latency = time.perf_counter() - started
            if task.status not in TERMINAL:
                await asyncio.sleep(1.0)
        task.ended_at = time.time()

    async def usage_read(self, team: Team, lag: float) -> None:
        record = self.record("usage", team.name, lag)
        day = time.strftime("%Y-%m-%d", time.gmtime())
        await self.send(record, "GET", f"/v1/usage?start={day}&end={day}", team.key)

    async def admin_read(self, lag: float) -> None:
        record = self.record("admin", "operations", lag)
        await self.send(record, "GET", "/v1/admin/keys", ADMIN_KEY)
