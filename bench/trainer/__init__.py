"""`make bench-trainer`: the network synchronous and asynchronous against TRL (compare.py), and
the TRL side on its own (trl_baseline.py)."""
