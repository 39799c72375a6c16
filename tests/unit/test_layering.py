"""The libraries stack in one direction, and the programs sit above them.

- `libs/model` (a model, its tokens, its sampling) knows nothing of training or verification, so
  the generation backends and the rollout contract can change without an import cycle between
  them;
- no folder of `libs/` imports a folder that imports it back (the folder graph is acyclic);
- `libs/rl` is the trainer's mathematics: it plays no environment and runs no episode (what the
  verifier and the orchestrator share with it lives below it, in `libs/environments` and
  `libs/model`);
- `libs/` holds no program: the command lines are `services/*/cli.py` and `deploy/`;
- the orchestrator (its image has no torch) imports neither torch nor the trainer's library.

Imports are read from the source (any import anywhere in a module, lazy ones and
TYPE_CHECKING ones included), so a rule fails before the import would.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / "libs"
ORCHESTRATOR = ROOT / "services" / "orchestrator"
ABOVE_MODEL = ("prime_swarm.libs.rl", "prime_swarm.libs.rollout")


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules `path` imports; relative imports resolved against its
    package, so `from ..rl import x` counts like `from prime_swarm.libs.rl import x`. For
    `from P import n` both P and P.n are named, since n may be a module (`from .. import rl`)."""
    package = ["prime_swarm", *path.parent.relative_to(ROOT).parts]
    return {m for node in ast.walk(ast.parse(path.read_text())) for m in names(node, package)}


def names(node: ast.AST, package: list[str]) -> set[str]:
    """The modules one import statement names (none for any other node)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = package[: len(package) - node.level + 1] if node.level else []
    module = ".".join([*base, *([node.module] if node.module else [])])
    return {module, *(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")}


def within(module: str, package: str) -> bool:
    """`module` is `package` or inside it (`prime_swarm.libs.rl` is not inside `...rlm`)."""
    return module == package or module.startswith(package + ".")


def lib_folder(module: str) -> str | None:
    """The folder of libs/ that `module` names (`prime_swarm.libs.rl.grpo` -> 'rl'), if any."""
    parts = module.split(".")
    if parts[:2] == ["prime_swarm", "libs"] and len(parts) > 2 and (LIBS / parts[2]).is_dir():
        return parts[2]
    return None


def folder_graph() -> dict[str, dict[str, str]]:
    """libs/ folder -> {folder it imports: one such import, as 'file: module'}."""
    graph: dict[str, dict[str, str]] = {}
    for folder in sorted(d for d in LIBS.iterdir() if (d / "__init__.py").exists()):
        edges = graph.setdefault(folder.name, {})
        for f in sorted(folder.rglob("*.py")):
            for module in sorted(imported_modules(f)):
                target = lib_folder(module)
                if target is not None and target != folder.name and target not in edges:
                    edges[target] = f"{f.relative_to(ROOT)}: {module}"
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle of `graph` as its nodes in order (the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the DFS path, "done" once left

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in graph.get(node, {}):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, path)) is not None:
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in graph:
        if start not in state and (cycle := visit(start, [])) is not None:
            return cycle
    return None


def describe_cycle(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    edges = [f"libs/{a} -> libs/{b} ({graph[a][b]})" for a, b in pairwise(cycle)]
    return "import cycle between libs folders: " + "; ".join(edges)


def test_the_model_library_imports_nothing_above_it() -> None:
    files = sorted((LIBS / "model").rglob("*.py"))
    assert files
    wrong = {
        f"{f.name}: {m}" for f in files for m in imported_modules(f) if m.startswith(ABOVE_MODEL)
    }
    assert not wrong, wrong


def test_no_folder_of_libs_imports_a_folder_that_imports_it_back() -> None:
    graph = folder_graph()
    assert {"model", "rl", "rollout", "environments"} <= set(graph)
    assert "model" in graph["rl"]  # the scan sees imports at all
    cycle = find_cycle(graph)
    assert cycle is None, describe_cycle(graph, cycle)


def test_find_cycle_names_every_edge() -> None:
    graph = {"a": {"b": "libs/a/x.py: b"}, "b": {"c": "libs/b/y.py: c"}, "c": {"a": "z"}}
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert describe_cycle(graph, cycle).count(" -> ") == 3
    assert find_cycle({"a": {"b": ""}, "b": {}, "c": {"a": ""}}) is None


def test_rl_is_the_trainers_mathematics_only() -> None:
    """It plays no environment and runs no episode: rewards, task lists, evaluation and
    demonstrations are below it or beside it, never imported by it."""
    files = sorted((LIBS / "rl").rglob("*.py"))
    assert files
    forbidden = ("prime_swarm.libs.rollout", "prime_swarm.libs.environments")
    wrong = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in files
        for m in imported_modules(f)
        if any(within(m, p) for p in forbidden)
    }
    assert not wrong, sorted(wrong)


def test_libs_holds_no_program() -> None:
    """A command line or a service loop is a program: it lives in services/ or deploy/. (The
    folder libs/cli/ is the shared command-line convention, a library; it is allowed, a
    cli.py or __main__.py module anywhere under libs/ is not.)"""
    programs = sorted(
        str(f.relative_to(ROOT))
        for f in LIBS.rglob("*.py")
        if f.name in ("cli.py", "__main__.py") and ".venv" not in f.parts
    )
    assert not programs, programs


def _orchestrator_modules() -> Iterator[Path]:
    files = sorted(ORCHESTRATOR.rglob("*.py"))
    assert files
    yield from files


def _trainer_side(module: str) -> bool:
    return within(module, "torch") or within(module, "prime_swarm.libs.rl")


def test_the_orchestrator_imports_neither_torch_nor_the_trainer() -> None:
    """Its image has no torch: an import of either, even a lazy one, is a start-up failure
    waiting for its code path."""
    wrong = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in _orchestrator_modules()
        for m in imported_modules(f)
        if _trainer_side(m)
    }
    assert not wrong, sorted(wrong)


def import_time_modules(path: Path) -> set[str]:
    """What importing `path` imports: `imported_modules` less what sits in a function body or
    under `if TYPE_CHECKING:` (those run later, or never)."""
    package = ["prime_swarm", *path.parent.relative_to(ROOT).parts]
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            found.update(names(node, package))
            if isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody):
                    walk(part)
                for handler in node.handlers:
                    walk(handler.body)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                walk(node.body)

    walk(ast.parse(path.read_text()).body)
    return found


def module_file(module: str) -> Path | None:
    """This repository's file for `prime_swarm.a.b`, if it is one of its modules."""
    parts = module.split(".")
    if parts[0] != "prime_swarm":
        return None
    base = ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if len(parts) > 1 and candidate.is_file():
            return candidate
    return None


def import_chain(start: Path, bad: Callable[[str], bool]) -> list[str] | None:
    """The chain of modules by which importing `start` imports a module `bad` accepts, or None.
    Packages count: importing a.b.c runs a/__init__.py and a/b/__init__.py first."""
    seen: set[Path] = {start}
    queue: list[tuple[Path, list[str]]] = [(start, [str(start.relative_to(ROOT))])]
    while queue:
        path, chain = queue.pop(0)
        for module in sorted(import_time_modules(path)):
            if bad(module):
                return [*chain, module]
            parts = module.split(".")
            for k in range(2, len(parts) + 1):
                f = module_file(".".join(parts[:k]))
                if f is not None and f not in seen:
                    seen.add(f)
                    queue.append((f, [*chain, ".".join(parts[:k])]))
    return None


def test_importing_the_orchestrator_reaches_neither_torch_nor_the_trainer() -> None:
    """The same, through everything its modules import when they are imported."""
    chains = {
        str(f.relative_to(ROOT)): chain
        for f in _orchestrator_modules()
        if (chain := import_chain(f, _trainer_side)) is not None
    }
    assert not chains, "\n".join(" -> ".join(c) for c in chains.values())
