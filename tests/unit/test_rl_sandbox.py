import os
import socket
import tempfile
import textwrap

import pytest

from prime_swarm.libs.environments.sandbox import Case, Limits, run_tests

# One CPU second keeps the suite fast and is still ~50x what a correct solution needs; the wall
# clock is generous so that a loaded machine does not turn slow starts into timeouts.
FAST = Limits(wall_s=5.0, cpu_s=1)
ADD_ONE = [Case((1,), 2), Case((-5,), -4), Case((41,), 42)]


def _run(source: str, cases=ADD_ONE, limits=FAST):
    return run_tests(textwrap.dedent(source), "f", cases, limits)


def test_passing_solution():
    r = _run("def f(x):\n    return x + 1\n")
    assert (r.passed, r.reason, r.tests_passed, r.tests_total) == (True, "ok", 3, 3)
    assert r.duration_s < FAST.wall_s


def test_stdlib_imports_and_scratch_files_work():
    r = _run(
        """
        import collections, functools, itertools, json, math, random, re, string
        def f(x):
            with open("scratch.txt", "w") as fh:
                fh.write(json.dumps([x]))
            with open("scratch.txt") as fh:
                return json.loads(fh.read())[0] + math.floor(1.5)
        """
    )
    assert (r.passed, r.reason) == (True, "ok"), r.detail


def test_failing_tests_give_partial_counts():
    r = _run("def f(x):\n    return 42 if x == 41 else x\n")
    assert (r.passed, r.reason, r.tests_passed) == (False, "ok", 1)
    r = _run("def f(x):\n    raise ValueError(x)\n")
    assert (r.passed, r.reason, r.tests_passed) == (False, "ok", 0)


@pytest.mark.parametrize(
    "source",
    [
        "def f(x) return x",  # syntax error
        "def g(x):\n    return x + 1\n",  # no f
        "import sys\nsys.exit(0)\n",  # exits while loading
        "import numpy\ndef f(x):\n    return x + 1\n",  # no site-packages under -S
    ],
)
def test_code_that_does_not_load_is_an_error(source):
    r = _run(source)
    assert (r.passed, r.reason, r.tests_passed) == (False, "error", 0)


def test_outputs_must_match_exactly_and_in_type():
    cases = [Case((), [1, 2])]
    assert _run("def f():\n    return [1, 2]\n", cases).passed
    assert not _run("def f():\n    return (1, 2)\n", cases).passed
    assert not _run("def f():\n    return [True, 2]\n", cases).passed
    # An object claiming equality with everything is not plain data: it fails.
    r = _run(
        "class A:\n    def __eq__(self, o):\n        return True\ndef f():\n    return A()\n", cases
    )
    assert (r.reason, r.tests_passed) == ("ok", 0)


def test_the_child_never_sees_expected_outputs():
    # The report carries what f returned and the parent compares, so a solution can't win by
    # finding the expected value in its payload (or anywhere else it can read).
    r = _run(
        """
        import os
        def f():
            prefix = "need" + "le-"  # not spelled out, or it would find its own source
            for name in os.listdir("."):
                if os.path.isfile(name):
                    data = open(name, "rb").read().decode("latin-1")
                    if prefix in data:
                        return data[data.index(prefix) :][:15]
        """,
        [Case((), "needle-8f3a1c2e")],
    )
    assert (r.reason, r.tests_passed) == ("ok", 0)


def test_infinite_loop_times_out_quickly():
    r = _run("def f(x):\n    while True:\n        pass\n")
    assert (r.passed, r.reason) == (False, "timeout")
    assert r.duration_s < FAST.wall_s + 1.0  # the CPU limit usually ends it after ~1 s


def test_sleeping_is_caught_by_the_wall_clock():
    r = _run("import time\ndef f(x):\n    time.sleep(60)\n", limits=Limits(wall_s=1.0, cpu_s=5))
    assert (r.passed, r.reason) == (False, "timeout")
    assert r.duration_s < 3.0


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    return len(bytearray(1 << 33))\n",
        "def f(x):\n    keep = []\n    while True:\n        keep.append(bytearray(1 << 20))\n",
        "blob = bytearray(1 << 33)\ndef f(x):\n    return x + 1\n",
    ],
)
def test_memory_bomb(source):
    r = _run(source)
    assert (r.passed, r.reason) == (False, "memory"), r


@pytest.mark.parametrize(
    "source",
    [
        "import os\ndef f(x):\n    while True:\n        os.fork()\n",
        "import subprocess\ndef f(x):\n    subprocess.run(['touch', {marker!r}])\n",
        "import os\ndef f(x):\n    os.system('touch ' + {marker!r})\n",
        "import os\ndef f(x):\n    os.posix_spawn('/usr/bin/touch', ['touch', {marker!r}], {{}})\n",
        "import os\ndef f(x):\n    os.execv('/usr/bin/touch', ['touch', {marker!r}])\n",
        "import multiprocessing\ndef f(x):\n    multiprocessing.Process(target=print).start()\n",
        "import ctypes\ndef f(x):\n    ctypes.CDLL(None).fork()\n",
        "import importlib\ndef f(x):\n    importlib.import_module('_posixsubprocess')\n",
    ],
)
def test_no_child_processes(tmp_path, source):
    marker = tmp_path / "spawned"
    r = _run(source.format(marker=str(marker)))
    assert r.reason in ("forbidden", "error") and not r.passed and r.tests_passed == 0
    assert not marker.exists()


@pytest.mark.parametrize(
    "attempt",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
        "import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))",
        "import importlib\nm = importlib.import_module('socket')\n"
        "m.create_connection(('127.0.0.1', {port}))",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)",
    ],
)
def test_no_network(attempt):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        body = textwrap.indent(attempt.format(port=port), "    ")
        r = _run(f"def f(x):\n{body}\n    return x + 1\n")
        assert (r.passed, r.reason) == (False, "forbidden"), r.detail
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):  # nothing ever connected
            server.accept()


@pytest.mark.parametrize(
    "attempt",
    [
        "open({target!r}, 'w').write('x')",
        "open('../' * 20 + {target!r}.lstrip('/'), 'w').write('x')",
        "import pathlib\npathlib.Path({target!r}).write_text('x')",
        "import os\nos.close(os.open({target!r}, os.O_CREAT | os.O_WRONLY))",
        "import os\nopen('x', 'w').close()\nos.rename('x', {target!r})",
        "import os\nos.symlink({target!r}, 'link')\nopen('link', 'w').write('x')",
        "import shutil\nopen('x', 'w').close()\nshutil.copy('x', {target!r})",
    ],
)
def test_no_writes_outside_the_temp_dir(tmp_path, attempt):
    target = tmp_path / "escaped.txt"
    body = textwrap.indent(attempt.format(target=str(target)), "    ")
    r = _run(f"def f(x):\n{body}\n    return x + 1\n")
    assert (r.passed, r.reason) == (False, "forbidden"), r.detail
    assert not target.exists() and not target.is_symlink()


def test_no_reads_outside_the_temp_dir_and_stdlib(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("41")
    r = _run(f"def f(x):\n    return int(open({str(secret)!r}).read()) + 1\n")
    assert (r.passed, r.reason) == (False, "forbidden")
    r = _run("import os\ndef f(x):\n    return len(os.listdir('/')) + x\n")
    assert (r.passed, r.reason) == (False, "forbidden")


@pytest.mark.parametrize("stream", ["sys.stdout", "sys.stderr"])
def test_output_flood_is_capped(stream):
    limits = Limits(wall_s=5.0, cpu_s=1, output_bytes=64 << 10)
    r = _run(
        f"import sys\ndef f(x):\n    while True:\n        {stream}.write('x' * 4096)\n",
        limits=limits,
    )
    assert (r.passed, r.reason) == (False, "output_limit")
    assert r.duration_s < 3.0  # stopped at the cap, not by a limit on time
    assert len(r.detail) <= 500


def test_temp_dir_is_removed(monkeypatch):
    made = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    r = _run("import os\nos.mkdir('d')\nopen('d/f', 'w').write('x')\ndef f(x):\n    return x + 1\n")
    assert r.passed
    r = _run("def f(x):\n    while True:\n        pass\n")  # killed, not exited
    assert r.reason == "timeout"
    assert len(made) == 2 and not any(os.path.exists(d) for d in made)


def test_the_environment_is_empty(monkeypatch):
    monkeypatch.setenv("PRIME_SANDBOX_SECRET", "hunter2")
    r = _run(
        "import os\ndef f():\n    return os.environ.get('PRIME_SANDBOX_SECRET')\n", [Case((), None)]
    )
    assert r.passed


def test_oversized_source_is_refused_without_running():
    r = run_tests("x = 1\n" * 20_000, "f", ADD_ONE, FAST)
    assert (r.passed, r.reason, r.tests_total) == (False, "error", 3)
