"""A worker that cannot build one of the pool's environments says so when it joins
(services/worker/runner.require_environments), naming the environment."""

from __future__ import annotations

import pytest

from prime_swarm.protocol.messages import PoolEnvironment
from prime_swarm.services.worker.onboarding import JoinError
from prime_swarm.services.worker.runner import require_environments


def test_every_environment_of_the_mixture_is_built() -> None:
    require_environments(
        [PoolEnvironment(env="reverse", weight=2), PoolEnvironment(env="addition", weight=1)]
    )


@pytest.mark.parametrize(
    ("pooled", "says"),
    [
        (PoolEnvironment(env="no-such-env"), "unknown environment 'no-such-env'"),
        (PoolEnvironment(env="reverse", env_args={"dataset": "x"}), "refused its arguments"),
    ],
)
def test_a_missing_or_unbuildable_one_stops_the_join(pooled: PoolEnvironment, says: str) -> None:
    with pytest.raises(JoinError, match=says) as err:
        require_environments([PoolEnvironment(env="reverse"), pooled])
    assert str(err.value).startswith("cannot answer this pool's leases")
