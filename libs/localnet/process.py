"""A child process with its own log file, a readiness wait with a deadline, and a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from prime_swarm.libs.cli.lifecycle import die_with_parent


class ProcessFailed(RuntimeError):
    pass


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name, self.argv, self.env, self.cwd = name, argv, env, cwd
        self.log_path = Path(log_dir) / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        full_env = {**os.environ, **(env or {})}
        # Each process gets its own session so a stop reaches its children too; and it stops
        # (SIGTERM) when this process dies, even by SIGKILL, which no `finally` survives.
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float | None:
        """User + system CPU time the process has used so far (Linux /proc), None if gone.

        Where a run's CPU goes, per service: the figure the trainer benchmark reports."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        # Fields 14 and 15 of stat(5) (utime, stime), counted after the ") state" split.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # Readiness first: a process that finished its work and exited (a trainer at its
            # last step) has still done what was waited for.
            alive = self.alive()
            try:
                if ready():
                    return
            except Exception:  # not up yet: connection refused and the like
                pass
            if not alive:
                raise ProcessFailed(
                    f"{self.name} exited with {self.proc.returncode} before {what}:\n{self.tail()}"
                )
            time.sleep(0.1)
        raise ProcessFailed(f"{self.name} not {what} after {timeout_s:.0f}s:\n{self.tail()}")

    def wait_http(self, url: str, timeout_s: float = 30.0) -> None:
        self.wait_until(
            lambda: httpx.get(url, timeout=1.0).status_code == 200, timeout_s, f"serving {url}"
        )

    def kill(self) -> None:
        """SIGKILL, no chance to clean up: how a crashed machine looks to its peers."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(5)

    def respawn(self) -> ManagedProcess:
        """The same command started again (its log appended to): a supervisor's restart."""
        self.stop()
        return ManagedProcess(self.name, self.argv, self.log_path.parent, self.env, self.cwd)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self._log.closed:
            return self.proc.returncode
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode
