"""`run_tests`: define a solution in the sandbox, call its function on each test case's
arguments, and compare what came back with the expected values here, in the parent."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prime_swarm.libs.environments.sandbox.harness import FORBIDDEN_EXIT, MEMORY_EXIT
from prime_swarm.libs.environments.sandbox.process import Limits, Reason, Run, report_value, run_job


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


def _report(stdout: bytes, n: int) -> list[tuple[str, Any]] | None:
    """The child's outcomes, or None when the report is missing or malformed."""
    outcomes = report_value(stdout)
    if (
        type(outcomes) is not list
        or len(outcomes) != n
        or any(type(o) is not tuple or len(o) != 2 for o in outcomes)
    ):
        return None
    return outcomes


def _score(run: Run, cases: Sequence[Case]) -> tuple[Reason, int]:
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
    run, _ = run_job("tests", (source, entry, [tuple(c.args) for c in cases]), limits)
    reason, passed = _score(run, cases)
    return SandboxResult(
        passed=reason == "ok" and passed == total,
        tests_passed=passed,
        tests_total=total,
        reason=reason,
        duration_s=time.monotonic() - start,
        detail=run.stderr[-500:].decode("utf-8", "replace").strip(),
    )
