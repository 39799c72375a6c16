"""`make bench-shardcast`: ours against PyPI shardcast 0.3.2 (transfer.py, `python -m
bench.shardcast`) and the delta section (delta.py); the node wrappers and the shaped network
beside them."""
