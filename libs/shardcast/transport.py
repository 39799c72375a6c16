"""The one way shard bodies travel: HTTP/1.1 GETs on the standard library's `http.client`, with
keep-alive connections per relay and one set of framing checks.

Shards are most of the bytes a worker or relay receives, and on small machines a generic async
client (httpx over h11: 64 KiB reads, several copies per chunk) costs more CPU than hashing them.
`http.client` parses the status line and headers (line and count limits included), frames the
body by Content-Length, and its `readinto` reads a large request straight from the socket into
the caller's buffer: as cheap as a hand-written socket loop (0.11 s of CPU per 128 MiB measured
for both), without owning an HTTP parser. Manifests, listings and uploads are small and stay on
httpx.
"""

from __future__ import annotations

import http.client
import mmap
import re
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from urllib.parse import urlsplit

import certifi

from .errors import ShardcastError, ShardHashError

RECV_BUFFER = 1024 * 1024
# Bytes the kernel gathers before it wakes a body read (SO_RCVLOWAT). A shaped link delivers a
# packet or two per wake-up, and each wake-up costs a poll, a recv and the GIL: 64 followers
# on 25 Mbit/s links spent about a core on wake-ups alone (bench/wan, N = 64). With the mark,
# a 25 Mbit/s transfer wakes ~12 times a second instead of ~2,000. Kept below the bytes still
# due (the tail of a body reads with the default), so a read never waits for bytes that will
# not come; a relay must now deliver this much within a read timeout, not a single byte.
RECV_LOWAT = 256 * 1024
# Body bytes http.client may already hold in its reader's buffer (8 KiB in 3.11), with margin.
_BUFFERED_SLACK = 64 * 1024
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


@dataclass(frozen=True)
class FetchOptions:
    """How a download treats its relays: built once by the caller, read by every transfer."""

    timeout_s: float = 10.0
    """Connect and read timeout of each request (a read waits up to this plus `wait_s`)."""
    wait_s: float = 0.0
    """Ask a relay to hold a request this long for a shard it is still receiving (cut-through)."""
    attempts_per_shard: int | None = None
    """Tries per shard over all relays; None: twice the relays, at least 3."""
    deadline: float | None = None
    """Monotonic time by which the whole download must be done; None: no bound."""
    max_workers: int = 8
    """Shards in flight at once."""


class TransportError(ShardcastError):
    """The relay's answer could not be used (a socket error, a timeout, bad HTTP)."""


class MissingShard(ShardcastError):
    """The relay does not hold this shard (yet): try elsewhere, no blame."""


class RelayRefused(ShardcastError):
    """The relay answered with an error status or an unusable response."""


@dataclass(frozen=True)
class Body:
    """A shard response that passed the framing checks: `length` bytes are due, starting at
    byte `start` of the shard (0 when the relay sent the whole shard)."""

    start: int
    length: int


def check_framing(
    status: int, headers: http.client.HTTPMessage, size: int, start: int, ranged: bool
) -> Body:
    """The framing rules of a shard response, in one place.

    404/410: missing. 200: the whole shard; 206 (only to a Range request): the tail from
    `start`, with a Content-Range that says so. The body must be plain (no transfer or content
    encoding) and its Content-Length exactly what is due: a relay announcing more or less is
    lying about the shard (an integrity failure, not a transport one).
    """
    if status in (404, 410):
        raise MissingShard(f"HTTP {status}")
    if status == 206 and ranged:
        cr = headers.get("content-range", "")
        m = _CONTENT_RANGE.match(cr)
        if not m or int(m.group(1)) != start or m.group(3) not in (str(size), "*"):
            raise ShardHashError(
                f"Content-Range {cr!r} does not continue at byte {start} of a {size}-byte shard"
            )
        body = Body(start, size - start)
    elif status == 200:
        body = Body(0, size)
    else:
        raise RelayRefused(f"HTTP {status}")
    if headers.get("transfer-encoding") or headers.get("content-encoding", "identity") not in (
        "identity",
        "",
    ):
        raise RelayRefused("shard response with a transfer or content encoding")
    declared = headers.get("content-length")
    if declared is None:
        raise RelayRefused("shard response without Content-Length")
    if declared.strip() != str(body.length):
        raise ShardHashError(f"Content-Length {declared} but {body.length} bytes are due")
    return body


class ShardTransport:
    """Thread-safe pool of keep-alive connections, one request at a time per connection."""

    def __init__(self, timeout_s: float, max_idle_per_host: int = 16) -> None:
        self.timeout_s = timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def close(self) -> None:
        with self._lock:
            conns = [c for cs in self._idle.values() for c in cs]
            self._idle.clear()
        for c in conns:
            c.close()

    def get(
        self,
        url: str,
        headers: dict[str, str],
        on_response: Callable[[int, http.client.HTTPMessage], int],
        on_chunk: Callable[[memoryview], None],
        read_timeout_s: float,
    ) -> None:
        """GET `url`; `on_response` checks the status and headers and returns how many body
        bytes to read into `on_chunk` (a view of a reused buffer, valid during the call)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"unsupported URL {url!r}")
        key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in (0, 1):
            conn, reused = self._checkout(key, fresh=attempt > 0)
            try:
                conn.timeout = read_timeout_s
                if conn.sock is not None:
                    conn.sock.settimeout(read_timeout_s)
                conn.request("GET", target, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and attempt == 0:
                    # A keep-alive connection the relay had closed (idle past its keep-alive
                    # timeout, as between two policy versions): its siblings idled as long, so
                    # they go too, and the retry opens a fresh one.
                    self._drop_idle(key)
                    continue
                raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            break
        ok = False
        try:
            length = on_response(resp.status, resp.headers)
            self._read_body(conn.sock, resp, length, on_chunk)
            ok = not resp.will_close and resp.isclosed()
        except (OSError, http.client.HTTPException) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if ok:
                self._checkin(key, conn)
            else:
                conn.close()

    def _read_body(
        self,
        sock: socket.socket | None,
        resp: http.client.HTTPResponse,
        length: int,
        on_chunk: Callable[[memoryview], None],
    ) -> None:
        view = memoryview(self._buffer())
        # Plain TCP only: under TLS the kernel counts encrypted records, not what a read wants.
        lowat = sock if type(sock) is socket.socket else None
        marked = False  # the tail unmarks it: the connection goes back to the pool as it came
        while length > 0:
            want = min(length, len(view))
            if lowat is not None:
                # Each read must leave at least the mark still to arrive: whatever it polls
                # for then comes (bytes beyond the body never do, on a kept-alive connection).
                room = length - RECV_LOWAT - _BUFFERED_SLACK
                if room >= RECV_LOWAT and not marked:
                    lowat.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RECV_LOWAT)
                    marked = True
                elif room < RECV_LOWAT and marked:
                    lowat.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
                    marked = False
                if marked:
                    want = min(want, room)
            n = resp.readinto(view[:want])
            if not n:
                raise TransportError(f"connection closed with {length} body bytes outstanding")
            on_chunk(view[:n])
            length -= n

    def _buffer(self) -> mmap.mmap:
        # Page-aligned (a bytearray is not), so a chunk can be written with O_DIRECT as is.
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = mmap.mmap(-1, RECV_BUFFER)
        return buf

    def _checkout(
        self, key: tuple[str, str, int], fresh: bool
    ) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            idle = self._idle.get(key)
            if idle and not fresh:
                return idle.pop(), True
        scheme, host, port = key
        if scheme == "https":
            return http.client.HTTPSConnection(
                host, port, timeout=self.timeout_s, context=tls_context()
            ), False
        return http.client.HTTPConnection(host, port, timeout=self.timeout_s), False

    def _drop_idle(self, key: tuple[str, str, int]) -> None:
        with self._lock:
            stale = self._idle.pop(key, [])
        for c in stale:
            c.close()

    def _checkin(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle_per_host:
                idle.append(conn)
                return
        conn.close()


@cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process. httpx builds a new one (loading the CA bundle)
    for every client, which profiled at 65% of a worker's policy fetch: shared, it costs once."""
    return ssl.create_default_context(cafile=certifi.where())
