"""What the README and docs/ name is real: every repository path exists, every `make` target is
in the Makefile, every `python -m` module imports, and every `prime-*` command line parses: its
subcommand exists and each of its flags is in that subcommand's `--help`. An example that no
longer runs is a failure here, not a newcomer's first hour."""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A backticked word starting with one of these is a path in this repository; anything else
# (`~/.prime/...`, `runs/...`, `/tmp/...`) is a path on the reader's machine.
TOP = ("protocol/", "libs/", "services/", "deploy/", "tests/", "bench/", "docs/", ".ci/")
TOP_FILES = {"Makefile", "pyproject.toml", "README.md"}
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PLACEHOLDER = re.compile(r"<[^>]*>|\bN\b|\bFILE\b|\bDIR\b")


def snippets(page: Path) -> Iterator[str]:
    """Inline code spans and the lines of fenced blocks (backslash continuations joined)."""
    text = page.read_text()
    for block in FENCE.findall(text):
        yield from block.replace("\\\n", " ").splitlines()
    yield from CODE_SPAN.findall(FENCE.sub("", text))


def repo_paths(snippet: str) -> Iterator[str]:
    for word in re.split(r"[\s,;()]+", snippet):
        word = word.strip("'\"").rstrip(".:")
        word = re.sub(r":\d+(-\d+)?$", "", word)  # file.py:123 names a line of a real file
        if (word.startswith(TOP) or word in TOP_FILES) and not PLACEHOLDER.search(word):
            yield word


def exists(path: str) -> bool:
    if any(c in path for c in "*?["):
        return bool(glob.glob(str(ROOT / path)))
    if "|" in path:  # `prime-relay origin|relay`-style alternatives never name a path
        return True
    if (ROOT / path).exists() or generated(path):
        return True
    # `libs/rl/step.train_step`: a name defined in that module.
    module, _, name = path.rpartition(".")
    source = ROOT / f"{module}.py"
    return bool(
        name.isidentifier()
        and source.is_file()
        and re.search(
            rf"^\s*(def|class|async def) {name}\b|^{name}\s*[:=]", source.read_text(), re.M
        )
    )


def generated(path: str) -> bool:
    """A path the project writes at run time (and git ignores), e.g. `deploy/docker/secrets/`."""
    done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
    return done.returncode == 0


def commands(snippet: str) -> Iterator[list[str]]:
    """Command lines in a snippet: `make ...`, `python -m ...`, `prime-... ...`, each split at
    pipes and `&&`, with leading VAR=value assignments and prompts dropped."""
    for part in re.split(r"\|\||&&|;|(?<!\\)\|(?![a-z-]+`)", snippet):
        try:
            words = shlex.split(part.strip().removeprefix("$ "), comments=True)
        except ValueError:
            continue
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        if words and (words[0] in {"make", "python", "python3"} or words[0].endswith("/python")):
            yield words
        elif words and words[0].startswith("prime-") and ":" not in words[0]:
            yield words


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


@cache
def programs() -> dict[str, str]:
    return {
        ep.name: ep.value
        for ep in entry_points(group="console_scripts")
        if ep.name.startswith("prime-")
    }


@cache
def run_help(program: str, sub: tuple[str, ...]) -> tuple[bool, str]:
    """`program sub... --help` run in process: whether it printed help, and what it printed
    (its usage error when it did not)."""
    module, _, attr = programs()[program].partition(":")
    main = getattr(importlib.import_module(module), attr)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*sub, "--help"])
        except SystemExit as done:
            if done.code not in (0, None):
                return False, err.getvalue()
    return True, out.getvalue()


def check_program(words: list[str]) -> str | None:
    program, args = words[0], words[1:]
    if program not in programs():
        # Programs the images install (deploy/docker/Dockerfile) are not console scripts.
        dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
        return None if program in dockerfile else f"{program}: no such command"
    # The longest run of leading words that the program takes as subcommands.
    sub: tuple[str, ...] = ()
    for word in args:
        if word.startswith("-") or "|" in word or PLACEHOLDER.search(word):
            break
        ok, said = run_help(program, (*sub, word))
        if not ok and "invalid choice" in said:
            return f"{' '.join(words)}: {word!r} is not a subcommand of `{program}`"
        if not ok:
            break
        sub = (*sub, word)
    ok, text = run_help(program, sub)
    if not ok:
        return f"{' '.join(words)}: `{program} {' '.join(sub)} --help` fails: {text.strip()}"
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
            return f"{' '.join(words)}: {flag} is not a flag of `{program} {' '.join(sub)}`"
    return None


def check_command(words: list[str]) -> str | None:
    if words[0] == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        missing = [t for t in targets if t not in make_targets()]
        return f"make {' '.join(missing)}: no such target" if missing else None
    if words[0].startswith("prime-"):
        return check_program(words)
    if "-m" in words[:-1]:
        module = words[words.index("-m") + 1]
        if module.startswith(("bench", "prime_swarm")) and importlib.util.find_spec(module) is None:
            return f"python -m {module}: no such module"
        return None
    scripts = [w for w in words[1:] if w.endswith(".py")]
    return next((f"{w}: no such file" for w in scripts if not (ROOT / w).exists()), None)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    named = {p for s in snippets(page) for p in repo_paths(s)}
    links = {
        str((page.parent / link).resolve().relative_to(ROOT))
        for link in LINK.findall(page.read_text())
        if "://" not in link and not link.startswith("mailto:")
    }
    missing = sorted(p for p in named | links if not exists(p))
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_page_shows_parses(page: Path) -> None:
    broken = sorted(
        {why for s in snippets(page) for c in commands(s) if (why := check_command(c)) is not None}
    )
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_checks_can_fail() -> None:
    assert check_command(["make", "no-such-target"]) is not None
    assert check_command(["prime-worker", "join", "--no-such-flag"]) is not None
    assert check_command(["prime-worker", "no-such-subcommand"]) is not None
    assert check_command(["python", "-m", "bench.no_such_bench"]) is not None
    assert not exists("libs/no_such_folder/x.py")
    assert check_command(["prime-worker", "join", "--pool", "1"]) is None
