"""The shard transport's keep-alive pool: connections a server closed while they idled are
replaced, not retried one stale sibling after another."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from prime_swarm.libs.shardcast.rawhttp import RawHttp


@pytest.fixture
def closing_server() -> Iterator[str]:
    """Answers one request per connection, then closes it (as a server whose keep-alive
    timeout has passed would, from the client's point of view)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            time.sleep(0.2)  # concurrent requests overlap, so each gets its own connection
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            time.sleep(0.1)

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/x"
    stop.set()
    srv.close()


def _get(http: RawHttp, url: str) -> bytes:
    body = bytearray()
    http.get(url, {}, lambda r: int(r.headers["content-length"]), lambda c: body.extend(c))
    return bytes(body)


def test_stale_idle_connections_are_replaced(closing_server: str) -> None:
    http = RawHttp(timeout_s=5)
    try:
        threads = [threading.Thread(target=_get, args=(http, closing_server)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(http._idle[next(iter(http._idle))]) == 3  # three pooled, all closed by now
        time.sleep(0.3)
        assert _get(http, closing_server) == b"ok"
    finally:
        http.close()
