"""The contributor's live status line: one line at the bottom of the terminal, redrawn every
second, with log lines printed above it.

What a contributor wants to know at a glance: which policy it serves, what it is doing, how much
of its work was accepted (and why the rest was not), and what that earned. The orchestrator's
status API (`GET /v1/status/workers/{address}`) has the validator's verdicts; the chain has units
and rewards; both are polled every `refresh_s`, never per line drawn.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from prime_swarm.libs.chain.units import eth

CLEAR = "\r\x1b[2K"


@dataclass
class Snapshot:
    """What the line shows; the worker's threads update it in place."""

    version: int | None = None
    activity: str = "starting"
    leases: int = 0
    submitted: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    units: int = 0
    rewards_wei: int = 0


def render(s: Snapshot) -> str:
    rejected = sum(s.rejected.values())
    why = ", ".join(f"{reason} {n}" for reason, n in sorted(s.rejected.items()))
    parts = [
        f"policy v{s.version}" if s.version is not None else "no policy yet",
        s.activity,
        f"leases {s.leases}",
        f"submitted {s.submitted}",
        f"accepted {s.accepted}",
        f"rejected {rejected}" + (f" ({why})" if why else ""),
        f"units {s.units:,}",
        f"rewards {eth(s.rewards_wei)}",
    ]
    return " · ".join(parts)


class _AboveTheLine(logging.Handler):
    """Clears the status line, lets the real handler print, and draws the line again."""

    def __init__(self, inner: logging.Handler, line: StatusLine) -> None:
        super().__init__(inner.level)
        self.inner, self.line = inner, line

    def emit(self, record: logging.LogRecord) -> None:
        with self.line.lock:
            self.line.out.write(CLEAR)
            self.inner.emit(record)
            self.line.draw_locked()


class StatusLine:
    def __init__(
        self,
        snapshot: Snapshot,
        refresh: Callable[[Snapshot], None] | None = None,
        refresh_s: float = 10.0,
        out: TextIO | None = None,
    ) -> None:
        self.snapshot, self.refresh, self.refresh_s = snapshot, refresh, refresh_s
        self.out = out or sys.stderr
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-line", daemon=True)
        self._wrapped: list[tuple[logging.Handler, logging.Handler]] = []

    def draw_locked(self) -> None:
        width = shutil.get_terminal_size((120, 20)).columns
        self.out.write(CLEAR + render(self.snapshot)[: width - 1])
        self.out.flush()

    def start(self) -> None:
        root = logging.getLogger()
        for handler in list(root.handlers):
            wrapped = _AboveTheLine(handler, self)
            root.removeHandler(handler)
            root.addHandler(wrapped)
            self._wrapped.append((handler, wrapped))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        root = logging.getLogger()
        for handler, wrapped in self._wrapped:
            root.removeHandler(wrapped)
            root.addHandler(handler)
        with self.lock:
            self.out.write(CLEAR + render(self.snapshot) + "\n")
            self.out.flush()

    def _run(self) -> None:
        ticks = 0
        while not self._stop.wait(1.0 if ticks else 0.0):
            if self.refresh is not None and ticks % max(1, int(self.refresh_s)) == 0:
                try:
                    self.refresh(self.snapshot)
                except Exception as exc:  # a slow chain or orchestrator only delays the numbers
                    logging.getLogger("worker").debug("status refresh failed: %s", exc)
            ticks += 1
            with self.lock:
                self.draw_locked()
