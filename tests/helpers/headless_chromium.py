"""A real browser for the tests: headless Chromium (Debian package `chromium`), driven over the DevTools protocol.

`--dump-dom` with a virtual time budget would be simpler, but virtual time does not wait for a WebSocket: the page
is dumped before its messages arrive. So the test opens the page and reads its DOM through DevTools (with the
`websockets` client the gateway's own tests use) until a condition holds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from websockets.sync.client import ClientConnection, connect

EXECUTABLE = "chromium"
LISTENING = re.compile(r"DevTools listening on ws://[^:]+:(\d+)/")


class Page:
    """One browser tab."""

    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection
        self._calls = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command's result (its events are skipped)."""
        self._calls += 1
        self._connection.send(json.dumps({"id": self._calls, "method": method, "params": params}))
        while True:
            reply = json.loads(self._connection.recv(timeout=30))
            if reply.get("id") == self._calls:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, done: Callable[[Any], bool], timeout: float, what: str) -> Any:
        """`expression`'s value once `done(value)`; raises with the last value after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if done(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s; last value {value!r}")
            time.sleep(0.05)


@contextmanager
def chromium_page(url: str) -> Iterator[Page]:
    """A headless Chromium (its own profile, removed after) with one tab that has loaded `url`."""
    profile = tempfile.mkdtemp(prefix="chromium-")
    command = [
        EXECUTABLE,
        "--headless=new",
        "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--no-first-run",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    drain = threading.Thread(target=lambda: None)
    try:
        port, drain = _devtools_port(process)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            tab = next(target for target in json.load(answer) if target["type"] == "page")
        with connect(tab["webSocketDebuggerUrl"], max_size=None, proxy=None) as connection:
            page = Page(connection)
            page.call("Page.navigate", url=url)
            yield page
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if drain.ident is not None:
            drain.join(timeout=10)  # the pipe's end came with the process's
        assert process.stderr is not None
        process.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(process: subprocess.Popen[str]) -> tuple[int, threading.Thread]:
    """The port Chromium prints on stderr once DevTools listens; the rest of its stderr is read (and dropped) in a
    thread, so that a full pipe never stalls the browser."""
    assert process.stderr is not None
    stderr = process.stderr
    seen: list[str] = []
    for line in stderr:
        seen.append(line)
        if match := LISTENING.search(line):
            drain = threading.Thread(target=stderr.read, name="chromium-stderr", daemon=True)
            drain.start()
            return int(match.group(1)), drain
    raise RuntimeError("chromium did not start its DevTools server:\n" + "".join(seen[-20:]))
