"""Sampling that sits at the edge of the replay band group after group: a worker's record
against its peers'.

One group's replay z is judged against its engine's honest band (calibration.py). vLLM's
kernels round otherwise than the validator's transformers path, so its band accepts up to 20,
and a worker that samples colder than its lease (T 0.6 for 1.0) trails the seeded choice by
z 14.8-43 on SmolLM2 (8 vLLM groups probed, 2026-12-03): inside the band at times, so such
a group can be accepted on its own (7 of 32 in bench/results/stacks.json, every one of them
over z 10). Honest groups seldom sit there: none of the 2,016 honest judgements of that run
was over 10 (the game's largest 8.9, vLLM's SmolLM2 6.6 the run before), and vLLM's largest
in 1,000 multi-turn groups was 16.0 (bench/results/toploc.json).

So an accepted group whose z is over `MARGINAL_Z` is marked, and the pool keeps each worker's
marks per engine and device class (protocol/sampling_records.py). A marked group is rejected,
and slashed, once the worker's marks are implausible at its peers' rate (pool_rates.py), or
at `PRIOR_RATE` while fewer than three peers witness the rate: five times any honest rate
measured (under 1 % wherever measured; vLLM's multi-turn p99 was z 9.7). An honest worker is
not blamed for its engine's rounding: its peers on that engine round alike. A cold worker is
paid for its first few marked groups (five at the prior rate) and slashed for every one after.
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
