"""The rollout contract in one room: the pool's recipe, the seeded noise, a worker's answer to a
lease, the validator's checks and the one admission rule (staleness and lease match).

Worker, validator, orchestrator, trainer and the benchmarks all import from here; services keep
only their I/O and loops.
"""
