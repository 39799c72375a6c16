"""The sandbox's child program stays standard-library only.

harness.py runs as the `-c` program of an interpreter started with `-S` (no site-packages), so an
import of anything installed, prime_swarm included, would fail there, and only when a sandbox
runs; a relative import fails too, since the child gets the module's source alone, not its
package. This reads the imports from the source, so it fails at once, without running a child.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from prime_swarm.libs.environments.sandbox import harness


def foreign_imports(source: str) -> list[str]:
    """The imports in `source` that the sandboxed child could not satisfy, as `line: module`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        for name in names:
            if name.startswith(".") or name.split(".")[0] not in sys.stdlib_module_names:
                found.append(f"{node.lineno}: {name}")
    return found


def test_the_harness_imports_the_standard_library_only() -> None:
    source = Path(harness.__file__).read_text(encoding="utf-8")
    assert "import" in source  # it does import (posix, marshal, ...): the walk sees them
    assert foreign_imports(source) == []


def test_foreign_imports_are_found() -> None:
    source = "import os, numpy\nfrom . import process\nfrom prime_swarm import x\nimport _ast\n"
    source += "def f():\n    import httpx.client\n"
    assert foreign_imports(source) == [
        "1: numpy",
        "2: .",
        "3: prime_swarm",
        "6: httpx.client",
    ]
