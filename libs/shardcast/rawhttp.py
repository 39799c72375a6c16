"""A minimal HTTP/1.1 GET for shard bodies, straight from the socket into a sink.

Shards are most of the bytes a worker or relay receives, and on small machines the generic client
(httpx over h11, 64 KiB reads, several copies per chunk) costs more CPU than hashing them. This
path reads up to 1 MiB per `recv_into` into one reused buffer and hands memoryviews to the sink,
with keep-alive connections per relay. It only speaks plain `http://` with a Content-Length body;
anything else (TLS, chunked bodies) is left to httpx by the caller.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

RECV_BUFFER = 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024


class RawHttpError(OSError):
    """Transport-level failure or a response this minimal client cannot parse."""


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]


class _Conn:
    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = b""  # bytes read past the previous response's headers

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class RawHttp:
    """Thread-safe pool of keep-alive connections; one request at a time per connection."""

    def __init__(self, timeout_s: float, max_idle_per_host: int = 16) -> None:
        self.timeout_s = timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    @staticmethod
    def supports(url: str) -> bool:
        return urlsplit(url).scheme == "http"

    def close(self) -> None:
        with self._lock:
            conns = [c for cs in self._idle.values() for c in cs]
            self._idle.clear()
        for c in conns:
            c.close()

    def _buffer(self) -> bytearray:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(RECV_BUFFER)
        return buf

    def _checkout(self, key: tuple[str, int], fresh: bool = False) -> tuple[_Conn, bool]:
        with self._lock:
            idle = self._idle.get(key)
            if idle and not fresh:
                return idle.pop(), True
        return _Conn(key[0], key[1], self.timeout_s), False

    def _drop_idle(self, key: tuple[str, int]) -> None:
        with self._lock:
            stale = self._idle.pop(key, [])
        for c in stale:
            c.close()

    def _checkin(self, key: tuple[str, int], conn: _Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle_per_host:
                idle.append(conn)
                return
        conn.close()

    def get(
        self,
        url: str,
        headers: dict[str, str],
        on_response: Callable[[RawResponse], int | None],
        on_chunk: Callable[[memoryview], None],
        read_timeout_s: float | None = None,
    ) -> RawResponse:
        """GET `url`. `on_response` sees the status and headers and returns how many body bytes
        to stream to `on_chunk` (None: skip the body and drop the connection)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise RawHttpError(f"unsupported URL {url!r}")
        key = (parts.hostname, parts.port or 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        head = f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        for attempt in (0, 1):
            conn, reused = self._checkout(key, fresh=attempt > 0)
            try:
                conn.sock.settimeout(read_timeout_s or self.timeout_s)
                conn.sock.sendall(head.encode("latin-1"))
                resp, rest = _read_head(conn)
            except (OSError, RawHttpError):
                conn.close()
                if reused and attempt == 0:
                    # A keep-alive connection the server had closed (idle past its keep-alive
                    # timeout, as between two policy versions): its siblings idled as long, so
                    # they go too, and the retry opens a fresh one. Retrying on another idle
                    # one failed the same way and cost a backoff per shard.
                    self._drop_idle(key)
                    continue
                raise
            break
        ok = False
        try:
            length = on_response(resp)
            if length is not None:
                _read_body(conn, rest, length, self._buffer(), on_chunk)
                ok = resp.headers.get("connection", "").lower() != "close"
        finally:
            if ok:
                self._checkin(key, conn)
            else:
                conn.close()
        return resp


def _read_head(conn: _Conn) -> tuple[RawResponse, bytes]:
    data = conn.pending
    conn.pending = b""
    deadline = time.monotonic() + (conn.sock.gettimeout() or 30.0)
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEADER_BYTES:
            raise RawHttpError("response headers too large")
        if time.monotonic() > deadline:
            raise RawHttpError("timed out reading response headers")
        chunk = conn.sock.recv(65536)
        if not chunk:
            raise RawHttpError("connection closed before the response headers")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
        raise RawHttpError(f"bad status line {lines[0][:80]!r}")
    try:
        status = int(status_line[1])
    except ValueError:
        raise RawHttpError(f"bad status line {lines[0][:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers), rest


def _read_body(
    conn: _Conn, rest: bytes, length: int, buf: bytearray, on_chunk: Callable[[memoryview], None]
) -> None:
    if rest:
        take = rest[:length]
        if take:
            on_chunk(memoryview(take))
        conn.pending = rest[length:]
        length -= len(take)
    view = memoryview(buf)
    while length > 0:
        n = conn.sock.recv_into(view, min(length, len(buf)))
        if n == 0:
            raise RawHttpError(f"connection closed with {length} body bytes outstanding")
        on_chunk(view[:n])
        length -= n
