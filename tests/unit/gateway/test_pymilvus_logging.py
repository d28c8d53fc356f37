"""pymilvus writes its own plain-text lines, with a traceback for every failed reconnect, while Milvus is down;
the gateway's log is JSON and states a Milvus failure once per failed request."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.checkout import ROOT


def test_a_milvus_outage_writes_no_pymilvus_lines_to_the_gateway_log() -> None:
    """In a fresh interpreter (pymilvus configures its loggers at import): the gateway's logging, then the Milvus
    store's import, then the record pymilvus writes when a reconnect fails."""
    program = """
import logging
from gateway.observability import configure_logging
configure_logging("INFO")
import gateway.search.milvus
try:
    raise ConnectionError("refused")
except ConnectionError:
    logging.getLogger("pymilvus.client.connection_manager").warning("Connection recovery failed", exc_info=True)
logging.getLogger("pymilvus").critical("the client cannot go on")
logging.getLogger("gateway.errors").warning("the search store (milvus) failed")
"""
    run = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in lines]  # every line the gateway's JSON: no plain-text traceback
    assert [(r["logger"], r["message"]) for r in records] == [
        ("pymilvus", "the client cannot go on"),
        ("gateway.errors", "the search store (milvus) failed"),
    ]
