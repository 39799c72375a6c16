"""Is one worker's rate of some mark implausible at the rate its peers show?

Two of the validator's rules need evidence from beyond one group and one machine: an
environment's tokens that do not replay (env_disputes.py) and sampling that sits at the edge of
the replay band group after group (sampling_record.py). Both keep, per worker, the groups its
validators judged and how many carried the mark, and both ask the same question: could the
worker's count come from the others' rate? A binomial tail at most `FALSE_SLASH` says no.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_WITNESSES = 3
"""Other workers (other machines) whose groups set the pool's rate."""
FALSE_SLASH = 1e-6
"""The most probability that an honest worker's marks come from the pool's own rate and are
blamed on it anyway."""


@dataclass(frozen=True)
class Record:
    """Per worker: groups judged, and those that carried the mark."""

    groups: dict[str, int]
    marked: dict[str, int]


@dataclass(frozen=True)
class Excess:
    """One worker's count against the others'."""

    own_groups: int
    own_marked: int
    witnesses: int
    """Other workers with at least one group judged."""
    others_groups: int
    rate: float
    """The others' rate, smoothed by one marked and one clean group, so that a handful of clean
    groups never makes a rate of zero; `prior` where witnesses are too few."""
    tail: float
    """P(at least own_marked of own_groups) at `rate`."""

    @property
    def implausible(self) -> bool:
        return self.tail <= FALSE_SLASH


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


def excess(record: Record, worker: str, prior: float | None = None) -> Excess:
    """`worker`'s marks against the other workers' rate (the others' smoothed rate, or `prior`
    where fewer than MIN_WITNESSES others have groups; then the tail is 1 without a prior)."""
    own_n, own_m = record.groups.get(worker, 0), record.marked.get(worker, 0)
    others = [w for w in record.groups if w != worker]
    witnesses = sum(record.groups[w] > 0 for w in others)
    others_n = sum(record.groups[w] for w in others)
    others_m = sum(record.marked.get(w, 0) for w in others)
    if witnesses >= MIN_WITNESSES:
        rate = (others_m + 1) / (others_n + 2)
    elif prior is not None:
        rate = prior
    else:
        return Excess(own_n, own_m, witnesses, others_n, math.nan, 1.0)
    return Excess(own_n, own_m, witnesses, others_n, rate, binomial_tail(own_m, own_n, rate))
