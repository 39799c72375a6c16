"""Tool outputs that do not depend on the host: one set of ordinary tool cells run through the
sandbox under two interpreters of the pool's pinned minor version on two made-up hosts (each its
own UTS namespace with its own host name, and its own CPU affinity), byte for byte the same;
under another minor version, the cells that use what differs between versions differ, and that
interpreter is refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prime_swarm.libs.environments.sandbox.interpreter import (
    InterpreterError,
    interpreter,
    require_tool_python,
)

PYENV = Path.home() / ".pyenv" / "versions"
# Each an ordinary cell a model might run as a tool call; several ask the machine about itself.
CELLS = [
    "import os, sys, platform, math, json, itertools, collections, statistics",
    "print(os.cpu_count())",
    "print(len(os.sched_getaffinity(0)), os.sysconf('SC_NPROCESSORS_ONLN'))",
    "print(platform.node(), platform.machine(), platform.system(), platform.release())",
    "print(os.uname())",
    "print(platform.python_version(), sys.version)",
    "print(sys.version_info, sys.hexversion)",
    "print(sys.executable, sys.prefix, sys.base_prefix)",
    "print(json.__file__)",
    "print([p for p in sys.path])",
    "print(os.getcwd(), os.listdir('.'))",
    "print(os.getloadavg())",
    "print(platform.python_implementation(), platform.python_version_tuple())",
    "print(sorted({'b', 'a', 'c'}), hash('x') % 97)",
    "import random; print(random.random(), random.randint(1, 6))",
    "print(math.factorial(30), math.isqrt(10**20 + 7), 2**0.5)",
    "print(json.dumps({'z': 1, 'a': [1.5, None]}, sort_keys=True))",
    "print(statistics.mean([1, 2, 3, 4]), statistics.pstdev([1, 2, 3, 4]))",
    "print(collections.Counter('mississippi').most_common(3))",
    "print(list(itertools.permutations('abc', 2))[:4])",
    "print(f'{1/3:.10f}', round(2.675, 2), 0.1 + 0.2)",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(20))",
    "print(sum(i * i for i in range(10**5)))",
    "open('notes.txt', 'w').write('hello\\n'); print(open('notes.txt').read().strip())",
    "print(os.path.abspath('notes.txt'), os.path.exists('notes.txt'))",
    "import re; print(re.findall(r'\\d+', 'a1b22c333'))",
    "print(int('ff', 16), bin(255), hex(4096), (255).bit_length())",
    "1 / 0",
    "print(str(sorted(os.environ)))",
    "import datetime; print(datetime.date(2024, 2, 29) + datetime.timedelta(days=365))",
    "import itertools; print(hasattr(itertools, 'batched'))",
    "print(sys.version_info >= (3, 12))",
]
# What a minor version changes by itself: the pin, not a mask, covers these.
VERSION_CELLS = {len(CELLS) - 2, len(CELLS) - 1, 5, 6, 7, 8, 9, 12}
RUNNER = """
import json, sys
from prime_swarm.libs.environments.sandbox import run_cells
cells = json.loads(sys.stdin.read())
out = [run_cells(cells[: i + 1], max_output_chars=2048) for i in range(len(cells))]
print(json.dumps([(r.reason, r.output) for r in out]))
"""


def pyenv_python(minor: str) -> Path:
    found = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"))
    if not found:
        pytest.skip(f"no Python {minor} under {PYENV} (pyenv) on this machine")
    return found[-1]


def on_host(hostname: str, cpus: str, sandbox_python: Path) -> list[list[str]]:
    """The cells' outputs from a made-up host: a UTS namespace of its own named `hostname`,
    pinned to `cpus`, its sandbox interpreter `sandbox_python`."""
    if os.geteuid() != 0:
        pytest.skip("made-up hosts need new UTS namespaces (root)")
    script = f'hostname {hostname} && exec taskset -c {cpus} {sys.executable} -c "$0"'
    done = subprocess.run(
        ["unshare", "--uts", "--fork", "sh", "-c", script, RUNNER],
        input=json.dumps(CELLS),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PRIME_SANDBOX_PYTHON": str(sandbox_python)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_cells_give_the_same_bytes_under_two_interpreters_on_two_hosts() -> None:
    ours = Path(sys.executable)
    minor = interpreter(str(ours)).version
    other = pyenv_python(minor)  # the same minor version: another build, another prefix
    assert interpreter(str(other)).path != interpreter(str(ours)).path
    a = on_host("host-a", "0", ours)
    b = on_host("contributor-b.example", f"0-{(os.cpu_count() or 1) - 1}", other)
    assert all(reason in ("ok", "error") for reason, _ in a), a
    assert [x[1] for x in a] == [x[1] for x in b]
    joined = "".join(out for _, out in a)
    for leak in ("host-a", "contributor-b", str(PYENV), ".venv", "prime-sandbox-"):
        assert leak not in joined, leak
    assert a[1][1] == "1\n"  # os.cpu_count(), masked
    assert a[27][1].endswith("ZeroDivisionError: division by zero\n")  # errors are output too


def test_another_minor_version_differs_only_where_the_version_does_and_is_refused() -> None:
    ours = Path(sys.executable)
    minor = interpreter(str(ours)).version
    newer = f"3.{int(minor.split('.')[1]) + 1}"
    a = on_host("host-a", "0", ours)
    c = on_host("host-c", "0", pyenv_python(newer))
    differ = {i for i, (x, y) in enumerate(zip(a, c, strict=True)) if x != y}
    assert differ and differ <= VERSION_CELLS, [CELLS[i] for i in differ - VERSION_CELLS]
    os.environ["PRIME_SANDBOX_PYTHON"] = str(pyenv_python(newer))
    try:
        with pytest.raises(InterpreterError) as err:
            require_tool_python(minor)
    finally:
        del os.environ["PRIME_SANDBOX_PYTHON"]
    line = str(err.value)
    assert f"under Python {minor}" in line and "PRIME_SANDBOX_PYTHON" in line and "\n" not in line
    assert require_tool_python(minor).version == minor
