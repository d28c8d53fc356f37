"""`python -m gateway.search.ingest` against a real gateway and Triton: batches through the API, resumes after
the last acknowledged batch without sending it again, stops on a refusal naming the lines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.search.ingest import IngestError, ingest, main
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import create

pytestmark = pytest.mark.slow


def write_documents(path: Path, count: int) -> None:
    lines = [json.dumps({"id": f"d{n}", "text": f"document number {n} about topic {n % 7}", "metadata": {"n": n}})
             for n in range(count)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def test_ingest_sends_every_line_and_resumes_without_resending_acknowledged_ones(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client, tmp_path: Path
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    create(http, gateway, "bulk")
    source = tmp_path / "docs.jsonl"
    write_documents(source, 150)
    # As if an earlier run had its first 20 lines acknowledged: they are not sent again.
    (tmp_path / "docs.jsonl.bulk.progress").write_text("0 20\n")
    sent = asyncio.run(ingest(source, "bulk", url=gateway.base_url, key=None, batch=16, concurrency=3, quiet=True))
    assert sent == 130
    assert http.get(f"{gateway.base_url}/v1/collections/bulk").json()["documents"] == 130
    assert http.get(f"{gateway.base_url}/v1/collections/bulk/documents/d19").status_code == 404
    assert http.get(f"{gateway.base_url}/v1/collections/bulk/documents/d20").json()["metadata"] == {"n": 20}
    assert main([str(source), "--collection", "bulk", "--url", gateway.base_url]) == 0  # nothing left to send
    assert http.get(f"{gateway.base_url}/v1/collections/bulk").json()["documents"] == 130


async def test_ingest_stops_on_a_refused_batch_naming_its_lines(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    source = tmp_path / "docs.jsonl"
    write_documents(source, 10)
    with pytest.raises(IngestError, match="lines 1-10: 404"):
        await ingest(source, "missing", url=gateway.base_url, key=None, batch=64, concurrency=1, quiet=True)
    source.write_text('{"id": "a", "text": "fine"}\nnot json\n')
    with pytest.raises(IngestError, match=":2: not JSON"):
        await ingest(source, "missing", url=gateway.base_url, key=None, batch=64, concurrency=1, quiet=True)
