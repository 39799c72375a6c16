"""A `prime-relay` process (origin or relay mode) on a free loopback port."""

from __future__ import annotations

import sys
from pathlib import Path

from .ports import free_port
from .process import ManagedProcess


class RelayProcess(ManagedProcess):
    """`args` starts with the mode (`origin` | `relay`); port and data dir are filled in.

    Logs go to `<log_dir>/<data dir name>.log` (log_dir defaults to the data dir's parent).
    """

    def __init__(self, args: list[str], data_dir: Path, log_dir: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = Path(data_dir)
        mode, *rest = args
        argv = [
            sys.executable,
            "-m",
            "prime_swarm.services.relay",
            mode,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *rest,
        ]
        super().__init__(self.data_dir.name, argv, log_dir or self.data_dir.parent)

    def wait_healthy(self, timeout_s: float = 20.0) -> RelayProcess:
        self.wait_http(f"{self.url}/healthz", timeout_s)
        return self
