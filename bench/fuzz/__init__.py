"""`make fuzz`: schemathesis against orchestrator, origin and relay (the harness:
tests/support/fuzz_harness.py)."""
