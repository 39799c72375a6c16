"""The operator's region cut off from its contributors for longer than `eject_after_s`, on the
wide-area testbed: Redis, the chain, the orchestrator, the trainer and the validator on the
operator's host, two workers on home links in a region 200 ms away. While the cut holds the
orchestrator hears nobody: the whole roster silent at once is the pool's outage, not two
departures, so nobody is ejected, and both workers ride it out and work again once it heals."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.placement import OnTestbed
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.deploy.testbed.net import LiveTestbed, available
from prime_swarm.deploy.testbed.topology import Testbed
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import StepProgress, VerifiedRollout

REPO = Path(__file__).resolve().parents[2]
STEPS, CUT_AT, EJECT_AFTER_S, CUT_S = 10, 3, 20.0, 50.0
BED = {
    "name": "cut-test",
    "tag": "wcut",
    "subnet": "10.81",
    "regions": {"op": {"rtt_ms": 1}, "far": {"rtt_ms": 20, "jitter_ms": 2}},
    "links": [{"between": ["op", "far"], "rtt_ms": 200, "jitter_ms": 10}],
    "hosts": {
        "operator": {"region": "op", "up_mbit": 1000, "down_mbit": 1000,
                     "ports": [6379, 8000, 8545, 8700]},
        "worker-far": {"region": "far", "count": 2, "up_mbit": 10, "down_mbit": 25},
    },
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
@pytest.mark.timeout(900)
def test_the_operators_region_cut_off_past_eject_after_ejects_nobody(tmp_path: Path) -> None:
    if why := available():
        pytest.fail(why)
    settings = LocalNetworkSettings(
        runs_dir=tmp_path, cache_dir=REPO / ".cache", steps=STEPS, workers=2, groups_per_step=4,
        lease_batch=2, eject_after_s=EJECT_AFTER_S,
    )  # fmt: skip
    healed_at: list[float] = []
    with LiveTestbed(Testbed.model_validate(BED), tmp_path / "bed") as live:
        placement = OnTestbed(live, {"operator": "operator"}, ["worker-far-1", "worker-far-2"])
        net = LocalNetwork(settings, prepare_model(settings), tmp_path / "run", placement)

        def heal() -> None:
            live.heal("op")
            healed_at.append(time.time())

        def on_step(row: StepProgress) -> None:
            if row.step == CUT_AT and not healed_at:
                live.cut("op")
                threading.Timer(CUT_S, heal).start()

        try:
            net.start()
            rows = net.follow(on_step, timeout_s=720)
            books = net.close_books()
            ledger = LedgerClient(net.topo.rpc_url, net.topo.ledger, account=None, timeout=30)
            members = [ledger.is_member(net.topo.pool_id, w) for w in net.topo.workers]
            assert net.redis is not None
            r = net.redis.client()
            verified = [
                streams.decode(VerifiedRollout, f) for _, f in r.xrange(streams.ROLLOUTS_VERIFIED)
            ]
            log = (net.logs / "orchestrator.log").read_text()
        finally:
            net.stop()
    assert healed_at, "the run ended before the cut healed"
    assert [r.step for r in rows] == list(range(1, STEPS + 1))
    assert members == [True, True], log[-3000:]
    assert "workers silent at once" in log
    # Both workers worked again after the cut healed.
    after = {v.worker.lower() for v in verified if v.submitted_at > healed_at[0]}
    assert after == {w.lower() for w in net.topo.workers}, after
    rollouts = books["rollouts"]
    assert rollouts["trained_twice"] == 0 and rollouts["unaccounted"] == 0, books  # type: ignore[index]
