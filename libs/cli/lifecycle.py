"""How every program stops: one rule for every `prime-*` program and the processes it starts.

A process is asked to stop in three ways, and all three mean what Ctrl-C means: SIGINT (Ctrl-C),
SIGTERM (`docker stop`, `compose down`, supervisors, `timeout`, a launcher stopping its
children) and SIGHUP (the terminal it ran in was closed; unless started under `nohup`, which
asked for the opposite). Python's defaults end a program at once on the last two, with no
`finally` run: a launcher killed that way left its whole network running.
`interrupt_on_stop_signals` makes both raise KeyboardInterrupt, for programs whose Ctrl-C path
already cleans up; `on_stop_signals` installs one handler for all three, for programs that
finish what they hold first (a worker's batch, a validator's queued attestations);
`on_termination` the last two only (the trainer exits between steps).

A launcher can still be killed with SIGKILL, which no handler sees. `die_with_parent` is run in
each child it starts (Popen's `preexec_fn`): Linux then sends the child SIGTERM when the thread
that started it exits, so the children stop through their own SIGTERM path.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

Handler = Callable[[int, FrameType | None], object]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _hangup_ignored() -> bool:
    """Started under `nohup` (SIGHUP ignored, as it stays across exec): a closed terminal must
    not stop what its user asked to outlive it."""
    return signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def on_termination(handler: Handler) -> None:
    """`handler` for SIGTERM and SIGHUP (from the main thread); SIGHUP stays ignored where it
    was (`nohup`). Ctrl-C keeps Python's KeyboardInterrupt."""
    signal.signal(signal.SIGTERM, handler)
    if not _hangup_ignored():
        signal.signal(signal.SIGHUP, handler)


def on_stop_signals(handler: Handler) -> None:
    """`handler` for Ctrl-C, SIGTERM and SIGHUP alike (SIGHUP as in `on_termination`)."""
    signal.signal(signal.SIGINT, handler)
    on_termination(handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def interrupt_on_stop_signals() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does."""
    on_stop_signals(_interrupt)


def hangup_as_terminate() -> None:
    """SIGHUP sent on as SIGTERM to this process, for a server whose framework stops gracefully
    on SIGTERM and SIGINT only (uvicorn); left ignored under `nohup`."""
    if not _hangup_ignored():
        signal.signal(signal.SIGHUP, lambda *_: os.kill(os.getpid(), signal.SIGTERM))


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(parent: int | None = None) -> Callable[[], None] | None:
    """A `preexec_fn` that asks Linux for SIGTERM when the starting thread exits (None off
    Linux). `parent`: the starter's pid, read now; a child whose parent is already gone by the
    time it runs (the race prctl leaves) stops at once."""
    if _LIBC is None:
        return None
    expected = os.getpid() if parent is None else parent

    def preexec() -> None:
        # Runs in the child between fork and exec: only the async-signal-safe prctl and getppid.
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != expected:
            os._exit(1)

    return preexec
