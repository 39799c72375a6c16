"""Run one node of the reference, PyPI shardcast 0.3.2, for the benchmark.

Runs under the reference's own venv (bench/.venv-shardcast-ref), never the project's. It works
around the quirks listed in REFERENCES.md: servers bind 0.0.0.0 (patched here to --host), every
server folder needs a `data1.bin` probe file, and the client command exits at once while the
version is not listed, so `client` polls the version list (ClientNode, what `shardcast-client`
wraps) until the version is there and downloads it. Every downloader writes two scratch files
at fixed paths (`/tmp/dummy.bin`, `temp_distribution.txt` beside the package) that all nodes on
one machine share: on separate machines they would not collide, here one node's clean-up broke
another's start (the wide-area bench's middles died at start-up on it), so each node gets them
in a folder of its own.

    ref_node.py origin --host H --port P --data-dir D --file F --go GOFILE
    ref_node.py middle --host H --port P --data-dir D --upstream URL[,URL] --check-interval 1
    ref_node.py client --servers URL,URL --version v1 --workdir W --out FILE --deadline S
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

PROBE = b"\0" * 1024


def _private_scratch(folder: Path) -> None:
    """The downloader's fixed scratch paths moved into `folder` (see the module notes)."""
    import shardcast.client as downloader

    folder.mkdir(parents=True, exist_ok=True)
    real_path = downloader.Path
    downloader.Path = lambda *a: folder / "dummy.bin" if a == ("/tmp/dummy.bin",) else real_path(*a)
    # temp_distribution.txt goes beside the package: dirname(dirname(__file__)).
    downloader.__file__ = str(folder / "pkg" / "client.py")


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
    _private_scratch(Path(args.data_dir).parent / f"{Path(args.data_dir).name}-scratch")
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
    work = Path(args.workdir)
    _private_scratch(work / "scratch")
    os.chdir(work)
    from shardcast.client_node import ClientNode

    deadline = time.monotonic() + args.deadline
    node, tries = None, 0
    print(f"waiting for version {args.version}", flush=True)
    while time.monotonic() < deadline:
        tries += 1
        try:
            # Its constructor probes every server and raises while one is not up yet.
            node = node or ClientNode(args.servers.split(","), str(work / "downloads"))
            if args.version in node.list_available_versions() and node.download_version(
                args.version, args.out
            ):
                print(f"done after {tries} polls", flush=True)
                return 0
        except Exception as exc:  # the reference raises bare Exceptions
            print(f"poll {tries}: {exc}", flush=True)
        time.sleep(args.poll)
    print(f"gave up after {tries} polls", flush=True)
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
