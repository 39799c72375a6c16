"""`prime-swarm compose-secrets`: the files docker-compose.yml mounts as secrets, created once.

    sudo .venv/bin/prime-swarm compose-secrets --out deploy/docker/secrets

creates, in a 0700 folder, each file 0600:

  redis-<role>.password   a random password per Redis role of deploy/redis_acl.py
  redis.acl               the ACL file of those roles (only their SHA-256 hashes)
  grafana-admin.password  Grafana's admin password
  <who>-key.json          a fresh Ethereum key (libs/chain/keyfile.py, plain format) for the
                          trainer, the validator and each compose worker
  addresses.json          their public addresses, for the deployer, which registers and funds
                          them but never sees a private key

A password or key that exists is never replaced, so running it again is safe; the two files
derived from them (redis.acl, addresses.json) are rewritten when they no longer match, which is
also how an upgrade that changes the Redis roles reaches an existing deployment.

Compose mounts a file secret as a bind mount that keeps its host owner and mode, so a 0600 file
is readable in its container only if it belongs to the user that container runs as. Run as root,
each file is given to its reader (`--owner containers`, the default for root): the prime images'
user (Dockerfile), the redis image's, Grafana's. `--owner me` keeps them yours, for Docker Desktop,
whose file sharing checks the host user instead.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from eth_account import Account

from prime_swarm.libs.chain.files import atomic_write_text, create_exclusive
from prime_swarm.libs.chain.keyfile import load_key, write_key

DEFAULT_OUT = Path("deploy/docker/secrets")

# uid:gid each container reads its secrets as.
PRIME_OWNER = (10001, 10001)  # deploy/docker/Dockerfile: useradd --uid 10001, groupadd --gid 10001
REDIS_OWNER = (999, 999)  # the official redis image's `redis` user (after its gosu)
GRAFANA_OWNER = (472, 0)  # the grafana/grafana image's user

ACL_FILE = "redis.acl"
GRAFANA_PASSWORD = "grafana-admin.password"
ADDRESSES = "addresses.json"
# Roles whose password only containers of the redis image read: the healthcheck's, and the
# logins of replicas and Sentinels to the data nodes (docker-compose.ha.yml).
REDIS_SIDE_ROLES = {"healthcheck", "replica", "sentinel"}
# Users whose password no container reads: the operator's own, on the host, as root.
HOST_SIDE_ROLES = {"auditor", "default"}


def password_file(role: str) -> str:
    return f"redis-{role}.password"


def key_file(who: str) -> str:
    return f"{who}-key.json"


def key_holders(workers: int) -> list[str]:
    return ["trainer", "validator", *(f"worker-{i}" for i in range(workers))]


def owner_of(name: str) -> tuple[int, int]:
    if name == ACL_FILE or name in {password_file(r) for r in REDIS_SIDE_ROLES}:
        return REDIS_OWNER
    if name == GRAFANA_PASSWORD:
        return GRAFANA_OWNER
    if name in {password_file(r) for r in HOST_SIDE_ROLES}:
        return (0, 0)
    return PRIME_OWNER


@dataclass
class Outcome:
    created: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)


def _new_password() -> str:
    # URL-safe, so the entrypoint can put it into redis://user:password@host as it is.
    return secrets.token_urlsafe(32)


def _write_derived(path: Path, text: str) -> str | None:
    """Atomically (re)write a file derived from the secrets; the outcome, None if unchanged."""
    if path.exists() and path.read_text() == text:
        return None
    outcome = "updated" if path.exists() else "created"
    atomic_write_text(path, text, mode=0o600)
    return outcome


# The worker key pool docker-compose.yml mounts: replicas of `worker` claim one each.
WORKER_KEYS = 8


def generate(out: Path, workers: int = WORKER_KEYS, chown: bool = False) -> Outcome:
    """Create what is missing under `out` (see the module docstring); never replace a secret."""
    from . import redis_acl  # imports the services' key names; `prime-swarm up` need not pay

    result = Outcome()
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)

    passwords: dict[str, str] = {}
    for name in [*(password_file(r) for r in redis_acl.USERS), GRAFANA_PASSWORD]:
        path = out / name
        if create_exclusive(path, _new_password()):
            result.created.append(name)
        else:
            result.kept.append(name)
        passwords[name] = path.read_text().strip()

    addresses: dict[str, str] = {}
    for who in key_holders(workers):
        path = out / key_file(who)
        if path.exists():
            result.kept.append(path.name)
        else:
            write_key(path, Account.create())
            result.created.append(path.name)
        addresses[who] = load_key(path).address

    acl = redis_acl.acl_file({r: passwords[password_file(r)] for r in redis_acl.USERS})
    roster = {
        "trainer": addresses["trainer"],
        "validator": addresses["validator"],
        "workers": [addresses[w] for w in key_holders(workers)[2:]],
    }
    for name, text in ((ACL_FILE, acl), (ADDRESSES, json.dumps(roster, indent=2) + "\n")):
        outcome = _write_derived(out / name, text)
        if outcome == "created":
            result.created.append(name)
        elif outcome == "updated":
            result.updated.append(name)
        else:
            result.kept.append(name)

    if chown:
        for name in [*passwords, *(key_file(w) for w in addresses), ACL_FILE, ADDRESSES]:
            os.chown(out / name, *owner_of(name))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument(
        "--workers",
        type=int,
        default=WORKER_KEYS,
        help="worker keys to create: the most `--scale worker=N` replicas (docker-compose.yml "
        "mounts 8)",
    )
    parser.add_argument(
        "--owner",
        choices=("containers", "me"),
        help="give each file to the user its container reads it as (needs root; the default "
        "when run as root), or keep them yours (Docker Desktop)",
    )


def run(args: argparse.Namespace) -> int:
    owner = args.owner or ("containers" if os.geteuid() == 0 else "me")
    if owner == "containers" and os.geteuid() != 0:
        print("compose-secrets: --owner containers needs root (sudo)", file=sys.stderr)
        return 2
    try:
        result = generate(args.out, workers=args.workers, chown=owner == "containers")
    except PermissionError as exc:
        # A previous root run gave the files to the containers' users.
        print(f"compose-secrets: {exc}; run it with sudo", file=sys.stderr)
        return 1
    for label, names in (("created", result.created), ("updated", result.updated),
                         ("kept", result.kept)):  # fmt: skip
        if names:
            print(f"{label:>8}: {', '.join(sorted(names))}")
    print(f"secrets in {args.out.resolve()} (0700, files 0600)")
    if owner == "me":
        print(
            "note: the files are yours; a rootful Linux Docker bind-mounts them with that owner "
            "and the containers cannot read them. Re-run with sudo (or --owner containers).",
            file=sys.stderr,
        )
    print("next: docker compose up --build")
    return 0
