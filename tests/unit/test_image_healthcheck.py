"""The image's own HEALTHCHECK (`prime-healthcheck` with no argument) asks the image's service
on the port its settings read, against a real HTTP server here."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from script_files import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "deploy/docker/healthcheck.py"


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    return load_script(SCRIPT)


@pytest.fixture
def healthz() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.parametrize(
    ("extra", "variable"),
    [("relay", "PRIME_RELAY_PORT"), ("orchestrator", "PRIME_ORCH_PORT"),
     ("worker", "PRIME_WORKER_METRICS_PORT")],
)  # fmt: skip
def test_the_image_checks_its_own_service(
    healthcheck: ModuleType,
    healthz: int,
    extra: str,
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWARM_EXTRA", extra)
    monkeypatch.setenv(variable, str(healthz))
    assert healthcheck.own_service() == [f"http://127.0.0.1:{healthz}/healthz"]
    assert healthcheck.main([]) == 0
    with socket.socket() as s:  # a port nothing listens on: unhealthy
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv(variable, str(s.getsockname()[1]))
    assert healthcheck.main([]) == 1


def test_a_service_with_nothing_to_ask_is_healthy_while_it_runs(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARM_EXTRA", "trainer")
    monkeypatch.delenv("PRIME_TRAINER_METRICS_PORT", raising=False)
    assert healthcheck.own_service() == [] and healthcheck.main([]) == 0
    monkeypatch.setenv("SWARM_EXTRA", "chain")
    assert healthcheck.own_service() == ["--rpc", "http://127.0.0.1:8545"]
