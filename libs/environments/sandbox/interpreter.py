"""The interpreter sandboxed code runs under, and the one rule that pins it.

Tool cells print what the interpreter's minor version makes of them (3.12 has functions 3.11
lacks), so a pool that replays tool calls pins that minor version in its recipe
(`Recipe.tool_python`), and every worker and validator runs its sandboxes under it. That
interpreter need not be the service's own: a contributor on Python 3.13 points
`PRIME_SANDBOX_PYTHON` at a 3.11 binary (the harness uses the stdlib only, so any build of the
version serves). Everything below the minor version (patch level, build, paths, the host) is
masked by the harness and scrubbed by the parent.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SandboxSettings(BaseSettings):
    """Read by every process that runs sandboxes (workers, validators, the orchestrator's start
    check), from its environment."""

    model_config = SettingsConfigDict(env_prefix="PRIME_SANDBOX_", extra="ignore")

    python: Path | None = Field(
        None,
        description="The interpreter sandboxed code runs under (of the pool's `tool_python` "
        "minor version). None: this process's own.",
    )


class InterpreterError(RuntimeError):
    """The sandbox's interpreter cannot run this pool's tool cells; one line saying what to do."""


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: str
    """The minor version, "3.11"."""
    stdlib: tuple[tuple[str, str], ...]
    """Its stdlib's entries of `sys.path` under `-S`, longest first, each with what it reads
    as under the harness's masked prefix `/python` (scrubbed from output)."""

    def masked(self, text: str) -> str:
        """`text` with the stdlib's paths as they read under the masked prefix."""
        for path, shown in self.stdlib:
            text = text.replace(path, shown)
        return text


@functools.cache
def interpreter(path: str) -> Interpreter:
    """What `path` is, asked once per process (a few tens of milliseconds)."""
    probe = "import sys; print(repr(('%d.%d' % sys.version_info[:2], sys.prefix, sys.path)))"
    try:
        done = subprocess.run(
            [path, "-S", "-s", "-c", probe],
            capture_output=True,
            text=True,
            timeout=30,
            env={},
        )
        version, prefix, paths = ast.literal_eval(done.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError) as exc:
        raise InterpreterError(
            f"the sandbox's interpreter {path} does not run ({exc}); check PRIME_SANDBOX_PYTHON"
        ) from None
    # The stdlib dir itself before its zip: "/x/lib/python3.11" must not be cut by "/x/lib".
    stdlib = sorted({p for p in paths if p.startswith("/")}, key=len, reverse=True)
    under = prefix + "/"
    shown = [
        "/python/" + p[len(under) :] if p.startswith(under) else "/python/lib/" + Path(p).name
        for p in stdlib
    ]
    return Interpreter(path, version, tuple(zip(stdlib, shown, strict=True)))


def sandbox_interpreter() -> Interpreter:
    configured = SandboxSettings().python
    return interpreter(str(configured) if configured is not None else sys.executable)


def require_tool_python(version: str) -> Interpreter:
    """The sandbox's interpreter, if it is of the pool's pinned minor `version`; otherwise one
    line naming what to install and the setting to point at it."""
    found = sandbox_interpreter()
    if found.version != version:
        raise InterpreterError(
            f"this pool runs tool code under Python {version}, and this machine's sandbox "
            f"interpreter {found.path} is {found.version}: install Python {version} and set "
            f"PRIME_SANDBOX_PYTHON to it"
        )
    return found
