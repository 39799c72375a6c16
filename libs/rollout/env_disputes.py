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

from dataclasses import dataclass

from .pool_rates import FALSE_SLASH, MIN_WITNESSES, Record, excess


@dataclass(frozen=True)
class Blame:
    worker: bool
    """True: the worker's own doing (slash); False: held."""
    environment_disputed: bool
    """Other workers fail it too: the environment's bug, for the operator."""
    detail: str
    """The statistic that decided, and its limit, in one line."""


def blame(record: Record, worker: str, env: str) -> Blame:
    """Whose doing are `worker`'s environment mismatches (`record.marked`: groups that failed to
    replay; its current one counted)?"""
    own_n, own_m = record.groups.get(worker, 0), record.marked.get(worker, 0)
    failing = [w for w in record.marked if w != worker and record.marked[w] > 0]
    if failing:
        return Blame(
            False,
            True,
            f"environment {env!r} also failed to replay for {len(failing)} other worker(s): it "
            "answers otherwise on other machines or runs; held, not the worker's doing",
        )
    found = excess(record, worker)
    if found.witnesses < MIN_WITNESSES:
        return Blame(
            False,
            False,
            f"{own_m} of this worker's {own_n} groups of {env!r} failed to replay, and only "
            f"{found.witnesses} other worker(s) witness it replaying (at least {MIN_WITNESSES} "
            "needed): held until they do",
        )
    said = (
        f"{own_m} of this worker's {own_n} groups of {env!r} failed to replay, where "
        f"{found.witnesses} other workers' {found.others_groups} groups replayed: chance "
        f"{found.tail:.1e} at the pool's rate {found.rate:.1e}"
    )
    if not found.implausible:
        return Blame(False, False, f"{said} > {FALSE_SLASH:.0e}: held until it is not")
    return Blame(True, False, f"{said} <= {FALSE_SLASH:.0e}: the worker's doing")
