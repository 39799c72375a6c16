"""Who may do what in the pool's Redis: one ACL user per role, rendered as Redis ACL file lines.

Redis is where the services trust each other, so nobody gets more than their code calls: a
forged `rollouts:submitted` entry once got an honest worker slashed.

  orchestrator  writes submissions; owns orch:* (leases, workers), auth:* (request nonces) and
                rate:* (rate limits, a Lua script); reads policy announcements, and for its
                status API the trainer's progress stream and the validator's per-worker
                counters (read-only, those keys only)
  validator     consumes submissions (group reads and acks), writes verified and rejected
                rollouts, trims the submissions and the rejected record (libs/streams/
                retention.py); owns validator:* (replay guard, chain queue, per-worker counters);
                reads announcements
  trainer       consumes (and trims) verified rollouts, announces policies, appends its
                progress; owns trainer:*
  healthcheck   PING only, for the compose healthcheck
  auditor       the operator's books (deploy/local/books.py: every rollout's fate): reads
                the rollout streams and the trainer's audit hashes, changes nothing; no service
                runs as it
  replica       a replica syncing from the primary (docker-compose.ha.yml): the replication
                handshake and stream, no key
  sentinel      a Redis Sentinel watching the data nodes and promoting a replica: the commands
                Redis's Sentinel docs list, and its one hello channel; no key
  default       every permission, behind a password only the operator holds (see
                DEFAULT_USER): a connection that does not authenticate can do nothing

Workers get no user at all: they talk to the orchestrator over signed HTTP, never to Redis.

Each grant renders as a Redis 7 selector, `(keys commands)`, and a command is allowed only if one
selector holds both it and every key it touches. That is what lets the validator XREADGROUP and
XACK `rollouts:submitted` (write commands in Redis's ACL categories: they move the group's
cursor) without being able to XADD to it, which key-only rules (`%R~`/`%W~`) cannot express.
Selectors need Redis >= 7.0.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from prime_swarm.libs.guard.ratelimit import RATE_KEY
from prime_swarm.protocol import selection_records, streams, worker_stats
from prime_swarm.protocol.auth import NONCE_KEY
from prime_swarm.protocol.trainer_records import DROPPED, TRAINED_BY_STEP
from prime_swarm.services.orchestrator import state as orch_state

# What redis-py's `pipeline(transaction=True)` sends around the queued commands; it checks no key.
TRANSACTION = ("multi", "exec")
# A Lua script as redis-py runs it (EVALSHA; SCRIPT EXISTS and LOAD before a pipeline that holds
# it): the script's own calls are checked against the same user, so it can touch nothing its
# caller could not.
SCRIPTS = ("evalsha", "script|load", "script|exists")
# Waiting for a replica before an outward acknowledgement (libs/streams/replication.py): WAIT
# (ECHO stands in for it while no replica is connected), and INFO's server and replication
# sections to tell "no replica" from "a slow one" and a deposed primary from the real one.
REPLICA_WAIT = ("wait", "echo", "info")
# What `libs.streams.consumer.GroupReader` calls on the stream it consumes.
GROUP_READER = ("xgroup|create", "xreadgroup", "xautoclaim", "xack", "xinfo|groups")
# What `libs.streams.retention` calls on a stream its consumer trims (and counts).
TRIMMER = ("xinfo|groups", "xinfo|stream", "xpending", "xtrim")


def namespace(key_template: str) -> str:
    """`orch:lease:{lease_id}` -> `orch:*`: a role owns its whole prefix, so a new key of its own
    needs no ACL change, while keys of other roles stay out of reach."""
    return key_template.split(":", 1)[0] + ":*"


@dataclass(frozen=True)
class Grant:
    """`commands` allowed on `keys` (glob patterns), and on nothing else."""

    keys: tuple[str, ...]
    commands: tuple[str, ...]
    # %R~: only commands Redis flags as reading may touch these keys.
    read_only: bool = False

    def selector(self) -> str:
        prefix = "%R~" if self.read_only else "~"
        rules = [prefix + k for k in self.keys] + ["+" + c for c in self.commands]
        return "(" + " ".join(rules) + ")"


@dataclass(frozen=True)
class Role:
    name: str
    grants: tuple[Grant, ...]
    # Allowed without any key: transaction framing, PING.
    keyless: tuple[str, ...] = TRANSACTION
    # Pub/Sub channels (glob patterns) it may PUBLISH and SUBSCRIBE to; none for the services.
    channels: tuple[str, ...] = ()

    @property
    def commands(self) -> frozenset[str]:
        return frozenset(self.keyless).union(*(g.commands for g in self.grants))

    def acl_line(self, password: str) -> str:
        digest = password_digest(password)
        rules = [
            "resetkeys",
            "resetchannels",
            *("&" + c for c in self.channels),
            "-@all",
            *("+" + c for c in self.keyless),
        ]
        selectors = [g.selector() for g in self.grants]
        return " ".join(["user", self.name, "on", "resetpass", "#" + digest, *rules, *selectors])


def password_digest(password: str) -> str:
    """What an ACL file holds of a password (`#<sha256 hex>`), never the password."""
    return hashlib.sha256(password.encode()).hexdigest()


def pattern(key_template: str) -> str:
    """`validator:worker:{worker}` -> `validator:worker:*`: exactly the keys of one template."""
    return re.sub(r"\{[^}]*\}", "*", key_template)


# The orchestrator owns the prefixes of its keys (services/orchestrator/state.py, request nonces,
# rate limits).
ORCHESTRATOR_KEYS = tuple(
    sorted(
        {
            namespace(k)
            for k in (
                orch_state.TASK_COUNTER,
                orch_state.WORKERS,
                orch_state.LIVE_WORKERS,
                orch_state.EJECTED,
                orch_state.LEASE,
                orch_state.OPEN_LEASES,
                orch_state.SUBMITTED,
                orch_state.WORK_IDS,
                orch_state.REISSUED,
                orch_state.WORKER_INFO,
                orch_state.SUBMITS_PER_MINUTE,
                NONCE_KEY,
                RATE_KEY,
            )
        }
    )
)
ORCHESTRATOR_COMMANDS = (
    "get", "set", "exists", "incrby", "expire",  # redis-py's incr() sends INCRBY
    "zadd", "zrem", "zcard", "zcount", "zrangebyscore", "zremrangebyscore",
    "hset", "hdel", "hexists", "hlen", "hincrby", "hgetall", "hmget", "hscan",
    "zrevrange", "zscore",
    "time",
)  # fmt: skip

ORCHESTRATOR = Role(
    "orchestrator",
    keyless=(*TRANSACTION, *REPLICA_WAIT),
    grants=(
        Grant(keys=ORCHESTRATOR_KEYS, commands=ORCHESTRATOR_COMMANDS),
        # The Lua scripts (RateLimiter; LeaseBook's work ids, grants and admissions) name keys
        # of several grants: EVALSHA needs one selector holding them all.
        Grant(
            keys=(*ORCHESTRATOR_KEYS, streams.ROLLOUTS_SUBMITTED, streams.ROLLOUTS_VERIFIED),
            commands=SCRIPTS,
        ),
        Grant(
            keys=(streams.ROLLOUTS_SUBMITTED,), commands=("xadd", "xlen", "xinfo|groups", "xrange")
        ),
        # Lease admission counts what the trainer has not consumed yet.
        Grant(
            keys=(streams.ROLLOUTS_VERIFIED,), commands=("xinfo|groups", "xrange"), read_only=True
        ),
        Grant(
            keys=(streams.POLICY_ANNOUNCEMENTS, streams.TRAINER_PROGRESS),
            commands=("xrevrange",),
            read_only=True,
        ),
        # The status API shows each worker's verdicts: the validator's counters, read only.
        Grant(
            keys=(
                pattern(worker_stats.VALIDATOR_WORKER),
                pattern(worker_stats.VALIDATOR_ACCEPTED_PER_MINUTE),
            ),
            commands=("hgetall", "hmget"),
            read_only=True,
        ),
        # Live prompt selection: the validators' pass rates read, the orchestrators' book kept.
        Grant(keys=(selection_records.PASS_RATES,), commands=("hmget",), read_only=True),
        Grant(keys=(selection_records.COUNTS,), commands=("hincrby",)),
    ),
)

VALIDATOR = Role(
    "validator",
    keyless=(*TRANSACTION, *REPLICA_WAIT),
    grants=(
        Grant(
            keys=("validator:*",),
            commands=(
                *("set", "get", "rpush", "llen", "lrange", "ltrim"),
                *("hset", "hincrby", "hgetall", "expire"),
            ),
        ),
        Grant(keys=(streams.ROLLOUTS_SUBMITTED,), commands=(*GROUP_READER, *TRIMMER)),
        Grant(keys=(streams.ROLLOUTS_VERIFIED,), commands=("xadd",)),
        Grant(keys=(streams.ROLLOUTS_REJECTED,), commands=("xadd", *TRIMMER)),
        # Held suspects: written by the validator that could not settle them, read by the
        # validators of the worker's device class (one consumer group per class).
        Grant(keys=(streams.ROLLOUTS_HELD,), commands=(*GROUP_READER, "xadd")),
        Grant(keys=(streams.POLICY_ANNOUNCEMENTS,), commands=("xrevrange",), read_only=True),
        # Each accepted group's pass rate, for the orchestrators' prompt selection.
        Grant(keys=(selection_records.PASS_RATES,), commands=("hset",)),
    ),
)

TRAINER = Role(
    "trainer",
    keyless=(*TRANSACTION, *REPLICA_WAIT),
    grants=(
        Grant(keys=("trainer:*",), commands=("sadd", "sismember", "hset", "hsetnx")),
        Grant(keys=(streams.ROLLOUTS_VERIFIED,), commands=(*GROUP_READER, *TRIMMER)),
        # The step's acknowledgement (persist.py `_ACKNOWLEDGE`): the trained set and the
        # verified stream in one script.
        Grant(keys=("trainer:*", streams.ROLLOUTS_VERIFIED), commands=SCRIPTS),
        Grant(keys=(streams.ROLLOUTS_REJECTED,), commands=("xinfo|stream",), read_only=True),
        Grant(keys=(streams.POLICY_ANNOUNCEMENTS,), commands=("xadd", "xrevrange")),
        Grant(keys=(streams.TRAINER_PROGRESS,), commands=("xadd",)),
    ),
)

HEALTHCHECK = Role("healthcheck", grants=(), keyless=("ping",))

AUDITOR = Role(
    "auditor",
    # The books read everything in one transaction: a snapshot, not a moving picture.
    keyless=TRANSACTION,
    grants=(
        Grant(
            keys=(streams.ROLLOUTS_SUBMITTED, streams.ROLLOUTS_VERIFIED, streams.ROLLOUTS_REJECTED),
            commands=("xrange", "xinfo|groups", "xinfo|stream", "xpending"),
            read_only=True,
        ),
        Grant(
            keys=(TRAINED_BY_STEP, DROPPED, selection_records.COUNTS),
            commands=("hgetall",),
            read_only=True,
        ),
    ),
)

# A replica logs in to its primary (`masteruser`/`masterauth`) and asks for the replication
# stream: what Redis's replication docs list. The stream itself is not checked against the ACL.
# Every data node holds this login, not only the first replica: after a failover the Sentinels
# make the old primary a replica of the new one, and it must be able to sync.
REPLICA = Role("replica", grants=(), keyless=("psync", "replconf", "ping"))

# What a Sentinel sends the data nodes (Redis's Sentinel docs, "Redis Access Control List
# authentication"): INFO and ROLE to watch them, PING to call one down, and a failover's
# MULTI / SLAVEOF / CONFIG REWRITE / CLIENT KILL / EXEC; SCRIPT KILL for a node stuck in a script.
# The docs grant every channel; a Sentinel publishes and subscribes to one, its hello channel
# (how Sentinels find each other through the nodes they watch), so that is the one granted.
SENTINEL_HELLO = "__sentinel__:hello"
SENTINEL_COMMANDS = (
    "multi", "exec", "slaveof", "ping", "subscribe", "publish", "info", "role",
    "config|rewrite", "client|setname", "client|kill", "script|kill",
)  # fmt: skip
SENTINEL = Role("sentinel", grants=(), keyless=SENTINEL_COMMANDS, channels=(SENTINEL_HELLO,))

ROLES: dict[str, Role] = {
    r.name: r for r in (ORCHESTRATOR, VALIDATOR, TRAINER, HEALTHCHECK, AUDITOR, REPLICA, SENTINEL)
}

# `default` is the user Redis replays its append-only file as, and Redis 7 re-checks the commands
# of every MULTI/EXEC in the file against it at load. Turned off (as it once was here), each
# transaction in the file is dropped at restart without a word: our pipelines, and the XCLAIM
# and XGROUP SETID that record a consumer group's reads (redis/redis#14541, valkey#3983). Seen
# in the compose test: after one Redis crash, 79 rollouts lost and 16 trained twice. So
# `default` keeps every permission and is guarded by a password only the operator holds (no
# service has it): a connection that does not authenticate still gets NOAUTH, and nothing else.
DEFAULT_USER = "default"
# Every user with a password: the roles, and `default`.
USERS = (*ROLES, DEFAULT_USER)


def default_line(password: str) -> str:
    digest = password_digest(password)
    return f"user default on resetpass #{digest} resetkeys resetchannels ~* &* +@all"


def acl_file(passwords: Mapping[str, str]) -> str:
    """The ACL file for `redis-server --aclfile`: every role of ROLES, with its password hashed.

    ACL files take no comments, so the reasons live here, not in the file.
    """
    missing = sorted(set(USERS) - set(passwords))
    if missing:
        raise ValueError(f"no password for Redis role(s) {missing}")
    for name, password in passwords.items():
        if len(password) < 16:
            raise ValueError(f"the password of Redis role {name!r} is too short")
    lines = [default_line(passwords[DEFAULT_USER])]
    lines += [role.acl_line(passwords[name]) for name, role in ROLES.items()]
    return "\n".join(lines) + "\n"
