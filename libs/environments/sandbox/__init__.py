"""Run untrusted Python in a resource-limited, audited subprocess: against tests (`run_tests`), or
as a persistent REPL's cells (`run_cells`, the tool of the multi-turn environments).

The code to run is a model's completion, and a validator runs completions that untrusted workers
submitted, so it is hostile input. The guards, from the kernel up:

- rlimits set between fork and exec: CPU seconds, address space, file size, open files, no core
  files, no processes (RLIMIT_NPROC binds only non-root users: as root it does nothing, and the
  audit hook below is what refuses forks);
- a new session, so the whole process group is SIGKILLed on timeout or output flood, plus a wall
  clock limit for code that sleeps or blocks rather than spins;
- a fresh 0700 temporary directory as cwd, deleted afterwards; an environment of its own (nothing
  of the caller's, no credentials); stdin is /dev/null; stdout and stderr are read with a size cap;
- `python -s -P -S -B` in an environment holding PYTHONHASHSEED=0 alone (`-I` less its `-E`,
  which would ignore that seed): no other PYTHON* variables, no user site, no cwd on sys.path (so
  files the code writes cannot shadow stdlib modules), no `site` (so no site-packages, no .pth
  hooks, no venv packages; also no `exit()`/`quit()` builtins, which a solution calling them pays
  for with a NameError), and no .pyc writes. With no site-packages the child runs harness.py's
  source alone, using builtin modules and the stdlib only. The fixed hash seed makes set and
  dict-of-str order the same on every run, so a worker and a validator see one result;
- in the child, before the code runs, an audit hook that kills the process on sockets, process
  creation, writes outside its temp dir and the like, and the unaudited functions with the same
  powers deleted (harness.py says which);
- the child never sees the expected outputs: it reports what the function returned, and the
  parent compares.

What this is not: a security boundary against native code execution. CPython documents audit
hooks as unsuitable for sandboxing on their own, and a memory-corruption bug in the interpreter
would bypass them. The kernel-enforced parts (rlimits, process group, wall clock, output cap)
hold regardless; for hostile input at scale run the caller as an unprivileged user and add a
namespace or seccomp layer (nsjail, bubblewrap, gVisor) around this.

The package's modules: harness.py, the child's whole program (stdlib only: it runs in an
interpreter without site-packages); process.py, the parent starting, limiting and reading the
child; cases.py and cells.py, the two jobs' parent sides.
"""

from prime_swarm.libs.environments.sandbox.cases import Case, SandboxResult, run_tests
from prime_swarm.libs.environments.sandbox.cells import TRUNCATED, CellResult, run_cells
from prime_swarm.libs.environments.sandbox.process import Limits, Reason

__all__ = [
    "TRUNCATED",
    "Case",
    "CellResult",
    "Limits",
    "Reason",
    "SandboxResult",
    "run_cells",
    "run_tests",
]
