"""The testbed's link emulator (deploy/testbed/link.py) on real sockets on 127.0.0.1: delay, order
under jitter, the window cap, cut and heal, resets, config checks, the CLI and its counters.

Every client here connects from 127.0.0.1, mapped to region "eu"; every route's target is in
region "op". 127.0.0.2 is an unlisted IP: the bench's control host, never delayed nor cut."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import ValidationError

from prime_swarm.deploy.testbed.link import LinkConfig, serve, write_state

RTT = 0.2
SLACK = 0.005  # timer granularity: a delay may end this much before its nominal end


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    received: tuple[int, float, float] | None = None  # Sink: bytes, first and last at
    done = threading.Event()


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1 << 18):
            self.request.sendall(data)


class Sink(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        total, first = 0, 0.0
        while data := self.request.recv(1 << 18):
            first = first or time.monotonic()
            total += len(data)
        self.server.received = (total, first, time.monotonic())  # type: ignore[attr-defined]
        self.server.done.set()  # type: ignore[attr-defined]


@contextmanager
def target(handler: type[socketserver.BaseRequestHandler]) -> Iterator[_Server]:
    with _Server(("127.0.0.1", 0), handler) as server:
        server.done = threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield server
        server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def link_config(
    tmp_path: Path, target_port: int, rtt_ms: float = RTT * 1000, jitter_ms: float = 0, **kw: int
) -> LinkConfig:
    return LinkConfig.model_validate(
        {
            "routes": [
                {
                    "name": "op",
                    "listen_host": "127.0.0.1",
                    "listen_port": free_port(),
                    "target_host": "127.0.0.1",
                    "target_port": target_port,
                    "target_region": "op",
                }
            ],
            "regions_by_ip": {"127.0.0.1": "eu"},
            "links": [{"a": "op", "b": "eu", "rtt_ms": rtt_ms, "jitter_ms": jitter_ms}],
            "state_file": str(tmp_path / "state.json"),
            **kw,
        }
    )


@contextmanager
def forwarder(cfg: LinkConfig) -> Iterator[int]:
    """`serve` in a thread with its own event loop; yields the route's listen port."""
    loop, stop, failed = asyncio.new_event_loop(), asyncio.Event(), []

    def run() -> None:
        try:
            loop.run_until_complete(serve(cfg, stop))
        except BaseException as exc:  # reported after the thread ends
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield cfg.routes[0].listen_port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
    assert not thread.is_alive(), "serve did not stop"
    loop.close()
    assert not failed, failed


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """Retried while the forwarder is still opening its listener."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), 5, source_address=(source, 0))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def round_trip(sock: socket.socket, message: bytes) -> float:
    start = time.monotonic()
    sock.sendall(message)
    assert recv_exactly(sock, len(message)) == message
    return time.monotonic() - start


def test_a_connection_pays_the_handshake_then_one_rtt_per_request(tmp_path: Path) -> None:
    with target(Echo) as echo, forwarder(link_config(tmp_path, echo.server_address[1])) as port:
        connect(port, "127.0.0.2").close()  # the listener is up: the timing below excludes it
        start = time.monotonic()
        with connect(port) as sock:
            sock.sendall(b"hello")
            assert recv_exactly(sock, 1) == b"h"
            first = time.monotonic() - start
            assert recv_exactly(sock, 4) == b"ello"
            second = round_trip(sock, b"again")
        with connect(port, "127.0.0.2") as control:
            undelayed = round_trip(control, b"control")
    assert 2 * RTT - SLACK <= first < 2 * RTT + 0.25
    assert RTT - SLACK <= second < RTT + 0.25
    assert undelayed < 0.1


def test_jitter_never_reorders_nor_loses_bytes(tmp_path: Path) -> None:
    data = os.urandom(5_000_000)
    with target(Echo) as echo:
        cfg = link_config(tmp_path, echo.server_address[1], rtt_ms=20, jitter_ms=15)
        with forwarder(cfg) as port, connect(port) as sock:

            def send() -> None:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)  # the EOF must follow the data, both ways

            sender = threading.Thread(target=send)
            sender.start()
            got = bytearray()
            while chunk := sock.recv(1 << 18):
                got += chunk
            sender.join()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()


def test_the_window_bounds_one_connections_throughput(tmp_path: Path) -> None:
    window, size = 64 * 1024, 768 * 1024
    with target(Sink) as sink:
        cfg = link_config(tmp_path, sink.server_address[1], window_bytes=window)
        with forwarder(cfg) as port, connect(port) as sock:
            sock.sendall(os.urandom(size))
            sock.shutdown(socket.SHUT_WR)
            assert sink.done.wait(5)
    assert sink.received is not None
    total, first, last = sink.received
    assert total == size
    # At most `window` bytes are held, each for RTT/2: window / (RTT/2) bytes per second.
    assert (total - window) / (last - first) < 3 * window / (RTT / 2)


def test_a_cut_region_hangs_until_healed_then_delivers_everything(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with target(Echo) as echo, forwarder(link_config(tmp_path, echo.server_address[1])) as port:
        with connect(port) as before, connect(port, "127.0.0.2") as control:
            round_trip(before, b"ping")
            write_state(state, cut=["eu"])
            time.sleep(0.2)  # more than the forwarder's poll period
            before.sendall(b"held")
            before.settimeout(1.0)
            with pytest.raises(TimeoutError):  # a hang, not an EOF nor a reset
                before.recv(4)
            during = connect(port)
            during.sendall(b"new")
            during.settimeout(0.3)
            with pytest.raises(TimeoutError):
                during.recv(3)
            assert round_trip(control, b"control") < 0.1  # the control host is never cut
            write_state(state)
            before.settimeout(3)
            during.settimeout(3)
            assert recv_exactly(before, 4) == b"held"
            assert recv_exactly(during, 3) == b"new"
            during.close()


def test_a_reset_epoch_resets_the_open_connections_of_its_regions(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with target(Echo) as echo:
        cfg = link_config(tmp_path, echo.server_address[1], rtt_ms=20)
        with forwarder(cfg) as port, connect(port) as sock:
            round_trip(sock, b"ping")
            write_state(state, reset_epoch=1, reset_regions=["us"])  # another region's reset
            time.sleep(0.2)
            round_trip(sock, b"still")
            write_state(state, reset_epoch=2)  # every region's
            with pytest.raises(ConnectionResetError):
                sock.recv(1)
            with connect(port) as after:  # only the connections open at that moment
                round_trip(after, b"after")


def test_a_region_pair_without_a_link_is_rejected(tmp_path: Path) -> None:
    cfg = link_config(tmp_path, 9).model_dump(mode="json")
    cfg["links"] = [{"a": "eu", "b": "eu", "rtt_ms": 1, "jitter_ms": 0}]
    with pytest.raises(ValidationError, match="no link for region pair.*eu-op"):
        LinkConfig.model_validate(cfg)


def run_cli(config: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "prime_swarm.deploy.testbed.link", str(config)]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)


def test_the_cli_rejects_a_bad_config_in_one_line(tmp_path: Path) -> None:
    cfg = link_config(tmp_path, 9).model_dump(mode="json")
    cfg["links"] = []
    path = tmp_path / "links.json"
    path.write_text(json.dumps(cfg))
    proc = run_cli(path)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1 and "eu-op" in err, err


def test_the_cli_forwards_until_sigterm_and_leaves_its_counters(tmp_path: Path) -> None:
    with target(Echo) as echo:
        cfg = link_config(tmp_path, echo.server_address[1], rtt_ms=0)
        path = tmp_path / "links.json"
        path.write_text(cfg.model_dump_json())
        proc = run_cli(path)
        try:
            with connect(cfg.routes[0].listen_port) as sock:
                round_trip(sock, b"through the cli")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    stats = json.loads(Path(f"{cfg.state_file}.stats.{proc.pid}.json").read_text())
    assert stats["bytes"] == 2 * len(b"through the cli") and stats["connections"] == 1


def test_the_counters_are_written_every_second(tmp_path: Path) -> None:
    stats = tmp_path / f"state.json.stats.{os.getpid()}.json"
    with target(Echo) as echo:
        cfg = link_config(tmp_path, echo.server_address[1], rtt_ms=0)
        with forwarder(cfg) as port, connect(port) as sock:
            round_trip(sock, b"x" * 1000)
            deadline = time.monotonic() + 2.5
            while not stats.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            counters = json.loads(stats.read_text())
    assert counters["bytes"] == 2000 and counters["connections"] == 1
    assert counters["cpu_s"] > 0
