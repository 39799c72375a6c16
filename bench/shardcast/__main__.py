"""`python -m bench.shardcast`: ours against the reference shardcast (transfer.py)."""

import sys

# The bench lives in a module of its own, because delta.py imports its process helpers.
from .transfer import main

if __name__ == "__main__":
    sys.exit(main())
