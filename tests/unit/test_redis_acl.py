"""deploy/redis_acl.py grants each role what its code calls, on the keys its code names, and
deploy/compose_secrets.py makes the files docker-compose.yml mounts without ever replacing one.

The ACL is only exercised in compose, so a service that starts calling a new Redis command would
pass every other test and then fail with NOPERM in a deployment: the scans below catch it here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
from pathlib import Path

import pytest

from prime_swarm.deploy import compose_secrets, redis_acl
from prime_swarm.libs.chain.keyfile import load_key
from prime_swarm.protocol import streams

ROOT = Path(__file__).resolve().parents[2]


def allows(role: redis_acl.Role, command: str, key: str) -> bool:
    """Whether one of `role`'s grants holds `command` on `key`, as Redis decides it for the
    ACL line the role writes (its key patterns are prefixes ending in `*`, or exact keys)."""

    def matches(pattern: str) -> bool:
        return key.startswith(pattern[:-1]) if pattern.endswith("*") else key == pattern

    return any(command in g.commands and any(map(matches, g.keys)) for g in role.grants)


# The code each role runs against Redis.
CODE = {
    "orchestrator": [
        *sorted((ROOT / "services" / "orchestrator").glob("*.py")),
        ROOT / "protocol" / "auth.py",
        ROOT / "libs" / "guard" / "ratelimit.py",
    ],
    "validator": [
        *sorted((ROOT / "services" / "validator").glob("*.py")),
        ROOT / "libs" / "streams" / "consumer.py",
        ROOT / "libs" / "streams" / "retention.py",
    ],
    "trainer": [
        *sorted((ROOT / "services" / "trainer").glob("*.py")),
        ROOT / "protocol" / "trainer_records.py",
        ROOT / "libs" / "streams" / "consumer.py",
        ROOT / "libs" / "streams" / "retention.py",
    ],
    "auditor": [ROOT / "deploy" / "local" / "books.py"],
}
# A redis-py call on the names this code gives its clients and pipelines.
CALL = re.compile(r"\b(?:self\.r|self\.redis|pool\.redis|redis|r|pipe)\.([a-z_]+)\(")
# A command inside a Lua script: Redis checks it against the caller's ACL too.
LUA_CALL = re.compile(r"redis\.(?:p?call)\(\s*['\"]([A-Za-z]+)['\"]")
# A string that starts like one of our keys: `orch:lease:{lease_id}`, `validator:` + f-string.
KEY_LIKE = re.compile(r"^[a-z_]+:(?:$|[a-z_{])")
# redis-py method -> the Redis commands it sends (when not simply its own name).
METHOD_COMMANDS = {
    "pipeline": {"multi", "exec"},  # only transaction=True pipelines are used
    "execute": set(),
    "aclose": set(),
    "close": set(),
    "call": set(),  # Lua's redis.call, read by LUA_CALL
    "register_script": {"evalsha", "script|load"},
    "incr": {"incrby"},
    "decr": {"decrby"},
    "xgroup_create": {"xgroup|create"},
    "xinfo_groups": {"xinfo|groups"},
    "xinfo_stream": {"xinfo|stream"},
    "xpending_range": {"xpending"},
}


def commands_called(files: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in files:
        text = path.read_text()
        for method in CALL.findall(text):
            found |= METHOD_COMMANDS.get(method, {method})
        found |= {c.lower() for c in LUA_CALL.findall(text)}
    return found


def key_literals(files: list[Path]) -> set[str]:
    """String constants (f-string heads included) that look like Redis keys, `{x}` as `*`."""
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if KEY_LIKE.match(node.value):
                    found.add(re.sub(r"\{[^}]*\}", "x", node.value))
    return found


@pytest.mark.parametrize("role", sorted(CODE))
def test_each_role_is_granted_every_command_its_code_calls(role: str) -> None:
    called = commands_called(CODE[role])
    assert called, "the scan found no Redis call: has the code's shape changed?"
    missing = called - redis_acl.ROLES[role].commands
    assert not missing, f"{role} calls {sorted(missing)}: grant them in deploy/redis_acl.py"


# The auditor names keys only through the constants of the code that writes them.
@pytest.mark.parametrize("role", sorted(set(CODE) - {"auditor"}))
def test_each_key_a_role_names_is_in_its_grants(role: str) -> None:
    keys = key_literals(CODE[role])
    assert keys, "the scan found no key: has the code's shape changed?"
    r = redis_acl.ROLES[role]
    # Any of its granted commands will do: the question is whether the key is reachable at all.
    outside = {k for k in keys if not any(allows(r, c, k + "x") for c in r.commands)}
    assert not outside, f"{role} uses keys {sorted(outside)} outside its grants"


def test_keys_come_from_the_code_and_roles_own_their_namespaces() -> None:
    from prime_swarm.libs.guard.ratelimit import RATE_KEY
    from prime_swarm.protocol.auth import NONCE_KEY
    from prime_swarm.services.orchestrator import state

    orch = redis_acl.ORCHESTRATOR
    for template in (state.LEASE, state.OPEN_LEASES, state.SUBMITTED, NONCE_KEY, RATE_KEY):
        key = re.sub(r"\{[^}]*\}", "x", template)
        assert allows(orch, "set", key) or allows(orch, "zadd", key), template
    assert allows(orch, "incrby", state.TASK_COUNTER) and allows(orch, "hset", state.WORKERS)
    for role in ("validator", "trainer"):
        assert allows(redis_acl.ROLES[role], "set" if role == "validator" else "sadd", f"{role}:x")
    # Nobody but the owner reaches a namespace.
    owners = {"orch": "orchestrator", "auth": "orchestrator", "rate": "orchestrator",
              "validator": "validator", "trainer": "trainer"}  # fmt: skip
    for prefix, owner in owners.items():
        reach = {
            name
            for name, r in redis_acl.ROLES.items()
            if any(allows(r, c, f"{prefix}:x") for c in r.commands)
        }
        assert reach == {owner}, prefix


def test_only_the_orchestrator_writes_submissions_and_only_the_validator_verdicts() -> None:
    writers = {
        stream: {name for name, r in redis_acl.ROLES.items() if allows(r, "xadd", stream)}
        for stream in streams.STREAM_MODELS
    }
    assert writers == {
        streams.ROLLOUTS_SUBMITTED: {"orchestrator"},
        streams.ROLLOUTS_VERIFIED: {"validator"},
        streams.ROLLOUTS_REJECTED: {"validator"},
        streams.ROLLOUTS_HELD: {"validator"},
        streams.POLICY_ANNOUNCEMENTS: {"trainer"},
        streams.TRAINER_PROGRESS: {"trainer"},
    }
    consumers = {
        stream: {name for name, r in redis_acl.ROLES.items() if allows(r, "xreadgroup", stream)}
        for stream in streams.STREAM_MODELS
    }
    assert consumers[streams.ROLLOUTS_SUBMITTED] == {"validator"}
    assert consumers[streams.ROLLOUTS_VERIFIED] == {"trainer"}
    assert consumers[streams.ROLLOUTS_HELD] == {"validator"}


def test_acl_file_guards_default_and_holds_only_hashes() -> None:
    passwords = {user: f"pw-{user}-0123456789abcdef" for user in redis_acl.USERS}
    text = redis_acl.acl_file(passwords)
    lines = text.splitlines()
    # `default` keeps every permission (AOF replay runs as it) behind its own password.
    assert lines[0].startswith("user default on resetpass #")
    assert lines[0].endswith(" ~* &* +@all")
    assert [ln.split()[1] for ln in lines[1:]] == list(redis_acl.ROLES)
    for password in passwords.values():
        assert password not in text
    for line in lines[1:]:
        assert line.startswith("user ") and "+@all" not in line and " ~*" not in line
    with pytest.raises(ValueError, match="no password"):
        redis_acl.acl_file({"orchestrator": "x" * 20})
    with pytest.raises(ValueError, match="too short"):
        redis_acl.acl_file({**passwords, "trainer": "short"})


def test_the_failover_users_get_what_replication_and_sentinel_send_and_no_key() -> None:
    """`replica` and `sentinel` (docker-compose.ha.yml): the commands Redis's replication and
    Sentinel docs list, no key at all, and for the Sentinel only its hello channel.
    tests/integration/test_redis_acl_replication.py runs a failover under them."""
    passwords = {user: f"pw-{user}-0123456789abcdef" for user in redis_acl.USERS}
    lines = {ln.split()[1]: ln for ln in redis_acl.acl_file(passwords).splitlines()}
    replica, sentinel = redis_acl.ROLES["replica"], redis_acl.ROLES["sentinel"]
    assert replica.commands == {"psync", "replconf", "ping"}
    assert sentinel.commands == {
        "multi", "exec", "slaveof", "ping", "subscribe", "publish", "info", "role",
        "config|rewrite", "client|setname", "client|kill", "script|kill",
    }  # fmt: skip
    for role in (replica, sentinel):
        assert not role.grants
        assert not any(allows(role, c, k) for c in role.commands for k in ("orch:x", "x"))
        rules = lines[role.name].split()
        assert "resetkeys" in rules and not [r for r in rules if "~" in r], rules
        assert "-@all" in rules and "+@all" not in rules
    assert [r for r in lines["replica"].split() if r.startswith("&")] == []
    assert [r for r in lines["sentinel"].split() if r.startswith("&")] == ["&__sentinel__:hello"]
    # Channels come after resetchannels, or the reset would drop them.
    rules = lines["sentinel"].split()
    assert rules.index("resetchannels") < rules.index("&__sentinel__:hello")
    # The services' roles still get no channel at all.
    for name in ("orchestrator", "validator", "trainer", "healthcheck", "auditor"):
        assert not [r for r in lines[name].split() if r.startswith("&")], name


# ------------------------------------------------------------------------------------ generator


def test_generator_makes_private_files_and_never_replaces_a_secret(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    first = compose_secrets.generate(out, workers=2)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    names = {p.name for p in out.iterdir()}
    assert names == set(first.created)
    assert {"redis.acl", "addresses.json", "grafana-admin.password", "trainer-key.json",
            "validator-key.json", "worker-0-key.json", "worker-1-key.json"} <= names  # fmt: skip
    for user in redis_acl.USERS:
        assert f"redis-{user}.password" in names
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    again = compose_secrets.generate(out, workers=2)
    assert not again.created and not again.updated
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    # A lost password gets a new one; the ACL derived from it follows, nothing else changes.
    (out / "redis-trainer.password").unlink()
    third = compose_secrets.generate(out, workers=2)
    assert third.created == ["redis-trainer.password"] and third.updated == ["redis.acl"]
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {n for n in after if after[n] != before.get(n)} == {
        "redis-trainer.password",
        "redis.acl",
    }


def test_generator_addresses_and_acl_match_the_secrets(tmp_path: Path) -> None:
    out = tmp_path / "s"
    compose_secrets.generate(out, workers=3)
    roster = json.loads((out / "addresses.json").read_text())
    assert roster["trainer"] == load_key(out / "trainer-key.json").address
    assert roster["validator"] == load_key(out / "validator-key.json").address
    assert roster["workers"] == [load_key(out / f"worker-{i}-key.json").address for i in range(3)]
    assert len({roster["trainer"], roster["validator"], *roster["workers"]}) == 5
    passwords = {r: (out / f"redis-{r}.password").read_text() for r in redis_acl.USERS}
    assert (out / "redis.acl").read_text() == redis_acl.acl_file(passwords)
    # URL-safe: the entrypoint puts them into redis://user:password@host as they are.
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{32,}", p) for p in passwords.values())


def test_generator_gives_each_file_to_its_containers_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owners: dict[str, tuple[int, int]] = {}
    monkeypatch.setattr(
        os, "chown", lambda p, uid, gid: owners.__setitem__(Path(p).name, (uid, gid))
    )
    out = tmp_path / "s"
    compose_secrets.generate(out, workers=1, chown=True)
    assert set(owners) == {p.name for p in out.iterdir()}
    assert owners["redis.acl"] == owners["redis-healthcheck.password"] == (999, 999)
    # Read by the replica and the Sentinels of docker-compose.ha.yml: containers of the redis image.
    assert owners["redis-replica.password"] == owners["redis-sentinel.password"] == (999, 999)
    assert owners["grafana-admin.password"] == (472, 0)
    for name in ("trainer-key.json", "validator-key.json", "worker-0-key.json",
                 "redis-orchestrator.password", "addresses.json"):  # fmt: skip
        assert owners[name] == compose_secrets.PRIME_OWNER, name


def test_cli_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prime_swarm.deploy.local.cli import main

    with pytest.raises(SystemExit) as done:
        main(["compose-secrets", "--out", str(tmp_path / "s"), "--workers", "1", "--owner", "me"])
    assert done.value.code == 0
    assert "created" in capsys.readouterr().out
    assert (tmp_path / "s" / "worker-0-key.json").exists()


def test_worker_counters_are_written_by_their_owner_and_only_read_by_the_orchestrator() -> None:
    """The status API's counters: each role counts in its own namespace; the orchestrator reads
    the validator's counters and the trainer's progress, and can change neither."""
    from prime_swarm.protocol import worker_stats as ws
    from prime_swarm.services.orchestrator import state

    roles = redis_acl.ROLES
    validator_keys = [
        ws.VALIDATOR_WORKER.format(worker="0x" + "ab" * 20),
        ws.VALIDATOR_ACCEPTED_PER_MINUTE.format(minute=29_000_000),
    ]
    for key in validator_keys:
        assert all(allows(roles["validator"], c, key) for c in ("hincrby", "expire"))
        assert allows(roles["orchestrator"], "hgetall", key)
        assert allows(roles["orchestrator"], "hmget", key)
        for command in ("hincrby", "hset", "hdel", "del", "expire"):
            assert not allows(roles["orchestrator"], command, key), (command, key)
        assert not any(allows(roles["trainer"], c, key) for c in roles["trainer"].commands)
    # Read-only grants of single templates: the rest of validator:* stays out of reach.
    assert not any(
        allows(roles["orchestrator"], c, "validator:1:chain_queue")
        for c in roles["orchestrator"].commands
    )
    for template in (state.WORKER_INFO, state.SUBMITS_PER_MINUTE):
        key = re.sub(r"\{[^}]*\}", "x", template)
        assert allows(roles["orchestrator"], "hincrby", key), template
        assert not any(allows(roles["validator"], c, key) for c in roles["validator"].commands)
    progress = streams.TRAINER_PROGRESS
    assert allows(roles["trainer"], "xadd", progress)
    assert allows(roles["orchestrator"], "xrevrange", progress)
    assert not allows(roles["orchestrator"], "xadd", progress)
    assert not allows(roles["orchestrator"], "xtrim", progress)


def test_prompt_selection_keys_are_written_by_their_owner_only() -> None:
    """Validators write the pass rates the orchestrators read; orchestrators keep the selection
    book the auditor reads. Neither can write the other's, the trainer neither."""
    from prime_swarm.protocol import selection_records as sel

    roles = redis_acl.ROLES
    assert allows(roles["validator"], "hset", sel.PASS_RATES)
    assert allows(roles["orchestrator"], "hmget", sel.PASS_RATES)
    assert allows(roles["orchestrator"], "hincrby", sel.COUNTS)
    assert allows(roles["auditor"], "hgetall", sel.COUNTS)
    for command in ("hset", "hdel", "del", "hincrby"):
        assert not allows(roles["orchestrator"], command, sel.PASS_RATES), command
        assert not allows(roles["validator"], command, sel.COUNTS), command
        assert not allows(roles["auditor"], command, sel.COUNTS), command
    assert not any(
        allows(roles["trainer"], c, k)
        for c in roles["trainer"].commands
        for k in (sel.PASS_RATES, sel.COUNTS)
    )
