"""Who is to blame when an environment's tokens do not replay: the worker, or the environment.

A validator that replays a worker's episode and gets other environment tokens, while the
environment agrees with itself on the validator's machine (`verify.environment_second_look`
found nothing), still cannot tell a forger from an environment that answers otherwise on other
machines (a reply carrying the host name, a release of the plugin, a rarely random branch). One
machine's word is not enough to slash (docs/architecture.md, "never slashes on one opinion"),
so the evidence comes from beyond it: the record that every validator of the pool keeps of each
environment (protocol/env_records.py), every worker's groups and mismatches.

- If any other worker's groups of the environment also failed to replay, the environment
  disagrees across machines: nobody is blamed (held, and the operator alerted, naming it).
- Otherwise the worker is blamed only against witnesses: at least `MIN_WITNESSES` other workers
  whose groups of it all replayed, and the worker's mismatches implausible at the pool's own
  rate (a binomial tail at most `FALSE_SLASH`, with the others' rate smoothed by one mismatch
  and one clean group, so that a handful of clean groups never makes a rate of zero).

Until then the work is held (`env_unsettled`): neither trained on, paid nor slashed. A forger
gains nothing while held, and is slashed once the witnesses are in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_WITNESSES = 3
"""Other workers (other machines) whose groups of the environment replayed clean."""
FALSE_SLASH = 1e-6
"""The most probability that an honest worker's mismatches come from the environment's own rate
and are blamed on it anyway."""


@dataclass(frozen=True)
class EnvRecord:
    """One environment's record across workers: groups judged and groups that failed to replay."""

    groups: dict[str, int]
    mismatches: dict[str, int]


@dataclass(frozen=True)
class Blame:
    worker: bool
    """True: the worker's own doing (slash); False: held."""
    environment_disputed: bool
    """Other workers fail it too: the environment's bug, for the operator."""
    detail: str
    """The statistic that decided, and its limit, in one line."""


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        + i * math.log(p) + (n - i) * math.log1p(-p)
        for i in range(k, n + 1)
    ]  # fmt: skip
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def blame(record: EnvRecord, worker: str, env: str) -> Blame:
    """Whose doing are `worker`'s environment mismatches (its current one counted in `record`)?"""
    own_n, own_m = record.groups.get(worker, 0), record.mismatches.get(worker, 0)
    others = [w for w in record.groups if w != worker]
    failing = [w for w in record.mismatches if w != worker and record.mismatches[w] > 0]
    if failing:
        return Blame(
            False,
            True,
            f"environment {env!r} also failed to replay for {len(failing)} other worker(s): it "
            "answers otherwise on other machines or runs; held, not the worker's doing",
        )
    witnesses = [w for w in others if record.groups[w] > 0]
    if len(witnesses) < MIN_WITNESSES:
        return Blame(
            False,
            False,
            f"{own_m} of this worker's {own_n} groups of {env!r} failed to replay, and only "
            f"{len(witnesses)} other worker(s) witness it replaying (at least {MIN_WITNESSES} "
            "needed): held until they do",
        )
    others_n = sum(record.groups[w] for w in others)
    others_m = sum(record.mismatches.get(w, 0) for w in others)
    rate = (others_m + 1) / (others_n + 2)
    tail = binomial_tail(own_m, own_n, rate)
    said = (
        f"{own_m} of this worker's {own_n} groups of {env!r} failed to replay, where "
        f"{len(witnesses)} other workers' {others_n} groups replayed: chance {tail:.1e} at the "
        f"pool's rate {rate:.1e}"
    )
    if tail > FALSE_SLASH:
        return Blame(False, False, f"{said} > {FALSE_SLASH:.0e}: held until it is not")
    return Blame(True, False, f"{said} <= {FALSE_SLASH:.0e}: the worker's doing")
