"""`python -m bench.trainer`: the network against TRL's GRPOTrainer (compare.py)."""

# The bench lives in a module of its own: each TRL run is a spawned process, and a spawned
# child imports its target's module by name, which a `__main__` module cannot be.
from .compare import main

if __name__ == "__main__":
    main()
