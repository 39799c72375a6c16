"""Helpers of bench/shardcast_bench.py (node wrappers and the shaped network)."""
