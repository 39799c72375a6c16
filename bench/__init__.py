"""Benchmarks, one package per topic, each run from the repository root as `python -m
bench.<topic>` (the Makefile's bench targets); each writes its JSON under bench/results/. Code a
test needs too lives in tests/support/, imported from here as `tests.support.<module>`."""
