"""`make bench-orchestrator`: one orchestrator's phases (single.py), then replicas behind HAProxy
under a lease storm (replicas.py)."""
