"""The sandboxed child's whole program: load the payload, arm the guards, run the job, report.

The parent (process.py) sends this module's source, unchanged, as the child interpreter's `-c`
program; the `__main__` block at the end starts it. That interpreter runs under `-S` with no
site-packages, so this module may import builtin modules and the standard library only, and
nothing of prime_swarm (tests/unit/test_sandbox_harness.py keeps it so). Its imports sit inside
the functions that need them, so the child loads no module before it needs it.

The guards, in the child, before the code runs: an audit hook (`sys.addaudithook`, which cannot
be removed) that kills the process on sockets, process creation, signals to other processes,
ctypes, subinterpreters, bytecode loading, writes outside the temp dir, reads outside the temp
dir and the stdlib, non-regular files (device nodes, FIFOs), symlinks, and importing native
modules that open those doors. Unaudited functions with the same powers (`os.pidfd_open`,
`os.mknod`, ...) are deleted from their modules, and so is `_imp.create_builtin`, which could
re-create them.

The child never sees the expected outputs: it reports what the function returned, and the parent
compares. A child that forges its report still has to produce the right answers. A cell's report
is its own output anyway: forging it changes only what the code itself shows.
"""

# The protocol between parent and child, which the parent imports from here. The child gets
# them as arguments of `_child_main` from the `__main__` block, bound before any untrusted code
# runs, so code that rewrites this module's globals cannot change them.
FORBIDDEN_EXIT = 86  # the child's exit status when its audit hook refused something
MEMORY_EXIT = 87  # ... and when the code ran out of memory
OUTPUT_EXIT = 88  # ... and when one cell wrote more than `Limits.output_bytes` chars
EXITS = (FORBIDDEN_EXIT, MEMORY_EXIT, OUTPUT_EXIT)
PAYLOAD_NAME = "payload.marshal"
RESULT_MARKER = "\x1esandbox-result:"  # starts the child's report line on stdout
CELL_MARKER = "\x1esandbox-cell:"  # the cells harness writes it, and the index, before each cell
MARKERS = (RESULT_MARKER, CELL_MARKER)


def _child_main(payload: str, exits: tuple[int, int, int], markers: tuple[str, str]) -> None:
    """The child's whole program: load the payload, arm the guards, run the job, report.

    The job's function is looked up before any untrusted code runs, and each binds what it
    needs after that as a local, so monkeypatching a module or a global (this module is the
    code's `__main__`) cannot change how the job ends.
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
    _mask_host()
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


def _mask_host() -> None:
    """What code could print about the machine rather than compute: a worker and a validator on
    different hosts and builds of one Python minor version must see the same output. The core
    count, CPU affinity and load, the host's name, kernel and architecture, and the
    interpreter's patch level, build and paths read as fixed values. The minor version itself
    cannot be masked (3.12 has functions 3.11 lacks): the pool's recipe pins it (`tool_python`).
    The paths of the stdlib as modules' `__file__` and `sys.path` show them are scrubbed from
    the output by the parent, which knows them (process.py)."""
    import os
    import sys

    major, minor = sys.version_info[:2]

    class version_info(tuple):  # noqa: N801 - the name its repr shows, as the real one's
        __slots__ = ()
        major = property(lambda self: self[0])
        minor = property(lambda self: self[1])
        micro = property(lambda self: self[2])
        releaselevel = property(lambda self: self[3])
        serial = property(lambda self: self[4])

        def __repr__(self):
            major, minor, micro, level, serial = self
            return (
                f"sys.version_info(major={major}, minor={minor}, micro={micro}, "
                f"releaselevel={level!r}, serial={serial})"
            )

    masked = version_info((major, minor, 0, "final", 0))
    sys.version_info = masked
    sys.implementation.version = masked
    sys.hexversion = major << 24 | minor << 16 | 0xF0
    # Well-formed for platform's parser: python_version() reads "3.x.0", the build "sandbox".
    sys.version = f"{major}.{minor}.0 (sandbox, Jan  1 2000, 00:00:00) [sandbox]"
    sys.executable = sys._base_executable = f"/python/bin/python{major}.{minor}"
    sys.prefix = sys.base_prefix = sys.exec_prefix = sys.base_exec_prefix = "/python"
    uname = os.uname_result(("Linux", "sandbox", "sandbox", "sandbox", "sandbox"))
    sysconf = os.sysconf
    cpus = ("SC_NPROCESSORS_ONLN", "SC_NPROCESSORS_CONF", 83, 84)

    masks = {
        "uname": lambda: uname,
        "cpu_count": lambda: 1,
        "process_cpu_count": lambda: 1,  # 3.13
        "sched_getaffinity": lambda pid: {0},
        "getloadavg": lambda: (0.0, 0.0, 0.0),
        "sysconf": lambda name: 1 if name in cpus else sysconf(name),
    }
    # os re-exports posix's functions: both names of each are replaced.
    for module in (os, sys.modules["posix"]):
        for name, fn in masks.items():
            if hasattr(module, name):
                setattr(module, name, fn)


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


if __name__ == "__main__":
    _child_main(PAYLOAD_NAME, EXITS, MARKERS)
