#!/usr/bin/env python3
"""prime-claim-key: give each replica of a scaled service its own key, then run the service.

    prime-claim-key [--keys DIR] [--locks DIR] -- prime-worker join

`docker compose up --scale worker=N` starts N identical containers, and a worker's key is its
identity on chain: two replicas sharing one would race each other's nonces and leases. Every
replica mounts the same pool of funded keys (`worker-key-<i>.json`, made by compose-secrets and
funded by the deployer) and takes the first one whose lock file in a volume shared by all
replicas it can `flock` exclusively. The lock's descriptor is passed on to the service, so the
key stays taken exactly as long as the replica's process lives, a crash included; a restarted
replica takes a free key again. Standard library only: it runs before the service's own
environment matters.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import sys
from pathlib import Path

KEY_NAME = re.compile(r"^worker-key-(\d+)\.json$")


class NoFreeKey(RuntimeError):
    pass


def key_files(keys_dir: Path) -> list[Path]:
    """The pool's keys, in index order."""
    found = [(int(m.group(1)), p) for p in keys_dir.iterdir() if (m := KEY_NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def claim(keys_dir: Path, locks_dir: Path) -> tuple[Path, int]:
    """The first key no live process holds, and the open descriptor that holds it now."""
    keys = key_files(keys_dir)
    if not keys:
        raise NoFreeKey(f"no worker-key-<i>.json in {keys_dir}")
    locks_dir.mkdir(parents=True, exist_ok=True)
    for key in keys:
        fd = os.open(locks_dir / f"{key.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return key, fd
    raise NoFreeKey(
        f"all {len(keys)} worker keys are taken by running replicas: create more with "
        "`prime-swarm compose-secrets --workers N` and mount them in docker-compose.yml"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prime-claim-key", description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=Path, default=Path("/run/secrets"), help="the key pool")
    p.add_argument("--locks", type=Path, default=Path("/data/claims"), help="shared lock dir")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the service's command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the service's command after --")
    try:
        key, fd = claim(args.keys, args.locks)
    except (NoFreeKey, OSError) as exc:
        print(f"prime-claim-key: {exc}", file=sys.stderr)
        return 3
    os.set_inheritable(fd, True)  # the lock lives as long as the service's process
    os.environ["PRIME_WORKER_KEY_FILE"] = str(key)
    print(f"prime-claim-key: {key.name}", file=sys.stderr, flush=True)
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
