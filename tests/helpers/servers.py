"""An ASGI app behind a real uvicorn on 127.0.0.1 and a free port, in a daemon thread.

The simulators, the webhook receiver and the in-process gateway of the tests all run this way.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import time
import traceback
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
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name=name, daemon=True)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve()

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
            raise RuntimeError(f"{self.name} still running 30 s after stop; where it waits:\n{self._where()}")

    def _where(self) -> str:
        """The server thread's stack and every task its loop still runs: what a stop that hangs waits on."""
        frame = sys._current_frames().get(self.thread.ident or 0)
        parts = ["thread:\n" + "".join(traceback.format_stack(frame)) if frame else "thread: gone"]
        try:
            tasks = list(asyncio.all_tasks(self.loop)) if self.loop is not None else []
        except RuntimeError:  # the loop changed its task set while it was read: read once more
            tasks = list(asyncio.all_tasks(self.loop)) if self.loop is not None else []
        for task in tasks:
            stack = io.StringIO()
            task.print_stack(file=stack)
            parts.append(stack.getvalue())
        return "\n".join(parts)
