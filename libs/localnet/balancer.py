"""HAProxy in front of orchestrator replicas: the one address the pool publishes on chain.

The replicas share one Redis and hold no state of their own a request depends on (leases,
nonces, rate limits and the roster are all in Redis; the grant is one Lua script), so any
replica may answer any request and the balancer needs no stickiness. It checks each replica's
/healthz and stops sending to one that fails it; a request on a replica that dies mid-way fails
at the worker, which retries (idempotently: services/orchestrator/state.py `_ADMIT`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import httpx

from .ports import free_port
from .process import ManagedProcess


def haproxy_config(bind: tuple[str, int], backends: Sequence[tuple[str, int]]) -> str:
    """An HAProxy config balancing HTTP over `backends` (host, port), health-checked."""
    host, port = bind
    servers = [
        f"    server orchestrator-{i} {h}:{p} check inter 1s fall 3 rise 2"
        for i, (h, p) in enumerate(backends)
    ]
    return "\n".join(
        [
            "global",
            "    maxconn 4096",
            "defaults",
            "    mode http",
            # A lease or a batch of submissions takes milliseconds; a slow chain lookup a few
            # seconds: 60 s is a hung replica, not a busy one.
            "    timeout connect 2s",
            # A replica busy on a saturated machine answers /healthz late, not never: a check
            # that gave up after the 1 s interval took replicas out under a storm of 200
            # workers on 2 cores, and the balancer answered 503 with no replica left.
            "    timeout check 5s",
            "    timeout client 60s",
            "    timeout server 60s",
            # A request refused at connect (the replica died since the last check) goes to
            # another replica; one sent and unanswered is not re-sent: the worker retries it.
            "    retries 2",
            "    option redispatch",
            "frontend orchestrators",
            f"    bind {host}:{port}",
            "    default_backend replicas",
            "backend replicas",
            "    balance roundrobin",
            "    option httpchk GET /healthz",
            *servers,
            "",
        ]
    )


class Balancer:
    """`haproxy` on a free loopback port in front of `backends`; `url` is its address."""

    def __init__(
        self, backends: Sequence[tuple[str, int]], run_dir: Path, log_dir: Path, port: int = 0
    ) -> None:
        binary = shutil.which("haproxy") or (
            "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
        )
        if binary is None:
            raise RuntimeError("haproxy not found; run `make setup` (installs it)")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = run_dir / "haproxy.cfg"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(haproxy_config(("127.0.0.1", self.port), backends))
        # -db: one process in the foreground, supervised like the others (and its CPU counted).
        self.process = ManagedProcess("haproxy", [binary, "-db", "-f", str(config)], log_dir)
        self.process.wait_until(self._answering, 15.0, "balancing")

    def _answering(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200

    def stop(self) -> None:
        self.process.stop()
