"""Health and metrics endpoints, for FastAPI apps and for plain consumer loops."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

HealthFn = Callable[[], dict[str, object]]


def add_observability_routes(app: object, health: HealthFn) -> None:
    """Attach /healthz and /metrics to a FastAPI app."""
    from fastapi import Response

    @app.get("/healthz")  # type: ignore[attr-defined]
    def healthz() -> dict[str, object]:
        return {"status": "ok", **health()}

    # response_model=None: the annotation names a class imported in here, which FastAPI cannot
    # resolve under postponed annotations, and /openapi.json would answer 500.
    @app.get("/metrics", response_model=None)  # type: ignore[attr-defined]
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def serve_observability(host: str, port: int, health: HealthFn) -> ThreadingHTTPServer:
    """Serve /healthz and /metrics from a daemon thread for services without an HTTP API."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/healthz":
                body, ctype, code = (
                    json.dumps({"status": "ok", **health()}).encode(),
                    "application/json",
                    200,
                )
            elif self.path == "/metrics":
                body, ctype, code = generate_latest(), CONTENT_TYPE_LATEST, 200
            else:
                body, ctype, code = b'{"detail":"not found"}', "application/json", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="observability").start()
    return server
