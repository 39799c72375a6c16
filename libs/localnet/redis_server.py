"""A real redis-server on a free loopback port, with AOF persistence as in deployments."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import redis

from .ports import free_port
from .process import ManagedProcess


class RedisServer:
    def __init__(
        self,
        data_dir: Path,
        log_dir: Path,
        port: int | None = None,
        acl_file: Path | None = None,
        *,
        bind: str = "127.0.0.1",
        argv_prefix: Sequence[str] = (),
        address: tuple[str, int] | None = None,
        name: str = "redis",
        config: Sequence[str] = (),
    ) -> None:
        """`config`: lines of a config file written at the first start and kept across
        restarts (Sentinel rewrites it when it turns a primary into a replica: a restarted node
        must come back as what it was made, not as what its first command line said).
        `acl_file`: users as in deployments (deploy/redis_acl.py); `url` then authenticates
        as nobody, and a client logs in with `redis://user:password@...`. `argv_prefix` starts
        it elsewhere (`ip netns exec NS`: a host of a testbed), bound to `bind`; `address` is
        then where others reach it (the testbed's route to it)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found; run `make setup` (installs it)")
        self.port = port or free_port()
        self.host, self.public_port = address or ("127.0.0.1", self.port)
        self.url = f"redis://{self.host}:{self.public_port}/0"
        data_dir.mkdir(parents=True, exist_ok=True)
        config_file = data_dir / "redis.conf"
        if not config_file.exists():
            config_file.write_text("".join(line + "\n" for line in config))
        self.process = ManagedProcess(
            name,
            [
                *argv_prefix,
                binary,
                str(config_file.resolve()),
                "--port",
                str(self.port),
                "--bind",
                bind,
                "--dir",
                # Absolute: Redis chdirs to it, and a rewritten config file names it again.
                str(data_dir.resolve()),
                "--appendonly",
                "yes",
                "--save",
                "",
                # Protected mode refuses every client not on loopback while `default` has no
                # password: placed on a testbed host (a namespace reached only through the
                # testbed's links), the others are not on its loopback.
                "--protected-mode",
                "yes" if bind == "127.0.0.1" else "no",
                *(["--aclfile", str(Path(acl_file).resolve())] if acl_file else []),
            ],
            log_dir,
        )
        self.process.wait_until(self._ping, 15.0, "answering PING")

    def _ping(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
        except redis.AuthenticationError:
            return True  # up, and refusing the default user as its ACL file says

    def crash_and_restart(self) -> None:
        """SIGKILL, then the same server on the same port and directory: it replays its AOF."""
        self.process.kill()
        self.process = self.process.respawn()
        self.process.wait_until(self._ping, 30.0, "answering PING after a restart")

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=10)

    def stop(self) -> None:
        self.process.stop()
