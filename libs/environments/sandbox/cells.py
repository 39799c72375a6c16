"""`run_cells`: a persistent Python REPL made stateless. The cells of a session run in order in
one fresh sandboxed interpreter, and the last cell's output comes back scrubbed of what would
differ between two runs."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prime_swarm.libs.environments.sandbox.harness import (
    CELL_MARKER,
    FORBIDDEN_EXIT,
    MEMORY_EXIT,
    OUTPUT_EXIT,
)
from prime_swarm.libs.environments.sandbox.interpreter import sandbox_interpreter
from prime_swarm.libs.environments.sandbox.process import Limits, Reason, Run, report_value, run_job


@dataclass(frozen=True)
class CellResult:
    output: str
    """The last cell's stdout and stderr as one text, as a REPL shows them (a final bare
    expression's repr echoed, an exception as a traceback of the cells' own frames), at most
    `max_output_chars`; or, when the sandbox stopped the run, a fixed one-line message."""
    reason: Reason
    """"ok": the last cell ran to its end; "error": it raised (the traceback ends `output`), or
    the sandbox failed; "timeout", "memory", "forbidden", "output_limit": the sandbox stopped
    the run in cell `cell`."""
    cell: int
    """The cell `output` is about: `len(cells) - 1` unless an earlier cell stopped the run (its
    index in `cells`; -1 is `setup`). A caller keeping a REPL session can tell from it that the
    session died before its last cell."""
    duration_s: float
    detail: str = ""  # the tail of the child's stderr, for debugging; not deterministic


TRUNCATED = "\n[output truncated]\n"
# Kept beyond the shown cap before scrubbing, so that a temp-dir path or address that straddles
# the cap is still replaced whole (each replacement shortens the text).
_SCRUB_MARGIN = 1024
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stopped_message(reason: Reason, stderr: bytes) -> str:
    """The fixed text a run the sandbox stopped shows: what is left of its output depends on
    where the clock or the memory ran out, so none of it is shown."""
    if reason == "forbidden":
        # The hook's own line names the event and the path or module as the code wrote it.
        refused = stderr.rsplit(b"\nsandbox: refused ", 1)
        what = refused[1].split(b"\n", 1)[0].decode("utf-8", "replace") if len(refused) > 1 else ""
        return f"PermissionError: the sandbox refused {what or 'an operation'}\n"
    return {
        "timeout": "TimeoutError: the cell ran past its time limit\n",
        "memory": "MemoryError: the cell ran out of memory\n",
        "output_limit": "OutputLimitError: the cell wrote more output than the sandbox allows\n",
    }.get(reason, "SandboxError: the interpreter stopped without a report\n")


def _cells_report(stdout: bytes) -> tuple[Reason, str, int] | None:
    """The cells harness's (status, last cell's output, chars it wrote), or None when the report
    is missing or malformed."""
    report = report_value(stdout)
    if type(report) is not tuple or len(report) != 3:
        return None
    status, text, written = report
    if status not in ("ok", "error") or type(text) is not str or type(written) is not int:
        return None
    return status, text, written


def _cells_outcome(run: Run, n_cells: int) -> tuple[Reason, int, str, int]:
    """(reason, index of the cell the run ended in among `n_cells` counting setup as 0, the raw
    output, chars the last cell wrote) of a cells run."""
    rc = run.returncode
    reason: Reason | None = run.killed_for
    if reason is None:
        if rc == FORBIDDEN_EXIT:
            reason = "forbidden"
        elif rc == MEMORY_EXIT or (rc != 0 and b"MemoryError" in run.stderr):
            reason = "memory"
        elif rc == OUTPUT_EXIT:
            reason = "output_limit"
        elif rc in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit's soft and hard signals
            reason = "timeout"
    report = _cells_report(run.stdout) if reason is None and rc == 0 else None
    if report is not None:
        status, text, written = report
        return status, n_cells - 1, text, written
    # Stopped: the last marker the harness wrote says in which cell (none yet: in setup).
    marks = run.stdout.rsplit(CELL_MARKER.encode(), 1)
    digits = marks[1].split(b"\n", 1)[0] if len(marks) > 1 else b""
    cell = min(int(digits), n_cells - 1) if digits.isdigit() and len(digits) < 9 else 0
    reason = reason or "error"
    message = _stopped_message(reason, run.stderr)
    return reason, cell, message, len(message)


def _scrub(text: str, workdir: str) -> str:
    """`text` without what differs between two runs of the same cells: the temp dir's path (in
    any form the code may print it), the interpreter's stdlib paths (as `/python/lib/...`, the
    prefix the harness's masked `sys.prefix` names) and the addresses in default reprs
    (`<object at 0x...>`). Surrogates (from a lone one the code printed) become escapes, so the
    text encodes."""
    for path in sorted({os.path.realpath(workdir), workdir}, key=len, reverse=True):
        text = text.replace(path, "/sandbox")
    text = text.replace(os.path.basename(workdir), "sandbox")
    text = sandbox_interpreter().masked(text)
    text = _ADDRESS.sub(" at 0x...", text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def run_cells(
    cells: Sequence[str],
    limits: Limits | None = None,
    setup: str = "",
    max_output_chars: int = 512,
) -> CellResult:
    """Run `setup`, then each of `cells` in order, in one fresh sandboxed interpreter sharing one
    namespace, and return what the last cell printed: a persistent Python REPL made stateless.

    A caller that keeps a REPL session across calls passes all of the session's cells each time:
    replaying them rebuilds the state, so the same cells give the same output on any machine and
    in any order of calls, which is what lets a validator check an episode's tool outputs. The
    cells are compiled as `<cell 1>`, `<cell 2>`, ... (setup as `<setup>`), so tracebacks name
    them and nothing of the harness; the temp dir's path reads `/sandbox`. Determinism covers
    what the code does deterministically: the hash seed and `random`'s seed are fixed and threads
    refused, but code that prints a clock, a pid, `id()`, os.urandom or the interpreter's own
    paths gets output that no one can reproduce; and a cell near its CPU or wall limit may time
    out on a slower machine.

    The limits bind the whole run (all the cells replayed), as in `run_tests`; each cell may
    write at most `limits.output_bytes` chars (then "output_limit"), of which the last cell's
    first `max_output_chars` are shown, cut with TRUNCATED inside that count. An exception is
    the cell's output, as in a REPL: earlier cells that raise do not stop the run. Never raises
    for anything the cells do.
    """
    limits = limits or Limits()
    if not cells:
        raise ValueError("run_cells needs at least one cell")
    # The report escapes each char in at most 10 (ascii()), and must pass the output cap.
    most = limits.output_bytes // 10 - _SCRUB_MARGIN
    if not 2 * len(TRUNCATED) <= max_output_chars <= most:
        raise ValueError(f"max_output_chars must be {2 * len(TRUNCATED)}..{most}")
    start = time.monotonic()
    named = [("<setup>", setup), *((f"<cell {i + 1}>", c) for i, c in enumerate(cells))]
    last = len(cells) - 1
    if sum(len(source) for _, source in named) > limits.max_source_chars:
        message = f"SandboxError: the cells are longer than {limits.max_source_chars} chars\n"
        return CellResult(message, "error", last, 0.0, "source too long")
    keep = max_output_chars + _SCRUB_MARGIN
    run, workdir = run_job("cells", (named, keep, limits.output_bytes), limits)
    reason, cell, raw, written = _cells_outcome(run, len(named))
    output = _scrub(raw, workdir)
    if len(output) > max_output_chars or written > keep:
        output = output[: max_output_chars - len(TRUNCATED)] + TRUNCATED
    return CellResult(
        output=output,
        reason=reason,
        cell=cell - 1,
        duration_s=time.monotonic() - start,
        detail=_scrub(run.stderr[-500:].decode("utf-8", "replace"), workdir).strip(),
    )
