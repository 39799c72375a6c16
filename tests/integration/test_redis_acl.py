"""The compose Redis ACL (deploy/redis_acl.py, as `prime-swarm compose-secrets` writes it) on a
real redis-server: each role does its job through the services' own Redis code, and nothing else.

The attack it stops: anything but the orchestrator forging a `rollouts:submitted` entry (that got
an honest worker slashed), anything but the validator forging a verdict, anything but the trainer
announcing a policy, and a client without credentials doing anything at all.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rollout_messages import submission_for

from prime_swarm.deploy import compose_secrets, redis_acl
from prime_swarm.libs.guard.ratelimit import Rate, RateLimiter
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.rl.checkpoint import TrainerState
from prime_swarm.libs.streams.consumer import GroupReader
from prime_swarm.libs.streams.replication import Replication, ReplicaWait
from prime_swarm.libs.streams.retention import entries_added, trim
from prime_swarm.protocol import streams, worker_stats
from prime_swarm.protocol.auth import redis_nonce_burner
from prime_swarm.protocol.messages import (
    PolicyAnnouncement,
    PoolStatus,
    StepProgress,
    SubmittedRollout,
    Verdict,
    VerifiedRollout,
)
from prime_swarm.services.orchestrator.board import RelayWatch, StatusBoard
from prime_swarm.services.orchestrator.settings import OrchestratorSettings
from prime_swarm.services.orchestrator.state import (
    WORKER_INFO,
    WORKERS,
    Admission,
    LeaseBook,
    PolicyTracker,
    WorkerRoster,
)
from prime_swarm.services.trainer import progress
from prime_swarm.services.trainer.persist import Persister, Snapshot
from prime_swarm.services.validator import stats as validator_stats
from prime_swarm.services.validator.ledger_queue import ChainAction, LedgerQueue, queue_key

FAKE = {"data": "{}"}  # any payload: the ACL never looks inside an entry


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("redis-acl")
    compose_secrets.generate(root / "secrets", workers=1)
    server = RedisServer(root / "data", root / "logs", acl_file=root / "secrets" / "redis.acl")
    passwords = {
        r: (root / "secrets" / compose_secrets.password_file(r)).read_text()
        for r in redis_acl.ROLES
    }
    clients: list[redis.Redis] = []

    def url(role: str, password: str | None = None) -> str:
        # What a service's entrypoint hands it: the role's login in the URL.
        login = f"{role}:{password or passwords[role]}"
        return f"redis://{login}@{server.host}:{server.public_port}/0"

    def connect(role: str, password: str | None = None) -> redis.Redis:
        client = redis.Redis.from_url(url(role, password), socket_timeout=10)
        clients.append(client)
        return client

    try:
        yield SimpleNamespace(server=server, passwords=passwords, url=url, connect=connect)
    finally:
        for c in clients:
            c.close()
        server.stop()


def refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_each_role_does_its_job_with_the_services_code(acl_redis: SimpleNamespace) -> None:
    orch_url = acl_redis.url("orchestrator")
    trainer = acl_redis.connect("trainer")
    validator = acl_redis.connect("validator")

    # trainer: announces a policy (services/trainer/loop.py publish).
    ann = PolicyAnnouncement(version=1, step=1, model_hash="ab" * 32, manifest_path="/m/1")
    trainer.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(ann), maxlen=10_000, approximate=True)

    async def orchestrate() -> None:
        r = AsyncRedis.from_url(orch_url, socket_timeout=10)
        try:
            settings = OrchestratorSettings(ledger_address="0x" + "5f" * 20, pool_id=1)
            assert (await PolicyTracker(r, settings).latest()).version == 1

            async def chain_floor(worker: str) -> int:
                return 7  # as if the ledger had settled ids 0..6 before Redis lost the counter

            # WAIT and INFO as with replicas (none here: WAIT times out, INFO says so).
            leases = LeaseBook(r, settings, chain_floor, ReplicaWait(enabled=True))
            worker = "0x" + "ab" * 20
            (lease,), _ = await leases.issue(worker, 1, 0, requested=1, cap=8)
            assert lease.work_id == 7
            assert list(await leases.next_work_ids(worker, 3)) == [8, 9, 10]
            assert (await leases.get(lease.lease_id)) == lease
            assert await leases.open_count(worker) == 1
            answer = submission_for(lease)
            assert await leases.admit(answer) == (Admission.ADMITTED, Replication.NO_REPLICA)
            assert (await leases.admit(answer))[0] == Admission.ADMITTED_BEFORE
            assert await leases.open_count(worker) == 0
            burn = redis_nonce_burner(r)
            assert await burn(worker, "n-1", 60) and not await burn(worker, "n-1", 60)
            await RateLimiter(r).hit("test-bucket", Rate(per_second=10, burst=5))
            # services/orchestrator/routes.py
            await r.hset(WORKERS, worker, time.time())
            assert await r.hexists(WORKERS, worker) and await r.hlen(WORKERS) == 1
            await r.xadd(streams.ROLLOUTS_SUBMITTED, FAKE)
            assert await leases.in_flight() == 0  # no validator group yet: nothing awaits it
            assert await r.xlen(streams.ROLLOUTS_SUBMITTED) == 2
        finally:
            await r.aclose()

    asyncio.run(orchestrate())
    orch = acl_redis.connect("orchestrator")
    assert orch.xinfo_groups(streams.ROLLOUTS_SUBMITTED) == []

    # validator: consumes submissions, writes verdicts, queues chain actions, acks in one
    # transaction (services/validator/loop.py, ledger_queue.py).
    reader = GroupReader(
        validator,
        streams.ROLLOUTS_SUBMITTED,
        streams.VALIDATOR_GROUP,
        "v-1",
        SubmittedRollout,
        min_idle_ms=0,
    )
    entries = reader.read(count=10, block_ms=100)
    assert len(entries) == 2 and reader.own_pending(10) and reader.reclaim(10)
    assert reader.lag() == 2
    assert validator.xrevrange(streams.POLICY_ANNOUNCEMENTS, count=1)
    seen = "validator:seen:" + "cd" * 32
    assert validator.set(seen, "sub-1", nx=True, ex=60) and validator.get(seen) == b"sub-1"
    attested: list[object] = []
    ledger = SimpleNamespace(
        attest_work=lambda pool, works: (
            attested.extend(works) or SimpleNamespace(attested=works, skipped=[])
        )
    )
    queue = LedgerQueue(validator, ledger, 1, "0x" + "cd" * 20, batch=10, interval_s=0)  # type: ignore[arg-type]
    pipe = validator.pipeline(transaction=True)
    pipe.xadd(streams.ROLLOUTS_VERIFIED, FAKE)
    pipe.xadd(streams.ROLLOUTS_REJECTED, FAKE)
    pipe.rpush(queue.key, ChainAction("attest", "0x" + "ab" * 20, "ee" * 32, units=1).dumps())
    pipe.xack(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, *[e.entry_id for e in entries])
    pipe.execute()
    assert reader.lag() == 0
    assert queue.due() and queue.pending() == 1
    queue.flush()
    assert queue.pending() == 0 and len(attested) == 1

    # trainer: consumes verified rollouts, remembers what it trained, acks in one transaction.
    treader = GroupReader(
        trainer, streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP, "t-1", VerifiedRollout
    )
    got = treader.read(count=10, block_ms=100)
    assert len(got) == 1 and treader.lag() == 1
    assert not trainer.sismember("trainer:trained_submissions", "sub-1")
    persister = Persister(
        trainer, lambda snap: None, lambda version: None, 0, replica_wait=ReplicaWait(True)
    )
    snap = Snapshot(TrainerState(step=1, trained=["sub-1"]), {}, [got[0].entry_id])
    persister._acknowledge(snap)  # the script, then WAIT and INFO (no replica here)
    assert trainer.sismember("trainer:trained_submissions", "sub-1")
    assert treader.lag() == 0
    assert entries_added(trainer, streams.ROLLOUTS_VERIFIED) == 1
    assert entries_added(trainer, streams.ROLLOUTS_REJECTED) == 1
    # Each trims what it consumed (libs/streams/retention.py): nothing yet, none is old.
    assert trim(validator, streams.ROLLOUTS_SUBMITTED) == 0
    assert trim(validator, streams.ROLLOUTS_REJECTED) == 0
    assert trim(trainer, streams.ROLLOUTS_VERIFIED) == 0


def test_only_the_orchestrator_can_submit(acl_redis: SimpleNamespace) -> None:
    for role in ("validator", "trainer"):
        r = acl_redis.connect(role)
        assert refused(lambda r=r: r.xadd(streams.ROLLOUTS_SUBMITTED, FAKE)), role
        assert refused(lambda r=r: r.delete(streams.ROLLOUTS_SUBMITTED)), role
    validator = acl_redis.connect("validator")
    # It consumes the stream, yet cannot rewrite it or its group's cursor. (It may XTRIM it,
    # which the retention rule needs and an ACL cannot narrow to MINID; a trim past what was
    # read shows in the books as entries added that nobody saw.)
    for forge in (
        lambda: validator.xdel(streams.ROLLOUTS_SUBMITTED, "0-1"),
        lambda: validator.xgroup_setid(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, "$"),
        lambda: validator.xgroup_destroy(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP),
        lambda: validator.set("orch:lease:forged", "{}"),  # a lease the orchestrator never gave
    ):
        assert refused(forge)


def test_only_the_validator_can_give_verdicts(acl_redis: SimpleNamespace) -> None:
    orch, trainer = acl_redis.connect("orchestrator"), acl_redis.connect("trainer")
    for r in (orch, trainer):
        assert refused(lambda r=r: r.xadd(streams.ROLLOUTS_VERIFIED, FAKE))
        assert refused(lambda r=r: r.xadd(streams.ROLLOUTS_REJECTED, FAKE))
        assert refused(lambda r=r: r.rpush(queue_key(1, "0x" + "cd" * 20), "{}"))
    # The orchestrator writes submissions but cannot read them back as a consumer, nor ack
    # them away before the validator sees them.
    assert refused(
        lambda: orch.xreadgroup(
            streams.VALIDATOR_GROUP, "x", {streams.ROLLOUTS_SUBMITTED: ">"}, count=1
        )
    )
    assert refused(lambda: orch.xack(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, "0-1"))
    # Its Lua permission is no way around: a script runs with the caller's ACL.
    sha = orch.script_load("return redis.call('XADD', KEYS[1], '*', 'data', '{}')")
    for key in ("rate:x", streams.ROLLOUTS_VERIFIED):  # its own key, a key its scripts read
        with pytest.raises(redis.exceptions.ResponseError, match="executing the script can't"):
            orch.evalsha(sha, 1, key)
    assert refused(lambda: orch.evalsha(sha, 1, streams.ROLLOUTS_REJECTED))
    assert refused(lambda: orch.eval("return 1", 0))


def test_only_the_trainer_can_announce_a_policy(acl_redis: SimpleNamespace) -> None:
    for role in ("orchestrator", "validator"):
        r = acl_redis.connect(role)
        assert refused(lambda r=r: r.xadd(streams.POLICY_ANNOUNCEMENTS, FAKE)), role


def test_no_role_can_administer_the_server(acl_redis: SimpleNamespace) -> None:
    for role in redis_acl.ROLES:
        r = acl_redis.connect(role)
        for admin in (
            r.flushall,
            lambda r=r: r.config_get("*"),
            lambda r=r: r.keys("*"),
            lambda r=r: r.acl_list(),
            lambda r=r: r.acl_setuser("default", enabled=True, nopass=True),
        ):
            assert refused(admin), role
    health = acl_redis.connect("healthcheck")
    assert health.ping()
    assert refused(lambda: health.get("orch:workers"))


def test_without_credentials_nothing_is_possible(acl_redis: SimpleNamespace) -> None:
    # No retries: redis-py retries a refused login with backoff, which only slows the refusal.
    once = Retry(NoBackoff(), 0)
    anonymous = redis.Redis.from_url(acl_redis.server.url, socket_timeout=5, retry=once)
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.xadd(streams.ROLLOUTS_SUBMITTED, FAKE)
    finally:
        anonymous.close()
    for user, password in (
        ("default", ""),
        ("default", "anything-at-all-123"),
        ("orchestrator", acl_redis.passwords["validator"]),  # another role's password
        ("worker", acl_redis.passwords["orchestrator"]),  # workers have no user
    ):
        client = redis.Redis(
            port=acl_redis.server.port,
            username=user,
            password=password or None,
            socket_timeout=5,
            retry=once,
        )
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                client.xadd(streams.ROLLOUTS_SUBMITTED, FAKE)
        finally:
            client.close()


def test_the_status_counters_work_under_each_roles_acl(acl_redis: SimpleNamespace) -> None:
    """Each role counts what it learns with its own user; the orchestrator's status board reads
    them all with its user and cannot change the validator's or the trainer's."""
    worker = "0x" + "cd" * 20
    trainer, validator = acl_redis.connect("trainer"), acl_redis.connect("validator")
    orch = acl_redis.connect("orchestrator")
    progress.publish(trainer, step_progress(7))  # services/trainer/loop.py, each step
    verdicts = [
        Verdict(submission_id=f"s-{i}", lease_id=f"l-{i}", worker=worker, pool_id=1,
                accepted=ok, reason=None if ok else "bad_proof", units=5 if ok else 0,
                validator="0x" + "22" * 20)
        for i, ok in enumerate((True, True, False))
    ]  # fmt: skip
    pipe = validator.pipeline(transaction=True)  # services/validator/loop.py `_commit`
    for verdict in verdicts:
        validator_stats.count_verdict(pipe, verdict)
    pipe.execute()

    orch_url = acl_redis.url("orchestrator")

    async def read_status() -> PoolStatus:
        r = AsyncRedis.from_url(orch_url, socket_timeout=10)
        try:
            settings = OrchestratorSettings(ledger_address="0x" + "5f" * 20, pool_id=1)
            roster = WorkerRoster(r, settings)
            await roster.register(worker, "NVIDIA L4", "hf", "cuda")
            leases = LeaseBook(r, settings, no_floor)
            (lease,), _ = await leases.issue(worker, 1, 0, requested=1, cap=8)
            await leases.admit(submission_for(lease))  # counts the worker's submission
            await roster.record_ejection("0x" + "ef" * 20, json.dumps({"at": time.time()}))
            board = StatusBoard(r, settings, PolicyTracker(r, settings), RelayWatch([], 5, 1))
            assert (await board.worker(worker)) is not None

            async def none_in_flight() -> int:
                return 0

            return await board.pool_status(none_in_flight)
        finally:
            await r.aclose()

    async def no_floor(worker: str) -> int:
        return 0

    status = asyncio.run(read_status())
    row = next(w for w in status.workers if w.worker.lower() == worker)
    assert (row.hardware, row.submitted, row.accepted, row.units) == ("NVIDIA L4", 1, 2, 10)
    assert row.rejected == {"bad_proof": 1} and row.accepted_per_min > 0
    assert any(w.ejected for w in status.workers)
    assert status.rewards[-1].step == 7
    totals = worker_stats.VALIDATOR_WORKER.format(worker=worker)
    for forge in (
        lambda: orch.hincrby(totals, worker_stats.ACCEPTED, 100),
        lambda: orch.delete(totals),
        lambda: orch.xadd(streams.TRAINER_PROGRESS, FAKE),
        lambda: orch.xtrim(streams.TRAINER_PROGRESS, maxlen=0),
        lambda: validator.hincrby(WORKER_INFO.format(worker=worker), "submitted", 100),
        lambda: trainer.hincrby(totals, worker_stats.ACCEPTED, 100),
        lambda: validator.xadd(streams.TRAINER_PROGRESS, FAKE),
    ):
        assert refused(forge)


def step_progress(n: int) -> StepProgress:
    return StepProgress(
        step=n, version=n, mean_reward=0.5, groups=1, policy_lag_mean=0.0, policy_lag_max=0,
        stale_dropped=0, accepted_total=0, rejected_total=0, loss=0.0, clip_frac=0.0,
        seconds=1.0, wall=1.0,
    )  # fmt: skip


def test_a_redis_crash_loses_no_transaction_and_no_group_read(acl_redis: SimpleNamespace) -> None:
    """Redis replays its AOF as the `default` user and re-checks each MULTI/EXEC in it against
    that user. With `default` off, a crash dropped every transaction in the file, the consumer
    groups' reads among them: the compose test lost 79 rollouts and trained 16 twice (see
    redis_acl.DEFAULT_USER). Runs last: it restarts the module's server."""
    orchestrator, validator = acl_redis.connect("orchestrator"), acl_redis.connect("validator")
    submitted = streams.ROLLOUTS_SUBMITTED
    try:
        validator.xgroup_create(submitted, "crash-test", id="$", mkstream=True)
        pipe = orchestrator.pipeline(transaction=True)
        pipe.xadd(submitted, FAKE)
        pipe.xadd(submitted, FAKE)
        pipe.execute()
        read = validator.xreadgroup("crash-test", "c1", {submitted: ">"}, count=1)
        assert len(read[0][1]) == 1
        length = orchestrator.xlen(submitted)
    finally:
        orchestrator.close()
        validator.close()

    acl_redis.server.crash_and_restart()

    orchestrator, validator = acl_redis.connect("orchestrator"), acl_redis.connect("validator")
    assert orchestrator.xlen(submitted) == length, "the transaction's entries are gone"
    groups = {g["name"].decode(): g for g in validator.xinfo_groups(submitted)}
    assert "crash-test" in groups, "the consumer group is gone"
    assert groups["crash-test"]["pending"] == 1, "the group's read is gone"
