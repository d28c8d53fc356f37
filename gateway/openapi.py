"""`python -m gateway.openapi`: write the gateway's OpenAPI document (tracked as gateway/openapi.json).

The test suite fails when the API drifts from the tracked document; regenerate it
with `make openapi` when a change to the API is intended.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gateway.app import create_app
from gateway.settings import Settings

DOCUMENT = Path(__file__).with_name("openapi.json")


def render() -> str:
    schema: dict[str, Any] = create_app(Settings()).openapi()
    return json.dumps(schema, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def main() -> int:
    DOCUMENT.write_text(render(), encoding="utf-8")
    print(f"wrote {DOCUMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
