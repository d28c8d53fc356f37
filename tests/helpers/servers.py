"""An ASGI app behind a real uvicorn on 127.0.0.1 and a free port, in a daemon thread.

The simulators, the webhook receiver and the in-process gateway of the tests all run this way.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from localtriton.ports import free_port


class ThreadedServer:
    def __init__(self, app: Any, name: str, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, access_log=False, timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.name = name
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)

    def start_server(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        if self.thread.is_alive():  # its background work (task scans, feeds) would go on into later tests
            raise RuntimeError(f"{self.name} still running 30 s after stop")
