from __future__ import annotations

from gateway.openapi import DOCUMENT, render


def test_openapi_document_matches_the_tracked_snapshot() -> None:
    assert DOCUMENT.read_text(encoding="utf-8") == render(), "the API changed: run `make openapi` if intended"
