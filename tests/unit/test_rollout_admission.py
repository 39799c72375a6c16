"""The lease admission rule: batches cut to the worker's cap and the pool's in-flight bound."""

from prime_swarm.libs.rollout.admission import fair_share, lease_grant


def test_grant_is_the_tightest_of_request_worker_cap_and_pool_bound() -> None:
    assert lease_grant(8, worker_open=0, max_per_worker=64, in_flight=0, max_in_flight=64) == 8
    assert lease_grant(8, worker_open=60, max_per_worker=64, in_flight=0, max_in_flight=64) == 4
    assert lease_grant(8, worker_open=0, max_per_worker=64, in_flight=61, max_in_flight=64) == 3


def test_nothing_is_granted_past_either_bound() -> None:
    assert lease_grant(8, worker_open=64, max_per_worker=64, in_flight=0, max_in_flight=64) == 0
    assert lease_grant(8, worker_open=0, max_per_worker=64, in_flight=70, max_in_flight=64) == 0


def test_fair_share_splits_the_budget_over_live_workers() -> None:
    assert fair_share(12, live_workers=3, spread=1.0) == 4
    assert fair_share(12, live_workers=3, spread=1.5) == 6
    assert fair_share(10, live_workers=3, spread=1.0) == 4  # rounded up: nothing left unleased
    assert fair_share(12, live_workers=0, spread=1.0) == 12  # nobody seen yet: the asker is live
    assert fair_share(2, live_workers=50, spread=1.0) == 1  # every live worker may hold one


def test_one_worker_cannot_take_the_whole_budget() -> None:
    share = fair_share(9, live_workers=3, spread=1.0)
    assert lease_grant(8, 0, 64, in_flight=0, max_in_flight=9, share=share) == 3
    assert lease_grant(8, 3, 64, in_flight=3, max_in_flight=9, share=share) == 0
    # The other workers still find room.
    assert lease_grant(8, 0, 64, in_flight=3, max_in_flight=9, share=share) == 3
