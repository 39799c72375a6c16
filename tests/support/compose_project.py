"""docker-compose.yml run as a user runs it, for tests/compose: one project of the test's own (its
own networks and volumes, published ports on 127.0.0.1 only), driven through the docker and
docker-compose command lines, every call bounded by a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class ComposeProject:
    def __init__(self, name: str, root: Path, files: Sequence[str], env: dict[str, str]) -> None:
        self.name, self.root = name, root
        self.files = [f for file in files for f in ("-f", file)]
        self.env = {**os.environ, **env}

    def compose(self, *argv: str, timeout: float = 120) -> str:
        """One docker-compose command on this project; its stdout."""
        out = subprocess.run(
            ["docker-compose", "-p", self.name, *self.files, *argv],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(argv)}: {out.stderr.strip()[-2000:]}")
        return out.stdout

    def containers(self, service: str) -> list[str]:
        """Ids of the service's containers, stopped ones included, in a stable order."""
        return sorted(self.compose("ps", "-q", service).split())

    def inspect(self, container: str) -> dict:
        out = docker("inspect", container)
        return json.loads(out)[0]

    def ip(self, container: str, network: str) -> str:
        """The container's address on one of this project's networks (`backend`, `public`)."""
        nets = self.inspect(container)["NetworkSettings"]["Networks"]
        return nets[f"{self.name}_{network}"]["IPAddress"]

    def running(self, container: str) -> tuple[bool, int]:
        """(running, restart count)."""
        info = self.inspect(container)
        return info["State"]["Running"], info["RestartCount"]

    def crash(self, container: str) -> None:
        """SIGKILL the container's main process from the host, as the kernel's OOM killer does.
        Not `docker kill`: Docker counts that as a manual stop and its restart policy ignores
        it (engine 20.10 here: RestartCount stayed 0 under always, unless-stopped and
        on-failure), so a crash is the fault a restart policy answers."""
        os.kill(self.inspect(container)["State"]["Pid"], signal.SIGKILL)

    def hang_then_crash(self, container: str, until: Callable[[], T | None], timeout_s: float) -> T:
        """A machine that hangs, then is rebooted: frozen (`docker pause`: it answers nothing
        and writes nothing, its peers' connections stay open) until `until()` returns something
        (the others have taken over: what is returned), then SIGKILLed (`crash`) and thawed,
        so the restart policy starts it again. A crash alone is back within a second, before a
        Redis failover could begin; and a container stopped for longer loses its DNS name, which
        an engine that forwards unknown names out of an internal network answers only after a
        timeout (docker-compose.ha.yml's x-fast-dns)."""
        docker("pause", container)
        try:
            return wait_for("the others taking over", until, timeout_s, every_s=0.2)
        finally:
            self.crash(container)
            docker("unpause", container)

    def healthy(self, container: str) -> bool:
        """Running and passing its compose healthcheck."""
        state = self.inspect(container)["State"]
        return state["Running"] and (state.get("Health") or {}).get("Status") == "healthy"

    def read_file(self, service: str, path: str) -> str:
        return self.compose("exec", "-T", service, "cat", path)

    def logs(self, tail: int = 300) -> str:
        try:
            return self.compose("logs", "--no-color", "--tail", str(tail), timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return f"(no logs: {exc})"


def docker(*argv: str, timeout: float = 60) -> str:
    out = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(argv)}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 2) -> T:
    """probe() until it returns something other than None (exceptions count as not yet)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            got = probe()
        except Exception as exc:  # noqa: BLE001 - a service restarting answers with anything
            last = exc
        else:
            if got is not None:
                return got
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s (last error: {last!r})")
