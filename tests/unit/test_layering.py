"""The libraries stack in one direction: `libs/model` (a model, its tokens, its sampling) knows
nothing of training or verification, so the generation backends and the rollout contract can
change without an import cycle between them."""

from __future__ import annotations

import ast
from pathlib import Path

LIBS = Path(__file__).resolve().parents[2] / "libs"
ABOVE_MODEL = ("prime_swarm.libs.rl", "prime_swarm.libs.rollout")


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules `path` imports; relative imports resolved against its
    package, so `from ..rl import x` counts like `from prime_swarm.libs.rl import x`."""
    package = ["prime_swarm", *path.parent.relative_to(LIBS.parent).parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            found.add(".".join([*base, *([node.module] if node.module else [])]))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_model_library_imports_nothing_above_it() -> None:
    files = sorted((LIBS / "model").rglob("*.py"))
    assert files
    wrong = {
        f"{f.name}: {m}" for f in files for m in imported_modules(f) if m.startswith(ABOVE_MODEL)
    }
    assert not wrong, wrong
