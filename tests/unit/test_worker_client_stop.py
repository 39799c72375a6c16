"""A stopping worker gives up on an unreachable orchestrator after one retry, not after its
whole backoff budget (the orchestrator of a stopping pool is stopping too)."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
from eth_account import Account

from prime_swarm.services.worker.client import OrchestratorClient


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("stopping", "attempts"), [(False, 3), (True, 2)])
def test_retries_while_running_and_once_when_stopping(
    stopping: bool, attempts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = threading.Event()
    if stopping:
        stop.set()
    client = OrchestratorClient(
        f"http://127.0.0.1:{closed_port()}", Account.create(), 2.0, retry_budget=2, stop=stop
    )
    sent = []
    real = client._send

    def counted(*args: object) -> object:
        sent.append(args)
        return real(*args)

    monkeypatch.setattr(client, "_send", counted)
    with pytest.raises(httpx.TransportError):
        client.worker_status("0x" + "ab" * 20)
    assert len(sent) == attempts
    client.close()
