"""run_cells: a persistent REPL made of replayed cells, in the sandbox of run_tests. Its output is
what a validator compares against a worker's, so it must be the same on every run; every attack
must end with a clear reason and leave the caller unharmed."""

from __future__ import annotations

import os
import socket
import tempfile
import textwrap

import pytest

from prime_swarm.libs.environments.sandbox import TRUNCATED, Limits, run_cells

# As in test_rl_sandbox: one CPU second ends a spinning cell quickly; the wall clock is generous
# so that a loaded machine does not turn slow starts into timeouts.
FAST = Limits(wall_s=5.0, cpu_s=1)
SLEEPY = Limits(wall_s=1.0, cpu_s=5)  # for cells that block rather than spin


def _cells(*cells: str, limits: Limits = FAST, **kwargs):
    return run_cells([textwrap.dedent(c) for c in cells], limits, **kwargs)


def _still_works() -> None:
    """The caller (this process) is alive and a fresh sandbox still runs."""
    r = _cells("6 * 7")
    assert (r.reason, r.output) == ("ok", "42\n")


def test_state_persists_across_cells_and_the_last_expression_is_echoed():
    r = _cells("x = 40", "def inc(v):\n    return v + 1", "x = inc(x)", "print('x is', x)\ninc(x)")
    assert (r.reason, r.cell, r.output) == ("ok", 3, "x is 41\n42\n")
    r = _cells("print('a')\nNone")  # None is not echoed, as in the REPL
    assert r.output == "a\n"


def test_setup_defines_what_the_cells_see():
    r = _cells("sum(context), len(context)", setup="context = list(range(100))")
    assert (r.reason, r.output) == ("ok", "(4950, 100)\n")


def test_an_exception_ends_its_cell_not_the_session():
    r = _cells("y = 1\n1 / 0\ny = 2", "y")
    assert (r.reason, r.output) == ("ok", "1\n")
    r = _cells("def f(n):\n    return 10 // n", "f(0)")
    assert r.reason == "error"
    assert r.output == (
        "Traceback (most recent call last):\n"
        '  File "<cell 2>", line 1, in <module>\n'
        "    f(0)\n"
        '  File "<cell 1>", line 2, in f\n'
        "    return 10 // n\n"
        "ZeroDivisionError: integer division or modulo by zero\n"
    )


def test_syntax_errors_and_deep_recursion_render_like_the_repl():
    r = _cells("def f(x) return x")
    assert r.reason == "error"
    assert r.output == '  File "<cell 1>", line 1\n    def f(x) return x\n             ^\n' + (
        "SyntaxError: expected ':'\n"
    )
    r = _cells("def f(n):\n    return f(n + 1)", "f(0)", max_output_chars=2000)
    assert "[Previous line repeated" in r.output and r.output.endswith(
        "RecursionError: maximum recursion depth exceeded\n"
    )


def test_output_is_the_same_on_every_run():
    cells = [
        "import json, os, random\nopen('notes.txt', 'w').close()",
        "print({'pear', 'fig', 'kiwi', 'lime', 'plum'}, random.random())\n"
        "print(object(), os.getcwd(), os.path.abspath('notes.txt'), os.listdir('.'))\n"
        "json.loads('{')",
    ]
    first, second = run_cells(cells, FAST), run_cells(cells, FAST)
    assert first.output == second.output and first.reason == second.reason == "error"
    # Nothing of the run's own: no temp dir, no address, no harness or stdlib frame.
    assert "prime-sandbox" not in first.output and "<object object at 0x...>" in first.output
    assert "/sandbox /sandbox/notes.txt ['notes.txt']" in first.output
    assert "<string>" not in first.output and ".py" not in first.output
    assert first.output.endswith(
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)\n"
    )


def test_threads_are_refused_so_output_cannot_race():
    r = _cells("import threading\nthreading.Thread(target=print).start()")
    assert r.reason == "error" and r.output.endswith(
        "RuntimeError: threads are not available in the sandbox\n"
    )


def test_long_output_is_cut_at_the_cap():
    r = _cells("print('y' * 5000)", max_output_chars=100)
    assert r.reason == "ok" and len(r.output) == 100
    assert r.output == "y" * (100 - len(TRUNCATED)) + TRUNCATED


def test_huge_output_stops_the_cell_quickly():
    r = _cells("while True:\n    print('x' * 4096)")
    assert (r.reason, r.output) == (
        "output_limit",
        "OutputLimitError: the cell wrote more output than the sandbox allows\n",
    )
    assert r.duration_s < 3.0  # stopped at the flood limit, not by the clock
    # Straight to the file descriptor, past the capture: the parent's own cap stops it.
    r = _cells("import os\nwhile True:\n    os.write(1, b'x' * 4096)")
    assert r.reason == "output_limit" and r.duration_s < 3.0
    _still_works()


def test_infinite_loop_times_out_quickly():
    r = _cells("x = 1", "while True:\n    pass")
    assert (r.reason, r.cell, r.output) == (
        "timeout",
        1,
        "TimeoutError: the cell ran past its time limit\n",
    )
    assert r.duration_s < FAST.wall_s + 1.0


@pytest.mark.parametrize(
    "cell",
    [
        "import time\ntime.sleep(60)",
        "import os\nr, w = os.pipe()\nos.read(r, 1)",  # a read that never returns
    ],
)
def test_a_cell_that_never_returns_is_caught_by_the_wall_clock(cell):
    r = _cells(cell, limits=SLEEPY)
    assert (r.reason, r.output) == ("timeout", "TimeoutError: the cell ran past its time limit\n")
    assert r.duration_s < 3.0


def test_an_earlier_cell_that_stops_the_run_is_named():
    # A session whose earlier cell dies dies there on every replay: the caller learns which.
    r = _cells("while True:\n    pass", "print('never')")
    assert (r.reason, r.cell) == ("timeout", 0)
    r = _cells("print('never')", setup="import socket")
    assert (r.reason, r.cell) == ("forbidden", -1)


@pytest.mark.parametrize(
    "cell",
    [
        "x = bytearray(1 << 33)",
        "keep = []\nwhile True:\n    keep.append(bytearray(1 << 20))",
    ],
)
def test_memory_bomb(cell):
    r = _cells("a = 1", cell)
    assert (r.reason, r.cell, r.output) == (
        "memory",
        1,
        "MemoryError: the cell ran out of memory\n",
    )
    _still_works()


@pytest.mark.parametrize(
    "cell",
    [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['touch', {marker!r}])",
        "import os\nos.system('touch ' + {marker!r})",
        "import os\nos.posix_spawn('/usr/bin/touch', ['touch', {marker!r}], {{}})",
        # Signal 0 only probes: refused all the same, and a broken guard fails the test rather
        # than killing the test runner.
        "import os\nos.kill(os.getppid(), 0)",
    ],
)
def test_no_child_processes_and_no_signals(tmp_path, cell):
    marker = tmp_path / "spawned"
    r = _cells("pid = 1", cell.format(marker=str(marker)))
    assert (r.reason, r.cell) == ("forbidden", 1)
    assert r.output.startswith("PermissionError: the sandbox refused ")
    assert not marker.exists()
    _still_works()


@pytest.mark.parametrize(
    "cell",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
        "import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)",
    ],
)
def test_no_network(cell):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        r = _cells(cell.format(port=server.getsockname()[1]))
        assert r.reason == "forbidden", r
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):  # nothing ever connected
            server.accept()


def test_no_reads_outside_its_dir(tmp_path):
    r = _cells("open('/etc/passwd').read()")
    assert (r.reason, r.output) == (
        "forbidden",
        "PermissionError: the sandbox refused open /etc/passwd r\n",
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    r = _cells(f"print(open({str(secret)!r}).read())")
    assert r.reason == "forbidden" and "hunter2" not in r.output
    r = _cells("import os\nos.listdir('/')")
    assert r.reason == "forbidden"


@pytest.mark.parametrize(
    "cell",
    [
        "open({target!r}, 'w').write('x')",
        "open('../' * 20 + {target!r}.lstrip('/'), 'w').write('x')",
        "import os\nopen('x', 'w').close()\nos.rename('x', {target!r})",
    ],
)
def test_no_writes_outside_its_dir(tmp_path, cell):
    target = tmp_path / "escaped.txt"
    r = _cells("open('inside.txt', 'w').write('fine')", cell.format(target=str(target)))
    assert (r.reason, r.cell) == ("forbidden", 1)
    assert not target.exists()


def test_temp_dir_is_removed(monkeypatch):
    made = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    assert _cells("import os\nos.mkdir('d')\nopen('d/f', 'w').write('x')").reason == "ok"
    assert _cells("while True:\n    pass").reason == "timeout"  # killed, not exited
    assert len(made) == 2 and not any(os.path.exists(d) for d in made)


def test_oversized_cells_are_refused_without_running():
    r = run_cells(["x = 1\n" * 20_000], FAST)
    assert r.reason == "error" and r.output.startswith("SandboxError: the cells are longer")


def test_no_cells_is_a_caller_error():
    with pytest.raises(ValueError):
        run_cells([], FAST)
