"""Sampling that sits at the edge of the replay band group after group: a worker's record
against its peers'.

One group's replay z is judged against its engine's honest band (calibration.py). vLLM's
kernels round otherwise than the validator's transformers path, so its band accepts up to 20,
and a worker that samples colder than its lease (T 0.6 for 1.0) trails the seeded choice by
z 14.8-43 on SmolLM2 (8 of 8 groups over 10; bench.stacks' probe, 2026-12-03): inside the band
at times, so such a group can be accepted on its own. Honest groups seldom sit there: vLLM's
reached z 6.6 in 20 SmolLM2 groups (bench/results/stacks.json) and 16.0 in 1,000 multi-turn
ones (bench/results/toploc.json), while every cold group of the probe was over 10.

So an accepted group whose z is over `MARGINAL_Z` is marked, and the pool keeps each worker's
marks per engine and device class (protocol/sampling_records.py). A marked group is rejected,
and slashed, once the worker's marks are implausible at its peers' rate (pool_rates.py; at
`PRIOR_RATE`, ten times the highest honest rate measured, while fewer than three peers
witness the rate). An honest worker is not blamed for its engine's rounding: its peers on that
engine round alike. A cold worker is paid for its first few marked groups (five at the prior
rate) and slashed for every one after.
"""

from __future__ import annotations

from .admission import Refusal
from .pool_rates import FALSE_SLASH, MIN_WITNESSES, Record, excess
from .verify import Decision

MARGINAL_Z = 10.0
"""A replay z over this marks an accepted group."""
PRIOR_RATE = 0.05
"""The honest rate of marked groups assumed while too few peers witness it."""


def marked(decision: Decision) -> bool:
    ev = decision.judgement.evidence
    return decision.action == "accept" and ev is not None and ev.max_replay_z > MARGINAL_Z


def weigh(decision: Decision, record: Record, worker: str) -> Decision:
    """A marked group judged against `worker`'s record (this group counted in it): rejected as
    `sampling_mismatch` when the worker's marks are implausible at its peers' rate."""
    if not marked(decision):
        return decision
    found = excess(record, worker, PRIOR_RATE)
    if not found.implausible:
        return decision
    ev = decision.judgement.evidence
    assert ev is not None
    peers = (
        f"{found.witnesses} peers' rate {found.rate:.1e}"
        if found.witnesses >= MIN_WITNESSES
        else f"the prior rate {found.rate:.2f}"
    )
    why = Refusal(
        "sampling_mismatch",
        f"replay z {ev.max_replay_z:.1f} > {MARGINAL_Z} in {found.own_marked} of this worker's "
        f"{found.own_groups} accepted groups: chance {found.tail:.1e} at {peers} "
        f"<= {FALSE_SLASH:.0e}; not the lease's sampling",
    )
    return Decision("reject", why, decision.judgement)
