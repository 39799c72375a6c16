"""The whole network, for real: redis-server, anvil, relays, orchestrator, validator, trainer and
three workers as separate processes, each generating on a vLLM engine, for a few trainer steps,
on a mixture: the multi-turn game (guess-number: every episode is played turn by turn by the
worker and replayed by the validator) and string reversal, with live prompt selection on.
`test_make_up.py` runs the same network with transformers workers on a single-turn task."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.protocol import selection_records, streams
from prime_swarm.protocol.messages import Verdict, VerifiedRollout

REPO = Path(__file__).resolve().parents[2]
# Five steps: leases go out the moment the trainer takes a batch, before the version it trains
# is published, so the first three steps' groups may all come from v0 (lag 2 is admitted).
STEPS = 5


@pytest.fixture(scope="module")
def finished_network(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    run_dir = tmp_path_factory.mktemp("run")
    settings = LocalNetworkSettings(
        runs_dir=run_dir.parent,
        cache_dir=REPO / ".cache",
        steps=STEPS,
        workers=3,
        worker_backends=["vllm"],
        groups_per_step=6,
        # Two leases a request: one step's groups spread over all three workers, whose moves
        # to newer versions the tests below check (with 8, one worker can take a whole step).
        lease_batch=2,
        warm_start_steps=60,
        mixture=[{"env": "guess-number", "weight": 2}, {"env": "reverse"}],
        select_prompts=True,
        train_tasks=16,  # prompts recur within the run, so validators record pass rates twice
    )
    net = LocalNetwork(settings, prepare_model(settings), run_dir)
    try:
        net.start()
        rows = net.follow(lambda row: None, timeout_s=240)
        net.stop_workers()
        net.stop_validators()
        yield net, rows
    finally:
        net.stop()


@pytest.mark.timeout(420)
def test_rollouts_pass_every_stage(finished_network) -> None:  # noqa: ANN001
    net, rows = finished_network
    assert [r.step for r in rows] == list(range(1, STEPS + 1))
    counts = net.stream_counts()
    assert counts["submitted"] >= STEPS * 6
    assert counts["verified"] >= STEPS * 6
    # Honest workers are never rejected for cheating; a group that went stale while queued is
    # refused without slashing, and so is one equal token for token to another lease's group of
    # the same task and version (prompts recur here: a confident policy can repeat itself).
    r = net.redis.client()
    reasons = {streams.decode(Verdict, f).reason for _, f in r.xrange(streams.ROLLOUTS_REJECTED)}
    assert reasons <= {"stale_policy", "duplicate"}
    ledger = LedgerClient(net.topo.rpc_url, net.topo.ledger, account=None, timeout=30)
    assert ledger.worker_slashed_events(net.topo.pool_id) == []


def test_workers_moved_to_newer_policies(finished_network) -> None:  # noqa: ANN001
    net, _ = finished_network
    r = net.redis.client()
    versions = {
        streams.decode(VerifiedRollout, fields).policy_version
        for _, fields in r.xrange(streams.ROLLOUTS_VERIFIED)
    }
    assert 0 in versions and max(versions) >= 1
    workers_on_new = {
        streams.decode(VerifiedRollout, fields).worker
        for _, fields in r.xrange(streams.ROLLOUTS_VERIFIED)
        if streams.decode(VerifiedRollout, fields).policy_version >= 1
    }
    assert len(workers_on_new) >= 2


def test_every_worker_generated_on_vllm(finished_network) -> None:  # noqa: ANN001
    """The groups above (accepted by the real validator, never rejected for anything but
    staleness, trained on) all came from vLLM workers that reloaded new versions in place."""
    net, _ = finished_network
    assert {net.worker_backend(i) for i in range(len(net.topo.workers))} == {"vllm"}
    logs = [(net.logs / f"worker-{i}.log").read_text() for i in range(len(net.topo.workers))]
    assert all("registered" in log for log in logs)


def test_attested_work_is_on_chain(finished_network) -> None:  # noqa: ANN001
    net, _ = finished_network
    ledger = LedgerClient(net.topo.rpc_url, net.topo.ledger, account=None, timeout=30)
    assert ledger.attested_units(net.topo.pool_id) > 0
    credited = [w for w in net.topo.workers if ledger.work_units(net.topo.pool_id, w) > 0]
    assert len(credited) >= 2
    assert all(ledger.reward_balance(net.topo.pool_id, w) > 0 for w in credited)


def test_the_mixture_reached_every_stage_with_its_environment(finished_network) -> None:  # noqa: ANN001
    """Leases drawn from both environments, each group trained under its own name, the
    validators' pass rates recorded and the orchestrator's selection book kept per
    environment (which prompts it skips in a run this short is chance: the rule itself is
    tests/integration/test_lease_mixture.py)."""
    net, rows = finished_network
    r = net.redis.client()
    verified = [streams.decode(VerifiedRollout, f) for _, f in r.xrange(streams.ROLLOUTS_VERIFIED)]
    assert {v.env for v in verified} == {"guess-number", "reverse"}
    assert all(v.task_id.startswith(f"{v.env}/train/") for v in verified)
    trained = {env for row in rows for env in row.groups_by_env}
    assert trained == {"guess-number", "reverse"}
    assert all(set(row.reward_by_env) == set(row.groups_by_env) for row in rows)
    rates = r.hgetall(selection_records.PASS_RATES)
    assert rates and all(0.0 <= float(v) <= 1.0 for v in rates.values())
    assert {k.split(b":")[0] for k in rates} <= {b"guess-number", b"reverse"}
    book = net.selection_counts()
    assert set(book) == {"guess-number", "reverse"}
    assert all(c["drawn"] >= c.get("skipped", 0) for c in book.values())
