"""The `make up` pool placed on a wide-area testbed (deploy/local/placement.py `OnTestbed`):
Redis, the chain, the orchestrator, the origin, the trainer and the validator on the operator's
host, a relay and two workers on home links in a region 200 ms away. Every process talks to
every other through the link emulator; the run trains every step and nothing honest is refused
but for age. bench/wan runs the large version of this (nine workers, three regions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.placement import OnTestbed
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.deploy.testbed.net import LiveTestbed, available
from prime_swarm.deploy.testbed.topology import Testbed
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import Verdict

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
BED = {
    "name": "pool-test",
    "tag": "wpool",
    "subnet": "10.80",
    "regions": {"op": {"rtt_ms": 1}, "far": {"rtt_ms": 20, "jitter_ms": 2}},
    "links": [{"between": ["op", "far"], "rtt_ms": 200, "jitter_ms": 10}],
    "hosts": {
        "operator": {"region": "op", "up_mbit": 1000, "down_mbit": 1000,
                     "ports": [6379, 8000, 8545, 8700]},
        "relay-far": {"region": "far", "up_mbit": 1000, "down_mbit": 1000, "ports": [8700]},
        "worker-far": {"region": "far", "count": 2, "up_mbit": 10, "down_mbit": 25},
    },
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
@pytest.mark.timeout(600)
def test_a_pool_trains_across_the_wide_area(tmp_path: Path) -> None:
    if why := available():
        pytest.fail(why)
    settings = LocalNetworkSettings(
        runs_dir=tmp_path, cache_dir=REPO / ".cache", steps=STEPS, workers=2, groups_per_step=8,
        lease_batch=4,
    )  # fmt: skip
    with LiveTestbed(Testbed.model_validate(BED), tmp_path / "bed") as live:
        placement = OnTestbed(
            live, {"operator": "operator", "relay-far": "relay-far"},
            ["worker-far-1", "worker-far-2"],
        )  # fmt: skip
        net = LocalNetwork(settings, prepare_model(settings), tmp_path / "run", placement)
        try:
            topo = net.start()
            assert topo.orchestrator_url.startswith(f"http://{live.hub_ip}:")
            rows = net.follow(lambda row: None, timeout_s=420)
            net.stop_workers()
            net.stop_validators()
            assert [r.step for r in rows] == list(range(1, STEPS + 1))
            assert net.redis is not None
            r = net.redis.client()
            rejected = [streams.decode(Verdict, f) for _, f in r.xrange(streams.ROLLOUTS_REJECTED)]
            assert {v.reason for v in rejected} <= {"stale_policy"}
            assert net.attested_units() > 0
        finally:
            net.stop()
        assert live.link_stats()["bytes"] > 0
