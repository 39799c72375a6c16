"""A relay that says what a test scripts, over real HTTP on 127.0.0.1: the shard transport
under test is the production one, so its framing checks and keep-alive handling are exercised
by every lying relay."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PACE_CHUNK = 4096


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Send only this many body bytes, then drop the connection (a relay that dies mid-shard).
    cut_after: int | None = None
    # Content-Length to announce; None: the body's length. -1: none at all.
    content_length: int | None = None
    # Send the body at this many bytes a second (a relay behind a starved connection).
    pace_bps: float | None = None


Script = Callable[[str, Message], Reply]


class ScriptedRelay:
    """Serves `script(path_with_query, request_headers)` until closed; `requests` lists paths."""

    def __init__(self, script: Script) -> None:
        self.requests: list[str] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real relays

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                relay.requests.append(self.path)
                reply = script(self.path, self.headers)
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                length = len(reply.body) if reply.content_length is None else reply.content_length
                if length >= 0:
                    self.send_header("Content-Length", str(length))
                if reply.cut_after is not None or length < 0:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                body = reply.body[: reply.cut_after]
                step = len(body) if reply.pace_bps is None else PACE_CHUNK
                try:
                    for i in range(0, len(body), max(1, step)):
                        self.wfile.write(body[i : i + step])
                        self.wfile.flush()
                        if reply.pace_bps is not None:
                            time.sleep(step / reply.pace_bps)
                except OSError:  # the client cut the transfer off
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """A URL nobody listens on: a relay that is down."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
