"""`prime-swarm up --orchestrators 3 --workers 2` with two of the three replicas SIGKILLed at
once: the launcher restarts them as a deployment's supervisor would, the run trains to its last
step, nobody is ejected and the books balance."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.protocol.messages import StepProgress

REPO = Path(__file__).resolve().parents[2]
STEPS, KILL_AT = 6, 2


@pytest.mark.timeout(600)
def test_two_of_three_replicas_killed_at_once_cost_the_run_nothing(tmp_path: Path) -> None:
    s = LocalNetworkSettings(
        runs_dir=tmp_path,
        cache_dir=REPO / ".cache",
        steps=STEPS,
        workers=2,
        worker_backends=["hf"],
        orchestrators=3,
        groups_per_step=4,
        lease_batch=2,
        warm_start_steps=60,
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    net = LocalNetwork(s, prepare_model(s), run_dir)
    restarted: list[tuple[str, int | None]] = []
    try:
        net.start()

        def on_step(row: StepProgress) -> None:
            if row.step == KILL_AT:
                for name in ("orchestrator-0", "orchestrator-1"):
                    net.procs[name].kill()

        rows = net.follow(
            on_step, timeout_s=480, on_restart=lambda n, code, _: restarted.append((n, code))
        )
        books = net.close_books()
        ledger = LedgerClient(net.topo.rpc_url, net.topo.ledger, account=None, timeout=30)
        members = [ledger.is_member(net.topo.pool_id, w) for w in net.topo.workers]
    finally:
        net.stop()
    assert [r.step for r in rows] == list(range(1, STEPS + 1))
    assert sorted(restarted) == [("orchestrator-0", -9), ("orchestrator-1", -9)]
    assert members == [True, True]
    rollouts = books["rollouts"]
    assert rollouts["trained_twice"] == 0 and rollouts["unaccounted"] == 0, books  # type: ignore[index]
    assert books["onchain_units"] == books["validator_units"], books
