"""Semantic search across SIGKILLs: real `python -m gateway` processes in front of the real Triton, the embedded
store on disk, and the real ingest command. A killed gateway loses no document it acknowledged, and a re-index
cut short by a kill finishes after the restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.search.ingest import ingest
from localtriton.ports import free_port
from localtriton.server import TritonProcess
from tests.helpers.checkout import ROOT
from tests.helpers.gateway_processes import GatewayProcess, Gateways
from tests.integration.gateway.test_search_ingest import write_documents
from tests.integration.gateway.test_search_reindex import FINAL, age_revision, wait_final

pytestmark = pytest.mark.slow

DOCUMENTS = 3000


def search_gateway(gateways: Gateways, triton: TritonProcess, data: Path) -> GatewayProcess:
    return gateways.create(
        "search",
        free_port(),
        {
            "TRITON_URL": triton.grpc_url,
            "SEARCH_PATH": str(data / "search"),
            "TASKS_SQLITE_PATH": str(data / "tasks.sqlite3"),
            "GATEWAY_KEYS_SQLITE_PATH": str(data / "keys.sqlite3"),
            "GATEWAY_USAGE_SQLITE_PATH": str(data / "usage.sqlite3"),
            "TASKS_LEASE_SECONDS": "1",  # a killed process's claim on its job lapses soon
            "TASKS_SCAN_INTERVAL_SECONDS": "0.2",
        },
    )


def acknowledged(progress: Path) -> set[int]:
    lines: set[int] = set()
    for line in progress.read_text().splitlines():
        start, end = (int(part) for part in line.split())
        lines.update(range(start, end))
    return lines


def run_ingest(source: Path, gateway: GatewayProcess) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gateway.search.ingest", str(source), "--collection", "bulk"]
    return subprocess.Popen(
        [*command, "--url", gateway.base_url, "--batch", "64", "--concurrency", "4"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def found_by_its_text(http: httpx.Client, gateway: GatewayProcess, number: int) -> bool:
    text = f"document number {number} about topic {number % 7}"
    body = {"query": text, "top_k": 5}
    hits = http.post(f"{gateway.base_url}/v1/collections/bulk/search", json=body).json()["data"]
    return f"d{number}" in [hit["id"] for hit in hits]


def test_a_gateway_killed_during_a_bulk_ingest_loses_no_acknowledged_document_and_the_ingest_resumes(
    triton: TritonProcess, gateways: Gateways, tmp_path: Path
) -> None:
    gateway = search_gateway(gateways, triton, tmp_path).start()
    http = httpx.Client(timeout=60)
    assert http.post(f"{gateway.base_url}/v1/collections", json={"name": "bulk"}).status_code == 201
    source = tmp_path / "docs.jsonl"
    write_documents(source, DOCUMENTS)
    progress = tmp_path / "docs.jsonl.bulk.progress"

    command = run_ingest(source, gateway)
    while not progress.is_file() or len(progress.read_text().splitlines()) < 5:
        assert command.poll() is None, command.communicate()[0].decode()
        time.sleep(0.02)
    gateway.kill()  # mid-way: batches are in flight
    gateway.start()
    before = acknowledged(progress)
    assert 0 < len(before) < DOCUMENTS, gateways.tails()
    for line in sorted(before):
        response = http.get(f"{gateway.base_url}/v1/collections/bulk/documents/d{line}")
        assert response.status_code == 200, (line, response.text, gateways.tails())
    for line in sorted(before)[:: max(1, len(before) // 20)]:
        assert found_by_its_text(http, gateway, line), line

    output = command.communicate(timeout=600)[0].decode()
    if command.returncode != 0:  # it gave up while the gateway was down: run it again, as its message says
        assert "run it again to resume" in output, output
        rerun = run_ingest(source, gateway)
        output = rerun.communicate(timeout=600)[0].decode()
        assert rerun.returncode == 0, output
    assert acknowledged(progress) == set(range(DOCUMENTS))
    again = run_ingest(source, gateway)  # resumes after the last acknowledged batch: nothing is left to send
    assert "0 documents sent to bulk" in again.communicate(timeout=120)[0].decode()

    assert http.get(f"{gateway.base_url}/v1/collections/bulk").json()["documents"] == DOCUMENTS
    for number in range(DOCUMENTS):
        response = http.get(f"{gateway.base_url}/v1/collections/bulk/documents/d{number}")
        assert response.status_code == 200 and response.json()["metadata"] == {"n": number}, number
    http.close()


async def test_a_reindex_cut_short_by_a_kill_finishes_after_the_restart(
    triton: TritonProcess, gateways: Gateways, tmp_path: Path
) -> None:
    gateway = search_gateway(gateways, triton, tmp_path).start()
    http = httpx.Client(timeout=60)
    served = http.post(f"{gateway.base_url}/v1/collections", json={"name": "bulk"}).json()
    source = tmp_path / "docs.jsonl"
    write_documents(source, DOCUMENTS)
    await ingest(source, "bulk", url=gateway.base_url, key=None, batch=64, concurrency=4, quiet=True)
    gateway.kill()
    age_revision(tmp_path / "search", "bulk")
    gateway.start()

    accepted = http.post(f"{gateway.base_url}/v1/collections/bulk/reindex")
    assert accepted.status_code == 202, accepted.text
    location = gateway.base_url + accepted.headers["location"]
    task: dict[str, Any] = accepted.json()
    # While it runs: the same task for a second call, and no search or write (the vectors are of two revisions).
    assert http.post(f"{gateway.base_url}/v1/collections/bulk/reindex").json()["id"] == task["id"]
    busy = http.post(f"{gateway.base_url}/v1/collections/bulk/search", json={"query": "document number 1"})
    assert busy.status_code == 409 and "being re-indexed" in busy.json()["error"]["message"], busy.text
    assert http.delete(f"{gateway.base_url}/v1/collections/bulk/documents/d1").status_code == 409
    assert http.get(f"{gateway.base_url}/v1/collections/bulk/documents/d1").status_code == 200
    while task["progress"]["documents"] == 0:
        assert task["status"] not in FINAL, task
        task = http.get(location).json()
        time.sleep(0.01)
    gateway.kill()
    assert task["status"] == "processing" and task["progress"]["documents"] < DOCUMENTS, task

    gateway.start()
    task = wait_final(http, gateway.base_url, accepted.headers["location"], timeout=600)
    assert (task["status"], task["progress"]) == ("completed", {"documents": DOCUMENTS, "total": DOCUMENTS}), task
    collection = http.get(f"{gateway.base_url}/v1/collections/bulk").json()
    assert (collection["model_revision"], collection["documents"]) == (served["model_revision"], DOCUMENTS)
    for number in (0, 1234, DOCUMENTS - 1):
        assert found_by_its_text(http, gateway, number), json.dumps(task)
    http.close()
