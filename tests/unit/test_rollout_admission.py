"""A worker's fair share of the in-flight budget.

The grant itself runs in Redis: tests/integration/test_lease_grant.py."""

from prime_swarm.libs.rollout.admission import fair_share


def test_fair_share_splits_the_budget_over_live_workers() -> None:
    assert fair_share(12, live_workers=3, spread=1.0) == 4
    assert fair_share(12, live_workers=3, spread=1.5) == 6
    assert fair_share(10, live_workers=3, spread=1.0) == 4  # rounded up: nothing left unleased
    assert fair_share(12, live_workers=0, spread=1.0) == 12  # nobody seen yet: the asker is live
    assert fair_share(2, live_workers=50, spread=1.0) == 1  # every live worker may hold one
