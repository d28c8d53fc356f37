"""Re-index jobs: re-embed every stored text of a collection with the served model and write its lexical terms
again with the gateway's analyzer, as a durable task. A collection whose vectors are of the served revision
already only gets its terms written: how a collection written before lexical search (or by another analyzer
version) gets its lexical index.

A job is a `Task` (the video tasks' record, states and compare-and-set stores) in its own task store (SQLite
next to the embedded collections, or Redis under its own key prefix), so the video runner never sees it:

    pending ──> processing ──> completed
                    │
                    └────────> failed (the collection was deleted, or the model changed its dimensions)

The collection is re-embedded in place. From the moment a job is accepted its record names the job
(`reindex_task`), and its searches and writes answer 409 until the job completes: its vectors are then of two
revisions, and are never compared to a query nor joined by a new document. Each page of documents is re-embedded
and written, then the cursor of the next page is saved on the task, so a job cut short by a crash resumes from
its last saved page in the next process (a page done twice is harmless). Last, the collection's record takes
the served model and revision and loses the job's mark, then the task completes. If the served revision changes
during the job, the job starts over from the first page with the new one.

A job runs on the replica holding its lease, renewed as it goes; a replica that dies leaves the lease to expire
and another one's scan takes the job over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import AsyncGenerator
from functools import partial
from typing import Any

from gateway import metrics
from gateway.background import cancel_and_wait
from gateway.errors import ConflictError, GatewayError, NotFoundError, UpstreamUnavailableError
from gateway.search.analyzer import ANALYZER, analyze_many
from gateway.search.chunks import DOCUMENT, INDEX
from gateway.search.documents import Collection, Document, Vector
from gateway.search.store import CollectionNotFoundError, IndexUpdate, VectorStore
from gateway.services.embeddings import EmbeddingService
from gateway.services.search_chunks import ChunkedDocuments
from gateway.tasks.base import PURGE_EVERY_SECONDS, Lease, TaskStore
from gateway.tasks.model import Task, TaskError, TaskState
from gateway.tasks.redis_store import RedisTaskStore
from gateway.tasks.scanner import TaskScanner
from gateway.tasks.watch import watch
from gateway.upstreams.triton import ModelInfo

log = logging.getLogger(__name__)

PAGE_DOCUMENTS = 64  # documents re-indexed and written per step (and per saved cursor)
RETRY_SECONDS = (0.5, 10.0)  # first and longest pause while Triton or the store is unavailable
JOB_DEADLINE_SECONDS = 30 * 24 * 3600.0  # a job has no deadline of its own; the task record wants one


class ReindexJobs:
    """Accepts re-index jobs, runs them on this replica and picks up the ones left unfinished."""

    def __init__(
        self,
        tasks: TaskStore,
        store: VectorStore,
        embeddings: EmbeddingService,
        chunks: ChunkedDocuments | None = None,
        *,
        owner: str,
        retention_seconds: float,
        lease_seconds: float,
        scan_interval_seconds: float,
    ) -> None:
        self._tasks = tasks
        self._store = store
        self._embeddings = embeddings
        self._chunks = chunks
        self._owner = owner
        self._retention = retention_seconds
        self._lease_seconds = lease_seconds
        self._running: dict[str, asyncio.Task[None]] = {}
        self._accepting = asyncio.Lock()  # one accept at a time: two calls never both mark a collection
        self._last_purge = float("-inf")
        # A Redis outage is logged once by the Redis circuit, for all its users.
        self._scanner = TaskScanner(
            "re-index job",
            self._scan_once,
            scan_interval_seconds,
            metrics.REINDEX_SCAN_FAILURES,
            outages_logged_elsewhere=isinstance(tasks, RedisTaskStore),
        )

    async def start(self) -> None:
        """Resume the unfinished jobs now, and look for abandoned ones every scan interval."""
        self._scanner.start()

    async def aclose(self) -> None:
        await self._scanner.aclose()
        await cancel_and_wait(*self._running.values(), name="re-index jobs")
        self._running.clear()

    async def submit(self, name: str) -> tuple[Task, bool]:
        """The collection's job: a new one (True), or the one already under way (False)."""
        async with self._accepting:
            collection = await self._store.get_collection(name)
            if collection.reindex_task is not None:
                running = await self._tasks.get(collection.reindex_task)
                if running is not None and not running.state.terminal:
                    return running, False
            served = await self._embeddings.model_info()
            check_dimensions(collection, served)
            now = time.time()
            task = Task(
                id=f"reindex_{Task.new_id().removeprefix('task_')}",
                state=TaskState.PENDING,
                arguments={"collection": name, "model": served.name, "model_revision": served.revision},
                created_at=now,
                updated_at=now,
                deadline_at=now + JOB_DEADLINE_SECONDS,
                result={"documents": 0, "total": collection.documents, "cursor": None, "runs": 0},
            )
            # The task first: a crash between the two leaves a job that marks the collection when it runs,
            # never a collection marked by a job nobody will run.
            task, _ = await self._tasks.create(task, self._lease(name))
            await self._store.update_collection(dataclasses.replace(collection, reindex_task=task.id, documents=0))
            self._launch(task)
            return task, True

    async def get(self, name: str, task_id: str) -> Task:
        task = await self._tasks.get(task_id)
        if task is None or task.arguments.get("collection") != name:
            raise NotFoundError(
                f"collection {name!r} has no re-index task {task_id!r} (unknown, or expired after its retention)",
                code="task_not_found",
                param="task_id",
            )
        return task

    async def watch(self, name: str, task_id: str) -> AsyncGenerator[Task, None]:
        """The job now and at each change of its status or progress, ending with its final state (404 up front)."""
        return await watch(partial(self.get, name, task_id), partial(self._tasks.changes, task_id), visible)

    # -- running -----------------------------------------------------------------------------------------

    def _lease(self, name: str) -> Lease:
        return Lease(f"reindex:{name}", self._owner, self._lease_seconds)

    def _launch(self, task: Task) -> None:
        running = self._running.get(task.id)
        if running is None or running.done():
            self._running[task.id] = asyncio.create_task(self._run(task.id))

    async def _scan_once(self) -> None:
        """Launch the due jobs whose lease this replica takes; purge expired ones when due."""
        for task in await self._tasks.due(math.inf):  # the job store holds re-index jobs only
            if task.id not in self._running:
                lease = self._lease(str(task.arguments["collection"]))
                if await self._tasks.acquire_lease(lease.name, lease.owner, lease.ttl_seconds):
                    self._launch(task)
        if (now := time.time()) - self._last_purge >= PURGE_EVERY_SECONDS:
            await self._tasks.purge_expired(now)
            self._last_purge = now

    async def _run(self, task_id: str) -> None:
        pause = RETRY_SECONDS[0]
        try:
            while True:
                try:
                    await self._work(task_id)
                    return
                except UpstreamUnavailableError as exc:  # Triton, the store or the task store: wait it out
                    log.warning("re-index %s waits: %s", task_id, exc)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_SECONDS[1])
                except GatewayError as exc:  # left to the next scan, which takes it up again if it is ours
                    log.warning("re-index %s stopped: %s", task_id, exc)
                    return
                except Exception:  # a bug: the job fails rather than being retried on every scan
                    log.exception("re-index %s failed", task_id)
                    task = await self._task(task_id)
                    if not task.state.terminal:
                        await self._end(task, TaskState.FAILED, TaskError("internal_error", "the re-index failed"))
                    return
        finally:
            self._running.pop(task_id, None)

    async def _work(self, task_id: str) -> None:
        task = await self._task(task_id)
        if task.state.terminal:
            return
        name = str(task.arguments["collection"])
        lease = self._lease(name)
        try:
            collection = await self._store.collection(name)
        except CollectionNotFoundError:
            await self._end(task, TaskState.FAILED, TaskError("collection_deleted", f"collection {name!r} was deleted"))
            return
        target = (task.arguments["model"], task.arguments["model_revision"])
        if collection.reindex_task is None and (collection.model, collection.model_revision) == target:
            await self._end(task, TaskState.COMPLETED)  # the record was switched just before a crash
            return
        if collection.reindex_task not in (None, task.id):
            await self._end(task, TaskState.FAILED, TaskError("superseded", "another re-index took the collection"))
            return
        if collection.reindex_task is None:
            collection = dataclasses.replace(collection, reindex_task=task.id)
            await self._store.update_collection(collection)
        progress = dict(task.result or {})
        progress["runs"] = int(progress.get("runs", 0)) + 1  # more than 1: the job was resumed
        task = await self._save(task, TaskState.PROCESSING, progress)
        while True:
            if not await self._tasks.acquire_lease(lease.name, lease.owner, lease.ttl_seconds):
                return  # another replica has taken the job over
            served = await self._embeddings.model_info()
            if (served.name, served.revision) != (task.arguments["model"], task.arguments["model_revision"]):
                try:
                    check_dimensions(collection, served)
                except ConflictError as exc:
                    await self._end(task, TaskState.FAILED, TaskError("dimensions_changed", exc.message))
                    return
                arguments = {**task.arguments, "model": served.name, "model_revision": served.revision}
                progress = {**progress, "cursor": None, "documents": 0}  # from the start, with the new revision
                task = await self._save(dataclasses.replace(task, arguments=arguments), TaskState.PROCESSING, progress)
            documents, following = await self._store.scroll(name, progress.get("cursor"), PAGE_DOCUMENTS)
            if collection.chunking is not None:
                done = await self._rechunk(collection, documents)
            elif documents:
                await self._store.set_index(name, await self._index(collection, task, documents))
                done = len(documents)
            progress = {**progress, "cursor": following, "documents": int(progress["documents"]) + done}
            task = await self._save(task, TaskState.PROCESSING, progress)
            if following is None:
                break
        model, revision = task.arguments["model"], task.arguments["model_revision"]
        lexical = ANALYZER if await self._store.lexical(name) else None
        finished = dataclasses.replace(
            collection, model=model, model_revision=revision, reindex_task=None, lexical=lexical
        )
        await self._store.update_collection(finished)
        await self._end(task, TaskState.COMPLETED)
        await self._tasks.release_lease(lease.name, lease.owner)
        log.info("collection %s re-indexed with %s revision %s", name, model, revision)

    async def _index(self, collection: Collection, task: Task, documents: list[Document]) -> dict[str, IndexUpdate]:
        """The page's terms, and its vectors unless the collection's are of the job's revision already (a job
        that only builds the lexical index of a collection written before it)."""
        texts = [d.text for d in documents]
        terms = await asyncio.to_thread(analyze_many, texts)
        vectors: list[Vector | None] = [None] * len(documents)
        if (collection.model, collection.model_revision) != (task.arguments["model"], task.arguments["model_revision"]):
            vectors = list((await self._embeddings.embed(texts)).vectors)
        return {d.id: IndexUpdate(v, t) for d, v, t in zip(documents, vectors, terms, strict=True)}

    async def _rechunk(self, collection: Collection, page: list[Document]) -> int:
        """A chunked collection's page of chunks: each document whose first chunk it holds is chunked, embedded
        and written again whole (the served model's tokenizer may cut it otherwise), its timestamps kept."""
        if self._chunks is None or collection.chunking is None:
            raise RuntimeError("a chunked collection's re-index needs the chunked documents")
        firsts = [str(d.metadata[DOCUMENT]) for d in page if d.metadata.get(INDEX) == 0]
        for document in await self._chunks.get(collection.name, firsts):
            await self._chunks.upsert(collection.name, collection.chunking, [document], document.updated_at)
        return len(firsts)

    async def _task(self, task_id: str) -> Task:
        task = await self._tasks.get(task_id)
        if task is None:
            raise NotFoundError(f"re-index task {task_id!r} is gone")
        return task

    async def _save(self, task: Task, state: TaskState, result: dict[str, Any] | None = None) -> Task:
        """`task` in `state` with `result`, saved (compare-and-set: one runner per job, so a lost race is a
        re-read, never a lost job)."""
        new = task.moved(state, time.time(), result=task.result if result is None else result)
        if not await self._tasks.save(new):
            raise ConflictError(f"re-index task {task.id} was changed by another writer", code="task_conflict")
        return new

    async def _end(self, task: Task, state: TaskState, error: TaskError | None = None) -> None:
        now = time.time()
        ended = task.moved(state, now, ended_at=now, expires_at=now + self._retention, error=error)
        await self._tasks.save(ended)
        if error is not None:
            log.warning("re-index %s failed: %s", task.id, error.message)


def check_dimensions(collection: Collection, served: ModelInfo) -> None:
    if served.dimension != collection.dimensions:
        raise ConflictError(
            f"collection {collection.name!r} holds {collection.dimensions}-dimensional vectors and {served.name} "
            f"makes {served.dimension}: a collection cannot change its dimensions; create a new collection and "
            "upsert its documents there",
            code="dimensions_changed",
            param="name",
        )


def visible(task: Task) -> tuple[object, ...]:
    """What a watcher sees of a job: a change in anything else (the cursor, a lease renewal) is not an event."""
    return task.state, public_progress(task), task.arguments, task.error


def public_progress(task: Task) -> dict[str, int]:
    result = task.result or {}
    return {"documents": int(result.get("documents", 0)), "total": int(result.get("total", 0))}


def check_writable(collection: Collection) -> None:
    """409 while a re-index job holds the collection (its vectors are of two revisions until it ends)."""
    if collection.reindex_task is not None:
        raise ConflictError(
            f"collection {collection.name!r} is being re-indexed by task {collection.reindex_task}; it answers "
            f"again when the task completes (GET /v1/collections/{collection.name}/reindex/"
            f"{collection.reindex_task}; if it failed, POST /v1/collections/{collection.name}/reindex again)",
            code="collection_reindexing",
            param="name",
        )


def check_revision(collection: Collection, served: ModelInfo) -> None:
    check_writable(collection)
    if (collection.model, collection.model_revision) != (served.name, served.revision):
        raise ConflictError(
            f"collection {collection.name!r} holds vectors of {collection.model} revision "
            f"{collection.model_revision}, but {served.name} revision {served.revision} is served: re-index the "
            f"collection with POST /v1/collections/{collection.name}/reindex before using it",
            code="collection_needs_reindex",
            param="name",
        )
