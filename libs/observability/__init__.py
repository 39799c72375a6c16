"""The same /healthz, /metrics and log format for every service (DESIGN.md §3.9)."""
