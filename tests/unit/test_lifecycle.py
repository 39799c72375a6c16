"""Every stop signal means Ctrl-C: SIGTERM and SIGHUP raise KeyboardInterrupt where the
launcher's rule is installed, so its `finally` runs (in a child process: signals are
process-wide)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

PROGRAM = """
import os, signal, sys, time
from prime_swarm.libs.cli.lifecycle import interrupt_on_stop_signals
interrupt_on_stop_signals()
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt as exc:
    print("interrupted by", exc.args[0] if exc.args else "SIGINT", flush=True)
finally:
    print("cleaned up", flush=True)
"""


def started(program: str, hangup: signal.Handlers = signal.SIG_DFL) -> subprocess.Popen[str]:
    """`program` with SIGHUP as a terminal leaves it (default), whatever this run inherited (a
    test run under nohup ignores SIGHUP, and so would its children)."""
    return subprocess.Popen(
        [sys.executable, "-c", program],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, hangup),
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_run_the_ctrl_c_path(sig: signal.Signals) -> None:
    proc = started(PROGRAM)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert out.split("\n")[:2] == [f"interrupted by {sig.name}", "cleaned up"]
    assert proc.returncode == 0


def test_a_hangup_reaches_a_server_as_sigterm() -> None:
    """For uvicorn, which stops gracefully on SIGTERM and SIGINT only."""
    program = """
import signal, time
from prime_swarm.libs.cli.lifecycle import hangup_as_terminate
hangup_as_terminate()
signal.signal(signal.SIGTERM, lambda *_: (print("graceful stop", flush=True), exit(0)))
print("ready", flush=True)
time.sleep(60)
"""
    proc = started(program)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "graceful stop" and proc.returncode == 0


def test_under_nohup_a_hangup_stays_ignored() -> None:
    """`nohup` asked for the run to outlive its terminal; SIGTERM still stops it."""
    proc = started(PROGRAM, hangup=signal.SIG_IGN)  # what nohup does
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.split("\n")[:2] == ["interrupted by SIGTERM", "cleaned up"]
