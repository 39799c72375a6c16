"""The benches' held-out curves (bench/trainer/heldout_curve.py): runs averaged on a common
grid, and the time a curve first reaches a target, interpolated between its points."""

import pytest

from bench.trainer.heldout_curve import mean_curve, time_to


def test_time_to_interpolates_between_points_and_is_none_when_never_reached():
    c = [[0.0, 0.2], [100.0, 0.4], [200.0, 0.8]]
    assert time_to(c, 0.3) == pytest.approx(50.0)
    assert time_to(c, 0.6) == pytest.approx(150.0)
    assert time_to(c, 0.1) == 0.0
    assert time_to(c, 0.81) is None


def test_mean_curve_holds_a_shorter_run_at_its_end():
    a = [[0.0, 0.0, {}], [20.0, 1.0, {}]]
    b = [[0.0, 0.0, {}], [10.0, 0.5, {}]]
    got = dict((t, y) for t, y in mean_curve([a, b]))
    assert got[0.0] == pytest.approx(0.0)
    assert got[10.0] == pytest.approx((0.5 + 0.5) / 2)
    assert got[20.0] == pytest.approx((1.0 + 0.5) / 2)
