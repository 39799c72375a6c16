"""Reliable consumption of Redis streams with consumer groups (no loops here, just the steps)."""
