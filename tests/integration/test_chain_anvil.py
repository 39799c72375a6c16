"""The anvil launcher: starts on a free port, reports a failed start, leaves nothing behind."""

from __future__ import annotations

import socket

import pytest

from prime_swarm.libs.chain.anvil import Anvil, AnvilError, rpc_ready


def test_start_and_stop() -> None:
    node = Anvil(accounts=2)
    with node:
        proc = node._proc
        assert proc is not None and proc.poll() is None and rpc_ready(node.rpc_url)
    assert proc.returncode is not None
    assert not rpc_ready(node.rpc_url, timeout=0.2)


def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(AnvilError, match=f"did not start on http://127.0.0.1:{port}"):
            Anvil(port=port, startup_timeout=5).start()
