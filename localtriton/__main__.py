"""`python -m localtriton serve|start|stop`: the local Triton for `make triton`, `make up`, `make down`.

serve  runs in the foreground until Ctrl-C / SIGTERM;
start  runs it in the background (pid and log under --state-dir) and returns once it is ready;
stop   stops the background server;
wait   waits until --url answers 200 (used by `make up` for the gateway).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from localtriton.server import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    TritonProcess,
    TritonStartError,
    terminate,
    wait_for_http_ok,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m localtriton", description=__doc__)
    parser.add_argument("action", choices=["serve", "start", "stop", "wait"])
    parser.add_argument("--url", help="for wait: the URL that must answer 200")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--host", default=os.environ.get("TRITON_HOST", "127.0.0.1"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("TRITON_HTTP_PORT", DEFAULT_HTTP_PORT)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("TRITON_GRPC_PORT", DEFAULT_GRPC_PORT)))
    parser.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("TRITON_METRICS_PORT", DEFAULT_METRICS_PORT))
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".run"), help="pid file, log, server copy")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for readiness")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    pid_file = args.state_dir / "triton.pid"
    if args.action == "stop":
        return stop(pid_file)
    if args.action == "wait":
        try:
            wait_for_http_ok(args.url, args.timeout)
        except TritonStartError as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    server = TritonProcess(
        repository=args.repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        dist_dir=args.state_dir / "tritonserver",
        log_path=args.state_dir / "triton.log",
    )
    if args.action == "start" and _running(pid_file):
        print(f"triton already running (pid {pid_file.read_text().strip()})")
        return 0
    server.start(detach=args.action == "start")
    try:
        server.wait_ready(args.timeout)
    except TritonStartError as exc:
        server.stop()
        print(f"triton failed to start: {exc}", file=sys.stderr)
        return 1
    print(
        f"triton ready: http://{server.http_url} grpc://{server.grpc_url} "
        f"metrics http://{server.host}:{server.metrics_port}/metrics (log {server.log_path})"
    )
    if args.action == "start":
        pid_file.write_text(str(server.pid))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.stop()
        return 0


def _running(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False
    return True


def stop(pid_file: Path) -> int:
    if not _running(pid_file):
        print("triton is not running")
        pid_file.unlink(missing_ok=True)
        return 0
    terminate(int(pid_file.read_text()))
    pid_file.unlink(missing_ok=True)
    print("triton stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
