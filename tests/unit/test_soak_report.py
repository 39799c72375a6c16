"""The soak's arithmetic (deploy/local/soak.py): growth per hour over a process's last life."""

from __future__ import annotations

import pytest

from prime_swarm.deploy.local.soak import growth_per_hour, summarize


def test_growth_is_the_fitted_slope_per_hour() -> None:
    assert growth_per_hour([(0.0, 100.0), (1800.0, 110.0), (3600.0, 120.0)]) == pytest.approx(20.0)
    assert growth_per_hour([(0.0, 5.0)]) is None
    assert growth_per_hour([(0.0, 5.0), (0.0, 6.0)]) is None


def test_a_restarted_process_is_measured_over_its_last_life_only() -> None:
    def sample(t: float, pid: int, rss: float) -> dict:
        return {"t": t, "processes": {"worker-0": {"pid": pid, "rss_mb": rss, "open_files": 9}}}

    # 100 -> 400 MB in its first life (killed at 1800 s), then flat at 150 MB.
    samples = [sample(0, 1, 100), sample(1200, 1, 400), sample(1800, 2, 150), sample(3600, 2, 150)]
    row = summarize(samples)["worker-0"]
    assert row["restarts"] == 1 and row["measured_over_min"] == pytest.approx(30.0)
    assert row["rss_mb_per_h"] == pytest.approx(0.0)
    assert row["start"] == {"rss_mb": 100, "open_files": 9}
