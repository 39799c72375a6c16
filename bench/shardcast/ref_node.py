"""Run one node of the reference, PyPI shardcast 0.3.2, for the benchmark.

Runs under the reference's own venv (bench/.venv-shardcast-ref), never the project's. It works
around the quirks listed in REFERENCES.md: servers bind 0.0.0.0 (patched here to --host), every
server folder needs a `data1.bin` probe file, and the client command exits at once while the
version is not listed, so `client` re-runs `shardcast-client` from its own working directory
until it succeeds.

    ref_node.py origin --host H --port P --data-dir D --file F --go GOFILE
    ref_node.py middle --host H --port P --data-dir D --upstream URL[,URL] --check-interval 1
    ref_node.py client --servers URL,URL --version v1 --workdir W --out FILE --deadline S
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

PROBE = b"\0" * 1024


def _bind_to(host: str) -> None:
    import shardcast.server as server

    original = server.ShardcastServer.__init__

    def init(self, server_address, directory, shutdown_event=None):  # type: ignore[no-untyped-def]
        original(self, (host, server_address[1]), directory, shutdown_event)

    server.ShardcastServer.__init__ = init  # type: ignore[method-assign]


def origin(args: argparse.Namespace) -> int:
    _bind_to(args.host)
    import shardcast

    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.data_dir) / "data1.bin").write_bytes(PROBE)
    shardcast.initialize(args.data_dir, port=args.port)
    print("ready", flush=True)
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.01)
    version = shardcast.broadcast(args.file)
    print(f"broadcast {version} at {time.time():.3f}", flush=True)
    while True:
        time.sleep(3600)


def middle(args: argparse.Namespace) -> int:
    _bind_to(args.host)
    from shardcast.middle_node import main

    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.data_dir) / "data1.bin").write_bytes(PROBE)
    sys.argv = [
        "shardcast-middle",
        "--upstream",
        args.upstream,
        "--data-dir",
        args.data_dir,
        "--port",
        str(args.port),
        "--check-interval",
        str(args.check_interval),
        "--log-level",
        "WARNING",
    ]
    return main() or 0


def client(args: argparse.Namespace) -> int:
    command = str(Path(sys.executable).parent / "shardcast-client")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline
    tries = 0
    print(f"waiting for version {args.version}", flush=True)
    while time.monotonic() < deadline:
        tries += 1
        rc = subprocess.call(
            [
                command,
                "--servers",
                args.servers,
                "--version",
                args.version,
                "--output-dir",
                str(work / "downloads"),
                "--output-file",
                args.out,
                "--log-level",
                "ERROR",
            ],
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if rc == 0 and os.path.exists(args.out):
            print(f"done after {tries} runs of shardcast-client", flush=True)
            return 0
        time.sleep(args.poll)
    print(f"gave up after {tries} runs", flush=True)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    o = modes.add_parser("origin")
    o.add_argument("--host", required=True)
    o.add_argument("--port", type=int, required=True)
    o.add_argument("--data-dir", required=True)
    o.add_argument("--file", required=True)
    o.add_argument("--go", required=True)
    m = modes.add_parser("middle")
    m.add_argument("--host", required=True)
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--data-dir", required=True)
    m.add_argument("--upstream", required=True)
    m.add_argument("--check-interval", type=int, default=1)
    c = modes.add_parser("client")
    c.add_argument("--servers", required=True)
    c.add_argument("--version", default="v1")
    c.add_argument("--workdir", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--deadline", type=float, default=900.0)
    c.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()
    return {"origin": origin, "middle": middle, "client": client}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
