"""ManagedProcess.wait_until: done is done, even when the process has already exited."""

import sys
from pathlib import Path

import pytest

from prime_swarm.libs.localnet.process import ManagedProcess, ProcessFailed


def _run(tmp_path: Path, code: str) -> ManagedProcess:
    return ManagedProcess("child", [sys.executable, "-c", code], tmp_path / "logs")


def test_a_process_that_finished_its_work_and_exited_is_ready(tmp_path: Path) -> None:
    marker = tmp_path / "saved"
    proc = _run(tmp_path, f"open({str(marker)!r}, 'w').close()")
    proc.proc.wait(30)  # exited before anyone asked
    try:
        proc.wait_until(marker.exists, 10, "saving")
    finally:
        proc.stop()


def test_a_process_that_exited_without_the_work_fails_fast(tmp_path: Path) -> None:
    proc = _run(tmp_path, "print('giving up'); raise SystemExit(3)")
    try:
        with pytest.raises(ProcessFailed, match="exited with 3 before saving"):
            proc.wait_until((tmp_path / "never").exists, 30, "saving")
    finally:
        proc.stop()
