"""The shard transport: one set of framing checks, a keep-alive pool that replaces connections
a relay closed while they idled, and every malformed answer a `ShardcastError`."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from scripted_relay import Reply, ScriptedRelay

from prime_swarm.libs.shardcast.errors import ShardHashError
from prime_swarm.libs.shardcast.transport import (
    MissingShard,
    RelayRefused,
    ShardTransport,
    TransportError,
    check_framing,
)


def headers(**values: str) -> http.client.HTTPMessage:
    msg = http.client.HTTPMessage()
    for k, v in values.items():
        msg[k.replace("_", "-")] = v
    return msg


def test_framing_accepts_a_whole_shard_and_a_continued_one() -> None:
    assert check_framing(200, headers(content_length="10"), 10, 0, False).length == 10
    # A relay that ignores the Range sends the whole shard: the caller starts over.
    whole = check_framing(200, headers(content_length="10"), 10, 4, True)
    assert (whole.start, whole.length) == (0, 10)
    tail = check_framing(
        206, headers(content_length="6", content_range="bytes 4-9/10"), 10, 4, True
    )
    assert (tail.start, tail.length) == (4, 6)


@pytest.mark.parametrize(
    ("status", "hdrs", "ranged", "error", "match"),
    [
        (404, {}, False, MissingShard, "HTTP 404"),
        (410, {}, False, MissingShard, "HTTP 410"),
        (500, {"content_length": "10"}, False, RelayRefused, "HTTP 500"),
        (206, {"content_length": "10"}, False, RelayRefused, "HTTP 206"),  # unasked-for
        (206, {"content_length": "6", "content_range": "bytes 3-9/10"}, True, ShardHashError,
         "does not continue at byte 4"),
        (206, {"content_length": "6", "content_range": "bytes 4-9/99"}, True, ShardHashError,
         "10-byte shard"),
        (200, {}, False, RelayRefused, "without Content-Length"),
        (200, {"content_length": "11"}, False, ShardHashError, "Content-Length 11 but 10"),
        (200, {"content_length": "10", "transfer_encoding": "chunked"}, False, RelayRefused,
         "encoding"),
        (200, {"content_length": "10", "content_encoding": "gzip"}, False, RelayRefused,
         "encoding"),
    ],
)  # fmt: skip
def test_framing_refusals(
    status: int, hdrs: dict[str, str], ranged: bool, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        check_framing(status, headers(**hdrs), 10, 4 if ranged else 0, ranged)


def _get(transport: ShardTransport, url: str) -> bytes:
    body = bytearray()
    transport.get(
        url, {}, lambda status, h: int(h["content-length"]), lambda c: body.extend(c), 5.0
    )
    return bytes(body)


def test_keep_alive_connections_are_reused() -> None:
    relay = ScriptedRelay(lambda path, h: Reply(body=b"x" * 3_000_000))
    transport = ShardTransport(timeout_s=5)
    try:
        for _ in range(3):
            assert _get(transport, relay.url + "/s") == b"x" * 3_000_000
        assert sum(len(v) for v in transport._idle.values()) == 1  # one connection did it all
    finally:
        transport.close()
        relay.close()


def test_a_cut_body_and_a_garbage_answer_are_transport_errors() -> None:
    cut = ScriptedRelay(lambda path, h: Reply(body=b"y" * 100, cut_after=40))
    transport = ShardTransport(timeout_s=5)
    got = bytearray()
    try:
        with pytest.raises(TransportError):
            transport.get(cut.url + "/s", {}, lambda s, h: 100, got.extend, 5.0)
        assert bytes(got) == b"y" * 40  # what arrived was handed over: a resume keeps it
    finally:
        cut.close()

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def garbage() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")

    threading.Thread(target=garbage, daemon=True).start()
    try:
        with pytest.raises(TransportError, match="LineTooLong|line"):
            _get(transport, f"http://127.0.0.1:{srv.getsockname()[1]}/s")
    finally:
        srv.close()
        transport.close()


def test_unsupported_urls_are_refused() -> None:
    with pytest.raises(TransportError, match="unsupported URL"):
        _get(ShardTransport(timeout_s=1), "ftp://127.0.0.1/x")


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
            except OSError:
                return  # closed at teardown
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/x"
    stop.set()
    srv.close()


def test_stale_idle_connections_are_replaced(closing_server: str) -> None:
    transport = ShardTransport(timeout_s=5)
    try:
        threads = [
            threading.Thread(target=_get, args=(transport, closing_server)) for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(transport._idle[next(iter(transport._idle))]) == 3  # pooled, closed by now
        time.sleep(0.3)
        assert _get(transport, closing_server) == b"ok"
    finally:
        transport.close()


def test_a_paced_large_body_then_a_small_one_on_the_same_connection() -> None:
    """A large body is read with a receive low-water mark (fewer wake-ups on a shaped link); its
    tail, and the next response on the kept-alive connection, read without it: neither waits
    for bytes that never come (either would end in a read timeout)."""
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            for body in (big, b"small"):
                conn.recv(65536)  # the request
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
                for at in range(0, len(body), 16384):  # a shaped link: small pieces
                    conn.sendall(body[at : at + 16384])
                    time.sleep(0.0005)
            conn.recv(1)  # held open until the client is done

    threading.Thread(target=serve, daemon=True).start()
    transport = ShardTransport(timeout_s=2)
    try:
        assert _get(transport, f"http://127.0.0.1:{port}/big") == big
        (conn,) = next(iter(transport._idle.values()))
        assert conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        started = time.monotonic()
        assert _get(transport, f"http://127.0.0.1:{port}/small") == b"small"
        assert time.monotonic() - started < 1.0
    finally:
        transport.close()
        server.close()
