"""`python -m bench.orchestrator`: one orchestrator's phases (single.py); the replicas behind
HAProxy run apart, `python -m bench.orchestrator.replicas`."""

import sys

# The bench lives in a module of its own: its client processes are spawned, and a spawned
# child imports its target's module by name, which a `__main__` module cannot be.
from .single import main

if __name__ == "__main__":
    sys.exit(main())
