"""Run untrusted Python in a resource-limited, audited subprocess: against tests (`run_tests`), or
as a persistent REPL's cells (`run_cells`, the tool of the multi-turn environments).

The code to run is a model's completion, and a validator runs completions that untrusted workers
submitted, so it is hostile input. The guards, from the kernel up:

- rlimits set between fork and exec: CPU seconds, address space, file size, open files, no core
  files, no processes (RLIMIT_NPROC binds only non-root users: as root it does nothing, and the
  audit hook below is what refuses forks);
- a new session, so the whole process group is SIGKILLed on timeout or output flood, plus a wall
  clock limit for code that sleeps or blocks rather than spins;
- a fresh 0700 temporary directory as cwd, deleted afterwards; an environment of its own (nothing
  of the caller's, no credentials); stdin is /dev/null; stdout and stderr are read with a size cap;
- `python -s -P -S -B` in an environment holding PYTHONHASHSEED=0 alone (`-I` less its `-E`,
  which would ignore that seed): no other PYTHON* variables, no user site, no cwd on sys.path (so
  files the code writes cannot shadow stdlib modules), no `site` (so no site-packages, no .pth
  hooks, no venv packages; also no `exit()`/`quit()` builtins, which a solution calling them pays
  for with a NameError), and no .pyc writes. With no site-packages the child runs the harness's
  source alone (`_HARNESS`), using builtin modules and the stdlib only. The fixed hash seed makes
  set and dict-of-str order the same on every run, so a worker and a validator see one result;
- in the child, before the code runs, an audit hook (`sys.addaudithook`, which cannot be removed)
  that kills the process on: sockets, process creation, signals to other processes, ctypes,
  subinterpreters, bytecode loading, writes outside the temp dir, reads outside the temp dir and
  the stdlib, non-regular files (device nodes, FIFOs), symlinks, and importing native modules
  that open those doors. Unaudited functions with the same powers (`os.pidfd_open`, `os.mknod`,
  ...) are deleted from their modules, and so is `_imp.create_builtin`, which could re-create
  them;
- the child never sees the expected outputs: it reports what the function returned, and the
  parent compares. A child that forges its report still has to produce the right answers. A
  cell's report is its own output anyway: forging it changes only what the code itself shows.

What this is not: a security boundary against native code execution. CPython documents audit
hooks as unsuitable for sandboxing on their own, and a memory-corruption bug in the interpreter
would bypass them. The kernel-enforced parts (rlimits, process group, wall clock, output cap)
hold regardless; for hostile input at scale run the caller as an unprivileged user and add a
namespace or seccomp layer (nsjail, bubblewrap, gVisor) around this.
"""

from __future__ import annotations

import ast
import functools
import inspect
import marshal
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Reason = Literal["ok", "timeout", "memory", "error", "forbidden", "output_limit"]

FORBIDDEN_EXIT = 86  # the child's exit status when its audit hook refused something
MEMORY_EXIT = 87  # ... and when the code ran out of memory
OUTPUT_EXIT = 88  # ... and when one cell wrote more than `Limits.output_bytes` chars
EXITS = (FORBIDDEN_EXIT, MEMORY_EXIT, OUTPUT_EXIT)
PAYLOAD_NAME = "payload.marshal"
RESULT_MARKER = "\x1esandbox-result:"  # starts the child's report line on stdout
CELL_MARKER = "\x1esandbox-cell:"  # the cells harness writes it, and the index, before each cell
MARKERS = (RESULT_MARKER, CELL_MARKER)


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 2
    memory_bytes: int = 256 << 20  # address space; the bare interpreter needs ~20 MiB of it
    file_bytes: int = 1 << 20  # largest file the code may write
    max_files: int = 32  # files opened for writing plus directories made
    output_bytes: int = 64 << 10  # stdout + stderr, the report included
    max_source_chars: int = 64 << 10


@dataclass(frozen=True)
class Case:
    args: tuple[Any, ...]  # plain data: None, bool, int, float, str, bytes, list, tuple, dict
    expected: Any


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # the code ran cleanly and every test passed
    tests_passed: int
    tests_total: int
    reason: Reason  # how the run ended; "ok" means it ran to the end, passed or not
    duration_s: float
    detail: str = ""  # the tail of the child's stderr, for debugging


def _child_main(payload: str, exits: tuple[int, int, int], markers: tuple[str, str]) -> None:
    """The child's whole program: load the payload, arm the guards, run the job, report.

    Shipped to the child as source with the functions it calls (`_HARNESS`), so they must be
    self-contained and use builtin modules (and, for cells, the stdlib) only. The job's function
    is looked up before any untrusted code runs, and each binds what it needs after that as a
    local, so monkeypatching a module or a global cannot change how the job ends.
    """
    import marshal
    import posix

    # Read before the guards are armed: they refuse every marshal.loads. Removed, so that the
    # code finds its directory empty (and a REPL's `os.listdir()` the same on every run).
    with open(payload, "rb") as fh:
        mode, max_files, job = marshal.loads(fh.read())
    posix.unlink(payload)
    if mode == "cells":
        _fix_nondeterminism()
    _arm_guards(max_files, exits[0])
    if mode == "tests":
        _call_entry(*job, exits[1], markers[0])
    else:
        _run_cells(*job, exits, markers)


def _fix_nondeterminism() -> None:
    """What a REPL's output would otherwise owe to chance: the cells of an episode run again on
    a validator, which must see the very same output. Threads race to write; `random` seeds
    itself from the OS at import. (The hash seed is fixed by the parent.) Clocks, pids, `id()`
    and os.urandom stay as they are: code that prints them gets output no one can reproduce."""
    import _thread
    import random

    random.seed(0)

    def no_threads(*args, **kwargs):
        raise RuntimeError("threads are not available in the sandbox")

    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        if hasattr(_thread, name):
            setattr(_thread, name, no_threads)


def _arm_guards(max_files: int, forbidden_exit: int) -> None:
    """Delete the unaudited functions that could escape and install the audit hook (see the
    module's docstring). Everything the hook relies on is bound as a default argument, so that
    monkeypatching builtins or modules cannot change what it does, and the state it keeps is
    immutable (tuples, frozensets, an itertools.count that only goes up)."""
    import itertools
    import posix
    import sys

    write, exit_ = posix.write, posix._exit
    sandbox = posix.getcwd() + "/"
    # Under -S, sys.path is the stdlib alone (zip, lib, lib-dynload).
    stdlib = tuple(posix._path_normpath(p) + "/" for p in sys.path if p.startswith("/"))
    readable = (sandbox, *stdlib)
    # The stdlib directory holds site-packages, which -S keeps off sys.path: keep it unreadable
    # too, or the code could put it back and import whatever is installed there.
    packages = tuple(root + sub for root in stdlib for sub in ("site-packages/", "dist-packages/"))

    # Builtin modules are imported now because `_imp.create_builtin` goes next: it would re-create
    # posix and _signal with the functions deleted below.
    for name in sys.builtin_module_names:
        __import__(name)
    unaudited = {
        # pidfd_open + pidfd_send_signal could kill the caller; mknod/mkfifo make special files
        # anywhere; the sched_*/setpriority ones reach other processes.
        posix: "mknod mkfifo pidfd_open setpriority sched_setaffinity sched_setscheduler"
        " sched_setparam setns unshare".split(),
        sys.modules["_signal"]: ["pidfd_send_signal"],
        sys.modules["_imp"]: ["create_builtin"],
    }
    for module, names in unaudited.items():
        for name in names:
            if hasattr(module, name):
                delattr(module, name)

    def hook(
        event,
        args,
        sandbox=(sandbox,),
        readable=readable,
        stdlib=stdlib,
        packages=packages,
        created=itertools.count(),
        max_files=max_files,
        type=type,
        str=str,
        bytes=bytes,
        int=int,
        next=next,
        errors=(OSError, ValueError),
        lstat=posix.lstat,
        normpath=posix._path_normpath,
        write=write,
        exit_=exit_,
        forbidden_exit=forbidden_exit,
        writing=posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND,
        denied=frozenset(
            "os.system os.exec os.posix_spawn os.spawn os.fork os.forkpty subprocess.Popen"
            " os.kill os.killpg signal.pthread_kill os.symlink os.link os.chdir os.chflags"
            " os.chmod os.chown"
            " os.lchflags os.lockf os.getxattr os.listxattr os.setxattr os.removexattr"
            " os.startfile resource.setrlimit resource.prlimit sys.addaudithook sys.settrace"
            " sys.setprofile gc.get_objects gc.get_referrers gc.get_referents code.__new__"
            " marshal.load marshal.loads cpython.PyInterpreterState_New cpython.run_command"
            " cpython.run_file cpython.run_module cpython.run_startup cpython.run_stdin"
            " builtins.input builtins.breakpoint webbrowser.open urllib.Request".split()
        ),
        denied_prefixes=("socket.", "ctypes.", "sqlite3.", "syslog.", "fcntl.", "mmap."),
        denied_modules=frozenset(
            "_ctypes ctypes _ctypes_test _posixsubprocess subprocess _socket socket _ssl ssl"
            " select selectors asyncio _asyncio _multiprocessing multiprocessing _posixshmem"
            " concurrent _sqlite3 sqlite3 readline _curses _curses_panel curses _tkinter"
            " tkinter _xxsubinterpreters _xxinterpchannels _testcapi _testinternalcapi"
            " _testbuffer _testmultiphase _testimportmultiple _testclinic _xxtestfuzz"
            " xxlimited xxlimited_35 mmap fcntl termios resource syslog pty _dbm _gdbm dbm nis"
            " ossaudiodev spwd _crypt".split()
        ),
    ):
        # Everything the hook uses is a parameter bound above, and all of it is immutable (an
        # itertools.count only goes up), so that neither monkeypatching nor a frame of this
        # function (which an exception inside it would expose) can change what it checks. It
        # checks types before touching a value, so no code of the solution's (a str subclass's
        # __eq__, an int's __and__) ever runs inside it.
        ok = True
        checks = []  # (path, roots): each path must resolve under one of its roots
        counted = False  # creates a file or directory, which counts against max_files
        if event in denied or event.startswith(denied_prefixes):
            ok = False
        elif event == "open":
            path, mode, flags = args
            if mode is None or type(flags) is not int:
                # os.open: its dir_fd is not part of the event, so the path could not be checked.
                ok = False
            elif flags & writing:
                checks.append((path, sandbox))
                counted = True
            else:
                checks.append((path, readable))
        elif event in ("os.listdir", "os.scandir"):
            if args[0] is not None:
                checks.append((args[0], readable))
        elif event == "import":
            name, filename = args[0], args[1]
            ok = type(name) is str and denied_modules.isdisjoint(name.split("."))
            if filename is not None:  # native code loads from the stdlib only
                checks.append((filename, stdlib))
        else:
            # Events that modify paths: (path positions, dir_fd positions). A dir_fd would make
            # a relative path mean something else than it seems, so it must be None.
            where = {
                "os.remove": ((0,), (1,)),
                "os.rmdir": ((0,), (1,)),
                "os.mkdir": ((0,), (2,)),
                "os.utime": ((0,), (3,)),
                "os.truncate": ((0,), ()),
                "os.rename": ((0, 1), (2, 3)),
            }.get(event)
            if where is not None:
                for i in where[0]:
                    checks.append((args[i], sandbox))
                for i in where[1]:
                    # The event reports "no dir_fd" as -1 (None in a few versions).
                    ok = ok and (args[i] is None or type(args[i]) is int and args[i] == -1)
                counted = event == "os.mkdir"
        for path, roots in checks:
            # Only a plain str/bytes: an fd cannot be checked, and a PathLike's __fspath__ could
            # answer differently when the operation itself asks.
            if type(path) is bytes:
                path = path.decode("utf-8", "surrogateescape")
            if type(path) is not str:
                ok = False
                break
            # Lexical normalisation is exact in the temp dir, where no symlink can be made; the
            # lstat below also refuses a symlink as the last component anywhere.
            path = normpath(path if path.startswith("/") else sandbox[0] + path)
            slashed = path + "/"  # so that a root matches itself and what lies below it
            if not slashed.startswith(roots) or slashed.startswith(packages):
                ok = False
                break
            try:
                kind = lstat(path).st_mode & 0o170000
            except errors:
                continue  # not there (yet): creating a regular file is fine
            if kind != 0o100000 and kind != 0o040000:  # regular files and directories only
                ok = False
                break
        if ok and counted:
            ok = next(created) < max_files
        if not ok:
            what = event
            for arg in args[:2]:
                if type(arg) is str:  # a path or module name says what was tried
                    what = what + " " + arg[:200]
            write(2, b"\nsandbox: refused " + what.encode("utf-8", "replace") + b"\n")
            exit_(forbidden_exit)

    sys.addaudithook(hook)


def _call_entry(source: str, entry: str, calls: list, memory_exit: int, marker: str) -> None:
    """`run_tests`' job: define `source`, call `entry` on each argument tuple, report outcomes."""
    import builtins
    import posix

    write, exit_ = posix.write, posix._exit

    def plain(value, depth=0, type=type, exact=(type(None), bool, int, float, str, bytes)):
        # Exact builtin types only: their repr cannot be overridden, so the report shows what
        # was returned. Anything else is reported as unrepresentable and fails its test.
        if type(value) in exact:
            return True
        if depth > 20:
            return False
        if type(value) in (list, tuple):
            return all(plain(v, depth + 1) for v in value)
        if type(value) is dict:
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
        return False

    outcomes = []
    try:
        namespace = {"__name__": "__solution__", "__builtins__": builtins}
        try:
            exec(compile(source, "<solution>", "exec"), namespace)
            fn = namespace[entry]
        except MemoryError:
            exit_(memory_exit)
        except BaseException as exc:  # noqa: BLE001 - SyntaxError, SystemExit, no `entry`...
            write(2, ("\nsandbox: the source failed to load: " + ascii(exc)[:200]).encode())
            exit_(1)
        else:
            for args in calls:
                try:
                    value = fn(*args)
                except MemoryError:
                    exit_(memory_exit)
                except BaseException as exc:  # noqa: BLE001 - SystemExit too: one test fails
                    outcomes.append(("raise", type(exc).__name__))
                    continue
                try:
                    outcomes.append(("ok", value) if plain(value) else ("unrepresentable", None))
                except RecursionError:
                    outcomes.append(("unrepresentable", None))
        # ascii(), not repr(): lone surrogates and the like stay escapes, so the line is ASCII.
        data = memoryview(("\n" + marker + ascii(outcomes) + "\n").encode("ascii"))
    except MemoryError:
        exit_(memory_exit)
    while data:
        data = data[write(1, data) :]
    # Straight out: no atexit handlers, finalizers or unflushed prints of the solution's.
    exit_(0)


def _run_cells(
    cells: list, keep_chars: int, flood_chars: int, exits: tuple, markers: tuple
) -> None:
    """`run_cells`' job: run (name, source) cells in one namespace, the way a REPL runs what is
    typed into it, and report the last cell's output.

    Every cell runs exactly the same way whichever position it has (its final bare expression
    echoed, its exception rendered, its output counted against the flood limit), so that
    replaying the earlier cells of an episode rebuilds the very state they left the first time;
    only the last cell's output is kept (its first `keep_chars` chars). An exception ends its
    cell, not the run, as in a REPL. A cell that writes more than `flood_chars` chars ends the
    run with OUTPUT_EXIT. Before each cell the harness writes CELL_MARKER and the cell's index to
    its real stdout, so the parent knows which cell a killed run was in.
    """
    import _ast
    import builtins
    import posix
    import sys

    write, exit_, ascii_, isinstance_, str_ = posix.write, posix._exit, ascii, isinstance, str
    memory_exit, output_exit = exits[1], exits[2]
    result_marker, cell_marker = markers
    # Split as the compiler counts lines (splitlines() would also split at \f, \x1c, ...).
    lines = {name: source.split("\n") for name, source in cells}
    # written: chars the current cell wrote; kept: the last cell's first keep_chars chars.
    # Reachable from the code through sys.stdout's closure, which changes only its own output.
    state = {"written": 0, "keep": False, "kept": [], "kept_chars": 0}

    class Output:
        """sys.stdout and sys.stderr while the cells run (a notebook shows both as one)."""

        encoding = "utf-8"
        errors = "strict"

        def write(self, text):
            if not isinstance_(text, str_):
                raise TypeError("write() argument must be str, not " + type(text).__name__)
            text = str_.__str__(text)  # an exact str, whatever subclass came in
            state["written"] += len(text)
            if state["keep"] and state["kept_chars"] < keep_chars:
                piece = text[: keep_chars - state["kept_chars"]]
                state["kept"].append(piece)
                state["kept_chars"] += len(piece)
            if state["written"] > flood_chars:
                exit_(output_exit)
            return len(text)

        def flush(self):
            pass

        def isatty(self):
            return False

        def writable(self):
            return True

    out = Output()
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = out
    namespace = {"__name__": "__main__", "__builtins__": builtins}

    def frame_text(frame):
        name, lineno, function = frame
        text = f'  File "{name}", line {lineno}, in {function}\n'
        source = lines[name]
        if type(lineno) is int and 1 <= lineno <= len(source) and source[lineno - 1].strip():
            text += "    " + source[lineno - 1].strip() + "\n"
        return text

    def render(exc):
        # Like the REPL's traceback, without the harness's frames (or the stdlib's, whose paths
        # differ between machines): only frames of the cells, identical consecutive frames cut
        # after three as CPython does.
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename in lines:
                frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
        parts = ["Traceback (most recent call last):\n"] if frames else []
        previous, count = None, 0
        for frame in frames:
            if frame == previous:
                count += 1
            else:
                if count > 3:
                    parts.append(f"  [Previous line repeated {count - 3} more times]\n")
                previous, count = frame, 1
            if count <= 3:
                parts.append(frame_text(frame))
        if count > 3:
            parts.append(f"  [Previous line repeated {count - 3} more times]\n")
        kind = type(exc)
        label = kind.__qualname__
        if kind.__module__ not in ("__main__", "builtins"):
            label = f"{kind.__module__}.{label}"
        if isinstance_(exc, SyntaxError):
            parts.append(f'  File "{exc.filename}", line {exc.lineno}\n')
            text = exc.text
            if type(text) is str and text.strip():
                shown = text.rstrip("\n").lstrip()
                parts.append("    " + shown + "\n")
                if type(exc.offset) is int and exc.offset >= 1:
                    column = exc.offset - 1 - (len(text.rstrip("\n")) - len(shown))
                    parts.append("    " + " " * max(column, 0) + "^\n")
            message = str_(exc.msg)
        else:
            message = str_(exc)
        parts.append(f"{label}: {message}\n" if message else f"{label}\n")
        return "".join(parts)

    def run(name, source):
        """Run one cell; True if it raised."""
        try:
            tree = compile(source, name, "exec", _ast.PyCF_ONLY_AST)
            last = tree.body[-1] if tree.body else None
            if type(last) is _ast.Expr:
                tree.body = tree.body[:-1]
            exec(compile(tree, name, "exec"), namespace)
            if type(last) is _ast.Expr:
                value = eval(compile(_ast.Expression(body=last.value), name, "eval"), namespace)
                if value is not None:
                    out.write(repr(value) + "\n")
            return False
        except MemoryError:
            exit_(memory_exit)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: the REPL carries on
            try:
                out.write(render(exc))
            except MemoryError:
                exit_(memory_exit)
            except BaseException:  # noqa: BLE001 - a __str__ that raises, say
                out.write("Error: the exception could not be shown\n")
            return True

    raised = False
    for index, (name, source) in enumerate(cells):
        write(1, (cell_marker + str_(index) + "\n").encode())
        state["written"], state["keep"] = 0, index == len(cells) - 1
        raised = run(name, source)
    try:
        report = ("error" if raised else "ok", "".join(state["kept"]), state["written"])
        data = memoryview(("\n" + result_marker + ascii_(report) + "\n").encode("ascii"))
    except MemoryError:
        exit_(memory_exit)
    while data:
        data = data[write(1, data) :]
    exit_(0)


# The child's program: these functions' source, then a call of `_child_main` (see `_command`).
_HARNESS = (_child_main, _fix_nondeterminism, _arm_guards, _call_entry, _run_cells)


@functools.cache
def _harness() -> str:
    # Read on first use rather than at import, so that importing the envs never depends on this
    # file's source being present.
    return "\n\n".join(inspect.getsource(fn) for fn in _HARNESS)


def _command(workdir: str) -> list[str]:
    call = f"_child_main({PAYLOAD_NAME!r}, {EXITS!r}, {MARKERS!r})"
    return [
        sys.executable,
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
        f"{_harness()}\n{call}\n",
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
class _Run:
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


def _run_child(cmd: list[str], workdir: str, limits: Limits) -> _Run:
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
        return _Run(None, b"", f"could not start the sandbox: {exc}".encode())
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
    return _Run(proc.returncode, b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), killed_for)


def _same(actual: Any, expected: Any) -> bool:
    """Equality with exact types: `True` is not `1`, `(1, 2)` is not `[1, 2]`, `6.0` is not 6."""
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, list | tuple):
        return len(actual) == len(expected) and all(map(_same, actual, expected))
    if isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            _same(actual[k], expected[k]) for k in expected
        )
    return bool(actual == expected)


def _report_value(stdout: bytes) -> Any:
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


def _report(stdout: bytes, n: int) -> list[tuple[str, Any]] | None:
    """The child's outcomes, or None when the report is missing or malformed."""
    outcomes = _report_value(stdout)
    if (
        type(outcomes) is not list
        or len(outcomes) != n
        or any(type(o) is not tuple or len(o) != 2 for o in outcomes)
    ):
        return None
    return outcomes


def _score(run: _Run, cases: Sequence[Case]) -> tuple[Reason, int]:
    rc = run.returncode
    if run.killed_for is not None:
        return run.killed_for, 0
    if rc == FORBIDDEN_EXIT:
        return "forbidden", 0
    if rc == MEMORY_EXIT or (rc != 0 and b"MemoryError" in run.stderr):
        return "memory", 0
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit's soft and hard signals
        return "timeout", 0
    outcomes = _report(run.stdout, len(cases)) if rc == 0 else None
    if outcomes is None:
        return "error", 0
    try:
        passed = sum(
            kind == "ok" and _same(value, case.expected)
            for (kind, value), case in zip(outcomes, cases, strict=True)
        )
    except RecursionError:
        return "error", 0
    return "ok", passed


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


def _run_job(mode: str, job: tuple[Any, ...], limits: Limits) -> tuple[_Run, str]:
    """Run the harness on `job` in a fresh temp dir; the run and that (removed) dir's path."""
    payload = marshal.dumps((mode, limits.max_files, job))
    workdir = tempfile.mkdtemp(prefix="prime-sandbox-")
    try:
        with open(os.path.join(workdir, PAYLOAD_NAME), "wb") as fh:
            fh.write(payload)
        return _run_child(_command(workdir), workdir, limits), workdir
    finally:
        _remove(workdir)


def run_tests(
    source: str, entry: str, cases: Sequence[Case], limits: Limits | None = None
) -> SandboxResult:
    """Define `source` in a sandboxed interpreter and call `entry(*case.args)` for each case.

    Never raises for anything the source does; a failure to even start the child is an "error"
    result too. `case.args` must be marshal-able plain data (a ValueError otherwise).
    """
    limits = limits or Limits()
    start = time.monotonic()
    total = len(cases)
    if len(source) > limits.max_source_chars:
        return SandboxResult(False, 0, total, "error", 0.0, "source too long")
    run, _ = _run_job("tests", (source, entry, [tuple(c.args) for c in cases]), limits)
    reason, passed = _score(run, cases)
    return SandboxResult(
        passed=reason == "ok" and passed == total,
        tests_passed=passed,
        tests_total=total,
        reason=reason,
        duration_s=time.monotonic() - start,
        detail=run.stderr[-500:].decode("utf-8", "replace").strip(),
    )


@dataclass(frozen=True)
class CellResult:
    output: str
    """The last cell's stdout and stderr as one text, as a REPL shows them (a final bare
    expression's repr echoed, an exception as a traceback of the cells' own frames), at most
    `max_output_chars`; or, when the sandbox stopped the run, a fixed one-line message."""
    reason: Reason
    """"ok": the last cell ran to its end; "error": it raised (the traceback ends `output`), or
    the sandbox failed; "timeout", "memory", "forbidden", "output_limit": the sandbox stopped
    the run in cell `cell`."""
    cell: int
    """The cell `output` is about: `len(cells) - 1` unless an earlier cell stopped the run (its
    index in `cells`; -1 is `setup`). A caller keeping a REPL session can tell from it that the
    session died before its last cell."""
    duration_s: float
    detail: str = ""  # the tail of the child's stderr, for debugging; not deterministic


TRUNCATED = "\n[output truncated]\n"
# Kept beyond the shown cap before scrubbing, so that a temp-dir path or address that straddles
# the cap is still replaced whole (each replacement shortens the text).
_SCRUB_MARGIN = 1024
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stopped_message(reason: Reason, stderr: bytes) -> str:
    """The fixed text a run the sandbox stopped shows: what is left of its output depends on
    where the clock or the memory ran out, so none of it is shown."""
    if reason == "forbidden":
        # The hook's own line names the event and the path or module as the code wrote it.
        refused = stderr.rsplit(b"\nsandbox: refused ", 1)
        what = refused[1].split(b"\n", 1)[0].decode("utf-8", "replace") if len(refused) > 1 else ""
        return f"PermissionError: the sandbox refused {what or 'an operation'}\n"
    return {
        "timeout": "TimeoutError: the cell ran past its time limit\n",
        "memory": "MemoryError: the cell ran out of memory\n",
        "output_limit": "OutputLimitError: the cell wrote more output than the sandbox allows\n",
    }.get(reason, "SandboxError: the interpreter stopped without a report\n")


def _cells_report(stdout: bytes) -> tuple[Reason, str, int] | None:
    """The cells harness's (status, last cell's output, chars it wrote), or None when the report
    is missing or malformed."""
    report = _report_value(stdout)
    if type(report) is not tuple or len(report) != 3:
        return None
    status, text, written = report
    if status not in ("ok", "error") or type(text) is not str or type(written) is not int:
        return None
    return status, text, written


def _cells_outcome(run: _Run, n_cells: int) -> tuple[Reason, int, str, int]:
    """(reason, index of the cell the run ended in among `n_cells` counting setup as 0, the raw
    output, chars the last cell wrote) of a cells run."""
    rc = run.returncode
    reason: Reason | None = run.killed_for
    if reason is None:
        if rc == FORBIDDEN_EXIT:
            reason = "forbidden"
        elif rc == MEMORY_EXIT or (rc != 0 and b"MemoryError" in run.stderr):
            reason = "memory"
        elif rc == OUTPUT_EXIT:
            reason = "output_limit"
        elif rc in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit's soft and hard signals
            reason = "timeout"
    report = _cells_report(run.stdout) if reason is None and rc == 0 else None
    if report is not None:
        status, text, written = report
        return status, n_cells - 1, text, written
    # Stopped: the last marker the harness wrote says in which cell (none yet: in setup).
    marks = run.stdout.rsplit(CELL_MARKER.encode(), 1)
    digits = marks[1].split(b"\n", 1)[0] if len(marks) > 1 else b""
    cell = min(int(digits), n_cells - 1) if digits.isdigit() and len(digits) < 9 else 0
    reason = reason or "error"
    message = _stopped_message(reason, run.stderr)
    return reason, cell, message, len(message)


def _scrub(text: str, workdir: str) -> str:
    """`text` without what differs between two runs of the same cells: the temp dir's path (in
    any form the code may print it) and the addresses in default reprs (`<object at 0x...>`).
    Surrogates (from a lone one the code printed) become escapes, so the text encodes."""
    for path in sorted({os.path.realpath(workdir), workdir}, key=len, reverse=True):
        text = text.replace(path, "/sandbox")
    text = text.replace(os.path.basename(workdir), "sandbox")
    text = _ADDRESS.sub(" at 0x...", text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def run_cells(
    cells: Sequence[str],
    limits: Limits | None = None,
    setup: str = "",
    max_output_chars: int = 512,
) -> CellResult:
    """Run `setup`, then each of `cells` in order, in one fresh sandboxed interpreter sharing one
    namespace, and return what the last cell printed: a persistent Python REPL made stateless.

    A caller that keeps a REPL session across calls passes all of the session's cells each time:
    replaying them rebuilds the state, so the same cells give the same output on any machine and
    in any order of calls, which is what lets a validator check an episode's tool outputs. The
    cells are compiled as `<cell 1>`, `<cell 2>`, ... (setup as `<setup>`), so tracebacks name
    them and nothing of the harness; the temp dir's path reads `/sandbox`. Determinism covers
    what the code does deterministically: the hash seed and `random`'s seed are fixed and threads
    refused, but code that prints a clock, a pid, `id()`, os.urandom or the interpreter's own
    paths gets output that no one can reproduce; and a cell near its CPU or wall limit may time
    out on a slower machine.

    The limits bind the whole run (all the cells replayed), as in `run_tests`; each cell may
    write at most `limits.output_bytes` chars (then "output_limit"), of which the last cell's
    first `max_output_chars` are shown, cut with TRUNCATED inside that count. An exception is
    the cell's output, as in a REPL: earlier cells that raise do not stop the run. Never raises
    for anything the cells do.
    """
    limits = limits or Limits()
    if not cells:
        raise ValueError("run_cells needs at least one cell")
    # The report escapes each char in at most 10 (ascii()), and must pass the output cap.
    most = limits.output_bytes // 10 - _SCRUB_MARGIN
    if not 2 * len(TRUNCATED) <= max_output_chars <= most:
        raise ValueError(f"max_output_chars must be {2 * len(TRUNCATED)}..{most}")
    start = time.monotonic()
    named = [("<setup>", setup), *((f"<cell {i + 1}>", c) for i, c in enumerate(cells))]
    last = len(cells) - 1
    if sum(len(source) for _, source in named) > limits.max_source_chars:
        message = f"SandboxError: the cells are longer than {limits.max_source_chars} chars\n"
        return CellResult(message, "error", last, 0.0, "source too long")
    keep = max_output_chars + _SCRUB_MARGIN
    run, workdir = _run_job("cells", (named, keep, limits.output_bytes), limits)
    reason, cell, raw, written = _cells_outcome(run, len(named))
    output = _scrub(raw, workdir)
    if len(output) > max_output_chars or written > keep:
        output = output[: max_output_chars - len(TRUNCATED)] + TRUNCATED
    return CellResult(
        output=output,
        reason=reason,
        cell=cell - 1,
        duration_s=time.monotonic() - start,
        detail=_scrub(run.stderr[-500:].decode("utf-8", "replace"), workdir).strip(),
    )
