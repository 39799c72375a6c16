"""Redis that fails over: a primary, a replica and three Sentinels on loopback.

Services reach it through one `redis+sentinel://` URL (libs/streams/connection.py): they ask
the Sentinels where the primary is, and ask again when it stops answering. Losing the primary's
machine (`kill_primary`) or cutting it off (`cut_primary`) makes the Sentinels agree (a quorum
of two of three) that it is down and promote the replica; the lost node, once back, is turned
into the new primary's replica by the Sentinels. docs/high-availability.md says what the
asynchronous replication between the two may lose, and how each write is made safe.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import redis

from prime_swarm.libs.streams.connection import connect

from .ports import free_port
from .process import ManagedProcess
from .redis_server import RedisServer

SERVICE = "prime"
# How long the Sentinels wait before calling the primary down, and how long a failover may take
# before another Sentinel tries (a WAN deployment raises these; docs/high-availability.md).
# Three Sentinel ping periods, not one: a Sentinel pings once a second and reconnects at most once
# a second, so right after a switch its first PING to the new primary can leave a second late. At
# 1 s it then called a healthy new primary down, the votes of the election just held still on its
# books made that a quorum at once, and a second failover handed the primary back to the old node
# restarted meanwhile, dropping what the new one had taken (1 test in 11 here, and once in CI).
DOWN_AFTER_MS = 3000
FAILOVER_TIMEOUT_MS = 6000
QUORUM = 2


def sentinel_config(
    port: int,
    primary: tuple[str, int],
    auth: tuple[str, str] | None,
    failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
) -> str:
    """A Sentinel's config file (Sentinel rewrites it as it learns the others and failovers)."""
    host, primary_port = primary
    lines = [
        f"port {port}",
        "bind 127.0.0.1",
        f"sentinel monitor {SERVICE} {host} {primary_port} {QUORUM}",
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}",
        f"sentinel parallel-syncs {SERVICE} 1",
    ]
    if auth is not None:
        lines += [
            f"sentinel auth-user {SERVICE} {auth[0]}",
            f"sentinel auth-pass {SERVICE} {auth[1]}",
        ]
    return "\n".join(lines) + "\n"


class RedisHA:
    """Node 0 starts as the primary, node 1 as its replica; `sentinels` Sentinels watch them.
    `acl_file` and `replication`/`sentinel` (user, password): the data nodes run the pool's ACL,
    the replica and the Sentinels log in as the users deploy/redis_acl.py gives them."""

    def __init__(
        self,
        data_dir: Path,
        log_dir: Path,
        *,
        acl_file: Path | None = None,
        replication: tuple[str, str] | None = None,
        sentinel_auth: tuple[str, str] | None = None,
        sentinels: int = 3,
        replicate_through: Callable[[int], int] | None = None,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
    ) -> None:
        """`replicate_through(primary port)`: the port the replica replicates from instead (a
        link a test can cut); the Sentinels leave it so for `failover_timeout_ms`, after which
        they point a replica at the primary they know."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found; run `make setup` (installs it)")
        self.log_dir = log_dir
        login = []
        if replication is not None:
            login = [f"masteruser {replication[0]}", f"masterauth {replication[1]}"]
        primary = RedisServer(
            data_dir / "node-0", log_dir, acl_file=acl_file, name="redis-0", config=login
        )
        upstream = replicate_through(primary.port) if replicate_through else primary.port
        replica = RedisServer(
            data_dir / "node-1",
            log_dir,
            acl_file=acl_file,
            name="redis-1",
            config=[*login, f"replicaof 127.0.0.1 {upstream}"],
        )
        self.nodes = [primary, replica]
        self.sentinels: list[ManagedProcess] = []
        self.sentinel_ports: list[int] = []
        for i in range(sentinels):
            port = free_port()
            conf = data_dir / f"sentinel-{i}" / "sentinel.conf"
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(
                sentinel_config(
                    port, ("127.0.0.1", primary.port), sentinel_auth, failover_timeout_ms
                )
            )
            proc = ManagedProcess(
                f"sentinel-{i}", [binary, str(conf.resolve()), "--sentinel"], log_dir
            )
            self.sentinels.append(proc)
            self.sentinel_ports.append(port)
        for proc, port in zip(self.sentinels, self.sentinel_ports, strict=True):
            proc.wait_until(lambda p=port: self._sentinel(p).ping(), 15.0, "answering PING")
        self.wait_until_replicated(30.0)
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        self.url = f"redis+sentinel://{hosts}/{SERVICE}/0"

    # ------------------------------------------------------------------ who is who
    @staticmethod
    def _sentinel(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)

    def primary_port(self) -> int | None:
        """Where a majority of the Sentinels says the primary is now (None: no majority)."""
        votes: dict[int, int] = {}
        for port in self.sentinel_ports:
            try:
                _, primary_port = self._sentinel(port).sentinel_get_master_addr_by_name(SERVICE)
            except (redis.RedisError, TypeError):
                continue
            votes[int(primary_port)] = votes.get(int(primary_port), 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] >= QUORUM else None

    def node_on(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def primary(self) -> RedisServer:
        port = self.primary_port()
        if port is None:
            raise RuntimeError("the Sentinels agree on no primary")
        return self.node_on(port)

    def client(self) -> redis.Redis:
        """A client of the current primary (the books, tests); services use the URL."""
        return self.primary().client()

    def wait_until_replicated(self, timeout_s: float) -> float:
        """Until the primary the Sentinels name reports a replica online and in sync; returns
        the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            try:
                node = self.primary()
                info = node.client().info("replication")
                if any(
                    isinstance(v, dict) and v.get("state") == "online"
                    for k, v in info.items()
                    if k.startswith("slave")
                ):
                    return time.monotonic() - started
            except (RuntimeError, redis.RedisError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no replica in sync with the primary after {timeout_s:.0f}s")

    # ------------------------------------------------------------------ losing the primary
    def wait_for_failover(self, old_port: int, timeout_s: float = 30.0) -> float:
        """Seconds until a majority of the Sentinels names a primary other than `old_port`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            port = self.primary_port()
            if port is not None and port != old_port:
                return time.monotonic() - started
            time.sleep(0.05)
        raise RuntimeError(f"no failover within {timeout_s:.0f}s")

    def _writable(self, started: float, timeout_s: float = 30.0) -> float:
        """Seconds from `started` until a write through the Sentinels lands: the outage a
        service sees (it asks the Sentinels, as this does)."""
        client = connect(self.url, socket_timeout=2)
        try:
            while True:
                try:
                    client.set("ha:probe", time.time())
                    return time.monotonic() - started
                except redis.RedisError:
                    if time.monotonic() - started > timeout_s:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()

    def kill_primary(self, down_s: float = 0.0) -> dict[str, float]:
        """SIGKILL the primary's machine; once the Sentinels have promoted the replica (and
        `down_s` has passed), start the lost node again, as a supervisor brings a machine back:
        the Sentinels make it the new primary's replica. Returns the seconds until promotion
        and until writes land again."""
        node = self.primary()
        started = time.monotonic()
        node.process.kill()
        promoted = self.wait_for_failover(node.port)
        downtime = self._writable(started)
        time.sleep(max(0.0, down_s - (time.monotonic() - started)))
        node.process = node.process.respawn()
        node.process.wait_until(node._ping, 30.0, "answering PING after a restart")
        return {
            "promoted_s": round(promoted, 2),
            "downtime_s": round(downtime, 2),
            **self._redundant_again(started),
        }

    def _redundant_again(self, started: float) -> dict[str, float]:
        """Wait until the lost node is the new primary's replica and in sync: a pair tolerates
        one loss at a time, and losing the new primary before then is a second failure (its
        writes acknowledged without a replica go with it: docs/high-availability.md)."""
        self.wait_until_replicated(120.0)
        return {"redundant_again_s": round(time.monotonic() - started, 2)}

    def cut_primary(self, down_s: float = 0.0) -> dict[str, float]:
        """Cut the primary off from every peer (SIGSTOP: it neither answers nor writes) until
        the Sentinels have promoted the replica and `down_s` has passed, then let it back in
        (SIGCONT): it wakes believing it is the primary, and the Sentinels demote it. Returns
        the seconds until promotion and until writes land again."""
        node = self.primary()
        started = time.monotonic()
        os.killpg(node.process.proc.pid, signal.SIGSTOP)
        try:
            promoted = self.wait_for_failover(node.port)
            downtime = self._writable(started)
            time.sleep(max(0.0, down_s - (time.monotonic() - started)))
        finally:
            os.killpg(node.process.proc.pid, signal.SIGCONT)
        return {
            "promoted_s": round(promoted, 2),
            "downtime_s": round(downtime, 2),
            **self._redundant_again(started),
        }

    def crash_and_restart(self) -> None:
        """A chaos kill of "redis": the primary's machine is lost (`kill_primary`)."""
        self.kill_primary()

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.stop()
        for node in self.nodes:
            node.stop()
