"""The parent's side of a sandbox run: start the child interpreter on harness.py's program with
its limits, feed it its job, read its output with a cap, and kill and clean up after it. What a
run means (tests passed, a cell's output) is cases.py's and cells.py's to say.
"""

from __future__ import annotations

import ast
import functools
import marshal
import os
import resource
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from prime_swarm.libs.environments.sandbox.harness import PAYLOAD_NAME, RESULT_MARKER
from prime_swarm.libs.environments.sandbox.interpreter import sandbox_interpreter

Reason = Literal["ok", "timeout", "memory", "error", "forbidden", "output_limit"]


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 2
    memory_bytes: int = 256 << 20  # address space; the bare interpreter needs ~20 MiB of it
    file_bytes: int = 1 << 20  # largest file the code may write
    max_files: int = 32  # files opened for writing plus directories made
    output_bytes: int = 64 << 10  # stdout + stderr, the report included
    max_source_chars: int = 64 << 10


@functools.cache
def _harness() -> str:
    # Read on first use rather than at import, so that importing the envs never depends on the
    # harness's source being present. It is a module of this package, so it ships with it.
    return resources.files(__package__).joinpath("harness.py").read_text(encoding="utf-8")


def _command(workdir: str) -> list[str]:
    return [
        sandbox_interpreter().path,
        "-s",
        "-P",
        "-S",
        "-B",
        "-X",
        "utf8",  # stdout encoding independent of the (near empty) environment
        # No stdlib .pyc is ever found, so imports compile from source and the hook can refuse
        # every marshal.loads: loading crafted bytecode is a classic way around audit hooks.
        "-X",
        f"pycache_prefix={workdir}/.no-pycache",
        "-c",
        _harness(),  # the whole module: its `__main__` block starts the job
    ]


# The child's whole environment. Nothing of the caller's (no credentials); the hash seed fixed so
# that str hashes, and with them set order, are the same on every run and every machine.
CHILD_ENV = {"PYTHONHASHSEED": "0"}


def _limit_setter(limits: Limits) -> Callable[[], None]:
    """The preexec_fn that applies the rlimits in the child between fork and exec.

    CPython warns that preexec_fn can deadlock the child when the parent has other threads (the
    worker and validator do), because Python code then runs in a forked copy of a process whose
    locks other threads may hold. That is acceptable here because the function is reduced to
    calls of the C builtin `resource.setrlimit` with integers computed beforehand: no import,
    no logging, no I/O, no lock. Setting the limits here rather than in the child's own code
    means they already bind the interpreter's startup, and no untrusted code ever runs without
    them; a `prlimit` wrapper process would do the same with an extra dependency.
    """
    wanted = {
        resource.RLIMIT_CPU: (limits.cpu_s, limits.cpu_s + 1),  # soft: SIGXCPU; hard: SIGKILL
        resource.RLIMIT_AS: (limits.memory_bytes, limits.memory_bytes),
        resource.RLIMIT_FSIZE: (limits.file_bytes, limits.file_bytes),
        resource.RLIMIT_NOFILE: (64, 64),
        resource.RLIMIT_NPROC: (0, 0),
        resource.RLIMIT_CORE: (0, 0),
    }
    settings = []
    for which, (soft, hard) in wanted.items():
        # Never above the current hard limit: raising it needs privileges and would fail.
        _, current = resource.getrlimit(which)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        settings.append((which, (soft, hard)))
    setrlimit = resource.setrlimit

    def apply() -> None:
        for which, value in settings:
            setrlimit(which, value)

    return apply


@dataclass
class Run:
    """How a child ended: its exit status (None when it could not start), its output, and
    whether the parent killed it."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    killed_for: Literal["timeout", "output_limit"] | None = None


def _exited(pid: int, deadline: float) -> bool:
    """Wait for `pid` to exit without reaping it, so its process group can still be killed."""
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def _run_child(cmd: list[str], workdir: str, limits: Limits) -> Run:
    deadline = time.monotonic() + limits.wall_s
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=CHILD_ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_limit_setter(limits),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Run(None, b"", f"could not start the sandbox: {exc}".encode())
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    killed_for: Literal["timeout", "output_limit"] | None = None
    try:
        size = 0
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            sel.register(proc.stderr, selectors.EVENT_READ)
            while sel.get_map() and killed_for is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed_for = "timeout"
                    break
                for key, _ in sel.select(remaining):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    chunks[key.fd].append(data)
                    size += len(data)
                    if size > limits.output_bytes:
                        killed_for = "output_limit"
                        break
        if killed_for is None and not _exited(proc.pid, deadline):
            killed_for = "timeout"  # closed its output but kept running
    finally:
        # Always, and before reaping: the group then still exists even if the child is a
        # zombie, and anything it might have started goes with it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return Run(proc.returncode, b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), killed_for)


def report_value(stdout: bytes) -> Any:
    """The literal on the child's last report line, or None when there is none or it does not
    parse (the child's stdout is the untrusted code's too)."""
    start = stdout.rfind(b"\n" + RESULT_MARKER.encode())
    if start < 0:
        return None
    line = stdout[start + 1 + len(RESULT_MARKER) :].split(b"\n", 1)[0]
    try:
        return ast.literal_eval(line.decode("ascii"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeDecodeError):
        return None


def _remove(workdir: str) -> None:
    # The code may have left directories it cannot list (os.mkdir's mode, a umask), which a
    # non-root caller could then not delete: give them back to the owner first. The walk goes
    # top-down, so each directory is opened up before it is entered.
    for root, dirs, _ in os.walk(workdir):
        for d in dirs:
            path = os.path.join(root, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(workdir, ignore_errors=True)


def run_job(mode: str, job: tuple[Any, ...], limits: Limits) -> tuple[Run, str]:
    """Run the harness on `job` in a fresh temp dir; the run and that (removed) dir's path."""
    payload = marshal.dumps((mode, limits.max_files, job))
    workdir = tempfile.mkdtemp(prefix="prime-sandbox-")
    try:
        with open(os.path.join(workdir, PAYLOAD_NAME), "wb") as fh:
            fh.write(payload)
        return _run_child(_command(workdir), workdir, limits), workdir
    finally:
        _remove(workdir)
