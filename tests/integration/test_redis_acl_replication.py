"""The failover users of the compose Redis ACL (deploy/redis_acl.py `replica` and `sentinel`, as
`prime-swarm compose-secrets` writes them) on real redis-servers and Sentinels: a replica syncs
from a primary that runs the ACL, three Sentinels watch both, find each other and promote the
replica when the primary is lost, and the lost node comes back as the new primary's replica.
docker-compose.ha.yml runs the same users.

Each user is all its job needs and no more: a login without the replication grants cannot sync,
and neither user can touch a key or another channel. The setup is written out here (not
libs/localnet/redis_ha.RedisHA, whose readiness checks log in as nobody and so never see an
ACL'd primary in sync).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from prime_swarm.deploy import compose_secrets, redis_acl
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.libs.localnet.redis_ha import SERVICE, sentinel_config
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.streams.connection import connect
from prime_swarm.protocol import streams

FAKE = {"data": "{}"}


def password(secrets: Path, role: str) -> str:
    return (secrets / compose_secrets.password_file(role)).read_text()


def as_user(node: RedisServer, secrets: Path, role: str) -> redis.Redis:
    url = f"redis://{role}:{password(secrets, role)}@{node.host}:{node.public_port}/0"
    return redis.Redis.from_url(url, socket_timeout=5)


def until(
    what: str, probe: Callable[[], object], timeout_s: float, state: Callable[[], str] = str
) -> object:
    """`state`: what the failure message says of the set (who the Sentinels name the primary)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            if got := probe():
                return got
        except redis.RedisError as exc:  # a node restarting, or not yet a replica
            last = exc
        time.sleep(0.2)
    raise AssertionError(
        f"{what}: not within {timeout_s:.0f} s (last error: {last!r}) {state()}".rstrip()
    )


def replica_in_sync(primary: RedisServer, secrets: Path) -> bool:
    # The orchestrator's user may read INFO (it tells "no replica" from "a slow one").
    client = as_user(primary, secrets, "orchestrator")
    try:
        info = client.info("replication")
    finally:
        client.close()
    return any(
        isinstance(v, dict) and v.get("state") == "online"
        for k, v in info.items()
        if k.startswith("slave")
    )


def link_up(node: RedisServer, secrets: Path) -> bool:
    client = as_user(node, secrets, "orchestrator")
    try:
        return client.info("replication").get("master_link_status") == "up"
    finally:
        client.close()


@contextmanager
def running_failover_set(root: Path) -> Iterator[SimpleNamespace]:
    """Primary and replica under the compose ACL, logging in to each other as `replica`; three
    Sentinels logging in to them as `sentinel`."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found; run `make setup` (installs it)")
    secrets = root / "secrets"
    compose_secrets.generate(secrets, workers=1)
    acl = secrets / compose_secrets.ACL_FILE
    # No wait before a full sync (Redis waits 5 s for more replicas to share it; there is one).
    login = [
        "masteruser replica",
        f"masterauth {password(secrets, 'replica')}",
        "repl-diskless-sync-delay 0",
    ]
    logs = root / "logs"
    started: list[RedisServer | ManagedProcess] = []
    try:
        primary = RedisServer(root / "node-0", logs, acl_file=acl, name="redis-0", config=login)
        started.append(primary)
        replica = RedisServer(
            root / "node-1",
            logs,
            acl_file=acl,
            name="redis-1",
            config=[*login, f"replicaof 127.0.0.1 {primary.port}"],
        )
        started.append(replica)
        ports = [free_port() for _ in range(3)]
        sentinels = []
        for i, port in enumerate(ports):
            conf = root / f"sentinel-{i}" / "sentinel.conf"
            conf.parent.mkdir(parents=True)
            auth = ("sentinel", password(secrets, "sentinel"))
            conf.write_text(sentinel_config(port, ("127.0.0.1", primary.port), auth))
            proc = ManagedProcess(f"sentinel-{i}", [binary, str(conf), "--sentinel"], logs)
            started.append(proc)
            sentinels.append(redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=1))
        until("the replica in sync", lambda: replica_in_sync(primary, secrets), 30)
        yield SimpleNamespace(
            root=root,
            primary=primary,
            replica=replica,
            sentinels=sentinels,
            ports=ports,
            secrets=secrets,
        )
    finally:
        for part in reversed(started):
            part.stop()


@pytest.fixture(scope="module")
def failover_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """One set for the tests that leave it as it was."""
    with running_failover_set(tmp_path_factory.mktemp("acl-replication")) as fs:
        yield fs


def primary_port(sentinels: list[redis.Redis]) -> int | None:
    """Where every Sentinel that answers says the primary is (None: they disagree)."""
    answers = set()
    for s in sentinels:
        try:
            answers.add(int(s.sentinel_get_master_addr_by_name(SERVICE)[1]))
        except (redis.RedisError, TypeError):
            continue
    return answers.pop() if len(answers) == 1 else None


def submitted(node: RedisServer, secrets: Path) -> list[str]:
    """The ids in `rollouts:submitted` on one node, read as the auditor."""
    auditor = as_user(node, secrets, "auditor")
    try:
        return [i.decode() for i, _ in auditor.xrange(streams.ROLLOUTS_SUBMITTED)]
    finally:
        auditor.close()


def test_a_replica_syncs_from_an_acl_primary_as_the_replica_user(
    failover_set: SimpleNamespace,
) -> None:
    primary, replica, secrets = failover_set.primary, failover_set.replica, failover_set.secrets
    orchestrator = as_user(primary, secrets, "orchestrator")
    try:
        entry = orchestrator.xadd(streams.ROLLOUTS_SUBMITTED, FAKE).decode()
        # What the orchestrator waits for before it acknowledges a submission.
        assert orchestrator.wait(1, 5000) == 1
    finally:
        orchestrator.close()
    assert submitted(replica, secrets) == [entry]


def test_a_login_without_the_replication_grants_cannot_sync(
    failover_set: SimpleNamespace, tmp_path: Path
) -> None:
    """The control: the healthcheck user (PING only) is refused PSYNC, so the grant is what
    lets the replica in, not a loose ACL."""
    secrets = failover_set.secrets
    stranger = RedisServer(
        tmp_path / "node-x",
        tmp_path / "logs",
        acl_file=secrets / compose_secrets.ACL_FILE,
        name="redis-x",
        config=[
            "masteruser healthcheck",
            f"masterauth {password(secrets, 'healthcheck')}",
            f"replicaof 127.0.0.1 {failover_set.primary.port}",
        ],
    )
    try:
        until(
            "the primary refusing the sync",
            lambda: "NOPERM" in stranger.process.log_path.read_text(),
            15,
        )
        assert not link_up(stranger, secrets)
    finally:
        stranger.stop()


def test_neither_failover_user_reaches_a_key_or_another_channel(
    failover_set: SimpleNamespace,
) -> None:
    for role in ("replica", "sentinel"):
        client = as_user(failover_set.primary, failover_set.secrets, role)
        try:
            assert client.ping()
            for attempt in (
                lambda c=client: c.get("orch:workers"),
                lambda c=client: c.xadd(streams.ROLLOUTS_SUBMITTED, FAKE),
                lambda c=client: c.publish("rollouts", "x"),
                lambda c=client: c.config_set("replica-read-only", "no"),
                lambda c=client: c.acl_list(),
            ):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    attempt()
        finally:
            client.close()
    sentinel = as_user(failover_set.primary, failover_set.secrets, "sentinel")
    try:
        assert sentinel.publish(redis_acl.SENTINEL_HELLO, "x") >= 0
    finally:
        sentinel.close()


def test_sentinels_as_the_sentinel_user_watch_promote_and_turn_the_lost_node(
    tmp_path: Path,
) -> None:
    with running_failover_set(tmp_path) as fs:
        promoted_s = lose_the_primary_and_bring_it_back(fs)
    # down-after 3 s, then a quorum and an election: a few seconds on loopback.
    assert promoted_s < 15, promoted_s


def lose_the_primary_and_bring_it_back(fs: SimpleNamespace) -> float:
    """The failover, checked at each step; the seconds until the Sentinels named the replica."""
    secrets = fs.secrets

    def watching() -> bool:
        for s in fs.sentinels:
            master = s.sentinel_master(SERVICE)
            # The hello channel works through the data nodes: each Sentinel found the others.
            if master["num-other-sentinels"] != 2 or master["num-slaves"] != 1:
                return False
            if "disconnected" in master["flags"] or "s_down" in master["flags"]:
                return False
        return True

    until("every Sentinel watching both nodes and the other two", watching, 30)
    orchestrator = connect(
        f"redis+sentinel://orchestrator:{password(secrets, 'orchestrator')}@"
        + ",".join(f"127.0.0.1:{p}" for p in fs.ports)
        + f"/{SERVICE}/0",
        socket_timeout=5,
    )
    try:
        before = orchestrator.xadd(streams.ROLLOUTS_SUBMITTED, FAKE).decode()
        assert orchestrator.wait(1, 5000) == 1

        fs.primary.process.kill()
        lost = time.monotonic()
        until("the replica promoted", lambda: primary_port(fs.sentinels) == fs.replica.port, 30)
        promoted_s = time.monotonic() - lost
        # The promotion was the Sentinels' SLAVEOF NO ONE, sent as the sentinel user.
        assert link_up(fs.replica, secrets) is False
        # The orchestrator's next write finds the new primary through the Sentinels.
        after = orchestrator.xadd(streams.ROLLOUTS_SUBMITTED, FAKE).decode()
        assert submitted(fs.replica, secrets) == [before, after]

        # The lost node comes back believing it is the primary; the Sentinels make it the new
        # primary's replica (SLAVEOF, CONFIG REWRITE) and it syncs as the replica user.
        fs.primary.process = fs.primary.process.respawn()
        until(
            "the old primary a replica in sync",
            lambda: link_up(fs.primary, secrets),
            60,
            # A second failover back to the restarted node shows here (DOWN_AFTER_MS says how).
            lambda: (
                f"(the Sentinels name port {primary_port(fs.sentinels)} the primary; "
                f"old {fs.primary.port}, promoted {fs.replica.port})"
            ),
        )
        assert orchestrator.wait(1, 5000) == 1
        assert submitted(fs.primary, secrets) == [before, after]
    finally:
        orchestrator.close()
    return promoted_s
