"""SwarmLedger through LedgerClient against a real anvil: every rule and every event."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import TxReceipt

from prime_swarm.libs.chain import merkle
from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.chain.client import MAX_BATCH, LedgerClient, to_address
from prime_swarm.libs.chain.deploy import deploy_ledger
from prime_swarm.libs.chain.deployment import Deployment
from prime_swarm.libs.chain.errors import ChainError, ChainRevert
from prime_swarm.libs.chain.models import PoolStatus, SkipReason, Work

ETH = 10**18
MIN_STAKE = ETH
RATE = 10**12  # wei per unit
# Short, so that tests reach the end of unbonding and of the challenge window with a cheap
# `anvil_mine`.
UNBONDING = 20
CHALLENGE = 10
TRAINER = Web3.to_checksum_address("0x" + "7e" * 20)
ZERO = "0x" + "00" * 20


class Actors:
    """One client per role, all on the module's ledger."""

    def __init__(self, deployment: Deployment, accounts: list[LocalAccount]) -> None:
        self.deployment = deployment
        self.accounts = accounts
        self.owner = self.client(0)
        self.validator = self.client(1)
        self.workers = [self.client(i) for i in (2, 3, 4)]
        self.stranger = self.client(5)
        self.reader = LedgerClient.from_deployment(deployment)

    def client(self, index: int) -> LedgerClient:
        return LedgerClient.from_deployment(self.deployment, self.accounts[index], timeout=10)

    @staticmethod
    def addr(client: LedgerClient) -> str:
        assert client.account is not None
        return client.account.address


@pytest.fixture(scope="module")
def actors(anvil: Anvil) -> Actors:
    accounts = anvil.dev_accounts(20)
    deployment = deploy_ledger(
        anvil.rpc_url, accounts[0], unbonding_blocks=UNBONDING, challenge_blocks=CHALLENGE
    )
    return Actors(deployment, accounts)


@pytest.fixture
def pool(actors: Actors) -> int:
    """A fresh pool per test, with a registered validator and one staked worker."""
    pid = actors.owner.create_pool("http://orchestrator.test", MIN_STAKE, RATE, TRAINER)
    actors.owner.register_validator(pid, Actors.addr(actors.validator))
    actors.workers[0].join(pid, MIN_STAKE)
    return pid


def mature(client: LedgerClient) -> None:
    """Mine past the challenge window of everything attested so far."""
    mine_until(client, client.block_number() + 2 * CHALLENGE)


def gas_cost(client: LedgerClient, tx_hash: bytes | str) -> int:
    receipt = client.w3.eth.get_transaction_receipt(tx_hash)
    return receipt["gasUsed"] * receipt["effectiveGasPrice"]


def mine_until(client: LedgerClient, block: int) -> None:
    """Mine empty blocks until `block` is the latest (anvil mines only per transaction)."""
    missing = block - client.block_number()
    if missing > 0:
        reply = client.w3.provider.make_request("anvil_mine", [hex(missing)])
        assert "error" not in reply, reply
    assert client.block_number() >= block


def event_names(client: LedgerClient, pool_id: int, from_block: int) -> list[str]:
    # Every event of the ABI, so a new one cannot slip past a test's exact list.
    names = [item["name"] for item in client.contract.abi if item["type"] == "event"]
    found = [
        (ev["blockNumber"], ev["logIndex"], name)
        for name in names
        for ev in client.events(name, from_block=from_block, pool_id=pool_id)
    ]
    return [name for *_, name in sorted(found)]


# Views of the ledger that no service reads, called on the contract itself.
def settled(client: LedgerClient, pool_id: int, worker: str, work_id: int) -> bool:
    """Whether item `work_id` of `worker` is attested or slashed (either is final)."""
    return client.contract.functions.is_settled(pool_id, to_address(worker), work_id).call()


def proves(
    client: LedgerClient, pool_id: int, batch_id: int, item: Work, proof: list[bytes]
) -> bool:
    """The ledger's own answer: was `item` credited in the batch?"""
    worker = to_address(item.worker)
    return client.contract.functions.verify_item(
        pool_id, batch_id, worker, item.work_id, item.units, proof
    ).call()


# --- deployment and pools -----------------------------------------------------------------------


def test_deployment_record_and_checks(anvil: Anvil, actors: Actors) -> None:
    d = actors.deployment
    assert d.chain_id == anvil.chain_id == 31337
    assert d.deployer == actors.accounts[0].address
    assert d.slash_bps == actors.reader.slash_bps() == 1000
    assert d.unbonding_blocks == actors.reader.unbonding_blocks() == UNBONDING
    assert d.challenge_blocks == actors.reader.challenge_blocks() == CHALLENGE
    with pytest.raises(ChainError, match="unbonding_blocks must be >= 0"):
        deploy_ledger(anvil.rpc_url, actors.accounts[0], unbonding_blocks=-1)
    # A window longer than unbonding would let a disputed worker withdraw before the dispute.
    with pytest.raises(ChainError, match="challenge_blocks must be within 0..unbonding_blocks"):
        deploy_ledger(anvil.rpc_url, actors.accounts[0], unbonding_blocks=5, challenge_blocks=6)
    # The default window shrinks to a short unbonding period instead of failing.
    assert (
        deploy_ledger(anvil.rpc_url, actors.accounts[0], unbonding_blocks=5).challenge_blocks == 5
    )
    with pytest.raises(ChainError, match="deployment is on 1"):
        LedgerClient.from_deployment(Deployment(**{**d.__dict__, "chain_id": 1}))
    with pytest.raises(ChainError, match="no contract at"):
        LedgerClient.from_deployment(Deployment(**{**d.__dict__, "address": d.deployer}))


def test_create_pool_ids_views_and_events(actors: Actors) -> None:
    start = actors.reader.block_number() + 1
    first = actors.owner.create_pool("http://a.test", 5, 7, TRAINER)
    second = actors.workers[1].create_pool("http://b.test", 0, 0, TRAINER.lower())
    assert second == first + 1 == actors.reader.contract.functions.pool_count().call()

    p = actors.reader.get_pool(first)
    assert (p.owner, p.orchestrator_url, p.trainer, p.min_stake, p.reward_per_unit) == (
        Actors.addr(actors.owner), "http://a.test", TRAINER, 5, 7,
    )  # fmt: skip
    assert (p.funds, p.total_attested_units, p.status) == (0, 0, PoolStatus.ACTIVE)
    assert (p.reporter_bps, p.burn_slashed) == (1000, False)
    assert actors.reader.get_pool(second).owner == Actors.addr(actors.workers[1])

    [ev] = actors.reader.events("PoolCreated", from_block=start, pool_id=first)
    assert ev["args"]["owner"] == Actors.addr(actors.owner)
    assert ev["args"]["orchestrator_url"] == "http://a.test"
    assert ev["args"]["trainer"] == TRAINER

    with pytest.raises(ChainRevert) as err:
        actors.reader.get_pool(10_000)
    assert err.value.reason == "unknown pool"
    with pytest.raises(ChainRevert, match="empty orchestrator url"):
        actors.owner.create_pool("", 1, 1, TRAINER)
    # A pool nobody can sign policies for would be a pool workers cannot verify.
    with pytest.raises(ChainRevert, match="zero trainer"):
        actors.owner.create_pool("http://c.test", 1, 1, ZERO)
    with pytest.raises(ChainError, match="invalid address"):
        actors.owner.create_pool("http://c.test", 1, 1, "0x1234")


def test_orchestrator_url_owner_only(actors: Actors, pool: int) -> None:
    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.set_orchestrator_url(pool, "http://evil.test")
    start = actors.reader.block_number() + 1
    actors.owner.set_orchestrator_url(pool, "http://new.test:8000")
    assert actors.reader.get_pool(pool).orchestrator_url == "http://new.test:8000"
    assert event_names(actors.reader, pool, start) == ["OrchestratorUrlChanged"]


def test_trainer_owner_only(actors: Actors, pool: int) -> None:
    rotated = Actors.addr(actors.stranger)
    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.set_trainer(pool, rotated)
    with pytest.raises(ChainRevert, match="zero trainer"):
        actors.owner.set_trainer(pool, ZERO)
    with pytest.raises(ChainRevert, match="unknown pool"):
        actors.owner.set_trainer(10_000, rotated)
    assert actors.reader.get_pool(pool).trainer == TRAINER

    start = actors.reader.block_number() + 1
    actors.owner.set_trainer(pool, rotated)
    assert actors.reader.get_pool(pool).trainer == rotated
    [ev] = actors.reader.events("TrainerChanged", from_block=start, pool_id=pool)
    assert (ev["args"]["previous"], ev["args"]["trainer"]) == (TRAINER, rotated)
    assert event_names(actors.reader, pool, start) == ["TrainerChanged"]


def test_fund_pool(actors: Actors, pool: int) -> None:
    start = actors.reader.block_number() + 1
    actors.owner.fund_pool(pool, 3 * ETH)
    actors.stranger.fund_pool(pool, ETH)  # donations are allowed
    assert actors.reader.pool_funds(pool) == 4 * ETH
    evs = actors.reader.events("PoolFunded", from_block=start, pool_id=pool)
    assert [e["args"]["funds"] for e in evs] == [3 * ETH, 4 * ETH]
    with pytest.raises(ChainRevert, match="no value sent"):
        actors.owner.fund_pool(pool, 0)
    with pytest.raises(ChainRevert, match="unknown pool"):
        actors.owner.fund_pool(10_000, 1)


# --- stakes -------------------------------------------------------------------------------------


def test_join_below_min_stake_refused(actors: Actors, pool: int) -> None:
    worker = actors.workers[1]
    with pytest.raises(ChainRevert) as err:
        worker.join(pool, MIN_STAKE - 1)
    assert err.value.reason == "stake below pool minimum"
    assert not actors.reader.is_member(pool, Actors.addr(worker))


def test_join_top_up_and_leave_starts_unbonding(actors: Actors, pool: int) -> None:
    worker, me = actors.workers[1], Actors.addr(actors.workers[1])
    start = actors.reader.block_number() + 1
    worker.join(pool, MIN_STAKE)
    assert actors.reader.is_member(pool, me)
    assert actors.reader.unbonding_until(pool, me) == 0
    worker.join(pool, ETH // 2)  # a top-up
    assert actors.reader.stake_of(pool, me) == MIN_STAKE + ETH // 2

    before = actors.reader.balance_of(me)
    left = worker.leave(pool)
    # Nothing is paid on leaving: the stake stays in the pool, slashable, until unbonding ends.
    assert left.stake == MIN_STAKE + ETH // 2
    assert left.unbonding_until == left.tx.block_number + UNBONDING
    assert actors.reader.balance_of(me) == before - gas_cost(worker, left.tx.tx_hash)
    assert not actors.reader.is_member(pool, me)
    assert actors.reader.stake_of(pool, me) == left.stake
    assert actors.reader.unbonding_until(pool, me) == left.unbonding_until
    [ev] = actors.reader.events("WorkerLeft", from_block=start, pool_id=pool)
    assert (ev["args"]["worker"], ev["args"]["stake"], ev["args"]["unbonding_until"]) == (
        me, left.stake, left.unbonding_until,
    )  # fmt: skip
    assert event_names(actors.reader, pool, start) == ["WorkerJoined", "StakeAdded", "WorkerLeft"]

    with pytest.raises(ChainRevert, match="not a member"):
        worker.leave(pool)


def test_withdraw_pays_the_stake_once_unbonding_ends(actors: Actors, pool: int) -> None:
    worker, me = actors.workers[0], Actors.addr(actors.workers[0])
    left = worker.leave(pool)
    start = actors.reader.block_number() + 1
    with pytest.raises(ChainRevert) as err:
        worker.withdraw(pool)
    assert err.value.reason == "still unbonding"

    # The client checks against the latest block (gas estimation runs the call there), so it
    # withdraws once `block_number() >= unbonding_until`; one block short is refused...
    mine_until(actors.reader, left.unbonding_until - 1)
    with pytest.raises(ChainRevert, match="still unbonding"):
        worker.withdraw(pool)
    assert actors.reader.stake_of(pool, me) == MIN_STAKE

    # ...and from `unbonding_until` on it pays exactly the stake.
    mine_until(actors.reader, left.unbonding_until)
    before = actors.reader.balance_of(me)
    paid = worker.withdraw(pool)
    [ev] = actors.reader.events("StakeWithdrawn", from_block=start, pool_id=pool)
    assert paid == ev["args"]["amount"] == MIN_STAKE
    assert actors.reader.balance_of(me) == before + paid - gas_cost(worker, ev["transactionHash"])
    assert actors.reader.stake_of(pool, me) == 0
    assert actors.reader.unbonding_until(pool, me) == 0
    assert event_names(actors.reader, pool, start) == ["StakeWithdrawn"]

    with pytest.raises(ChainRevert, match="nothing to withdraw"):
        worker.withdraw(pool)


def test_unbonding_ends_exactly_at_unbonding_until(actors: Actors, pool: int) -> None:
    """On chain, a withdrawal mined in block `unbonding_until - 1` fails and one mined in block
    `unbonding_until` pays (sent raw, with a fixed gas limit, to get past the estimate)."""
    worker, me = actors.workers[0], Actors.addr(actors.workers[0])
    account, w3 = worker.account, worker.w3
    assert account is not None
    left = worker.leave(pool)

    def send_withdraw() -> TxReceipt:
        tx = worker.contract.functions.withdraw(pool).build_transaction(
            {"from": me, "nonce": w3.eth.get_transaction_count(me), "gas": 200_000}
        )
        signed = account.sign_transaction(tx)
        return w3.eth.wait_for_transaction_receipt(
            w3.eth.send_raw_transaction(signed.raw_transaction)
        )

    mine_until(actors.reader, left.unbonding_until - 2)
    early = send_withdraw()
    assert (early["blockNumber"], early["status"]) == (left.unbonding_until - 1, 0)
    on_time = send_withdraw()
    assert (on_time["blockNumber"], on_time["status"]) == (left.unbonding_until, 1)
    assert actors.reader.stake_of(pool, me) == 0


def test_withdraw_refusals(actors: Actors, pool: int) -> None:
    with pytest.raises(ChainRevert, match="still a member"):
        actors.workers[0].withdraw(pool)
    with pytest.raises(ChainRevert, match="nothing to withdraw"):
        actors.stranger.withdraw(pool)
    assert actors.reader.stake_of(pool, Actors.addr(actors.workers[0])) == MIN_STAKE


def test_rejoin_during_unbonding(actors: Actors, pool: int) -> None:
    worker, me = actors.workers[0], Actors.addr(actors.workers[0])
    worker.leave(pool)
    start = actors.reader.block_number() + 1
    # The stake still held counts toward the minimum: rejoining needs no new ether...
    worker.join(pool, 0)
    assert actors.reader.is_member(pool, me)
    assert actors.reader.stake_of(pool, me) == MIN_STAKE
    assert actors.reader.unbonding_until(pool, me) == 0
    [ev] = actors.reader.events("WorkerJoined", from_block=start, pool_id=pool)
    assert ev["args"]["stake"] == MIN_STAKE
    with pytest.raises(ChainRevert, match="still a member"):
        worker.withdraw(pool)

    # ...unless a slash during unbonding took it below; then the gap must be paid.
    worker.leave(pool)
    taken = actors.validator.slash(pool, me, 0, "bad proof").amount
    with pytest.raises(ChainRevert, match="stake below pool minimum"):
        worker.join(pool, taken - 1)
    worker.join(pool, taken)
    assert actors.reader.is_member(pool, me)
    assert actors.reader.stake_of(pool, me) == MIN_STAKE
    assert event_names(actors.reader, pool, start) == [
        "WorkerJoined", "WorkerLeft", "WorkerSlashed", "WorkerJoined",
    ]  # fmt: skip


# --- validators ---------------------------------------------------------------------------------


def test_only_owner_registers_validators(actors: Actors, pool: int) -> None:
    candidate = Actors.addr(actors.stranger)
    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.register_validator(pool, candidate)
    assert not actors.reader.is_validator(pool, candidate)

    start = actors.reader.block_number() + 1
    actors.owner.register_validator(pool, candidate)
    assert actors.reader.is_validator(pool, candidate)
    with pytest.raises(ChainRevert, match="already a validator"):
        actors.owner.register_validator(pool, candidate)
    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.remove_validator(pool, candidate)
    actors.owner.remove_validator(pool, candidate)
    assert not actors.reader.is_validator(pool, candidate)
    assert event_names(actors.reader, pool, start) == ["ValidatorRegistered", "ValidatorRemoved"]


def test_only_validators_attest(actors: Actors, pool: int) -> None:
    work = [Work(Actors.addr(actors.workers[0]), 0, 1)]
    for outsider in (actors.stranger, actors.owner, actors.workers[0]):
        with pytest.raises(ChainRevert) as err:
            outsider.attest_work(pool, work)
        assert err.value.reason == "not a validator"
    # A validator of another pool is an outsider here too.
    other = actors.owner.create_pool("http://other.test", 0, 0, TRAINER)
    with pytest.raises(ChainRevert, match="not a validator"):
        actors.validator.attest_work(other, work)
    assert not settled(actors.reader, pool, work[0].worker, 0)


# --- pool lifecycle -----------------------------------------------------------------------------


def test_pool_lifecycle_pending_active_ended(actors: Actors) -> None:
    owner, worker = actors.owner, actors.workers[0]
    a = Actors.addr(worker)
    start = actors.reader.block_number() + 1
    pid = owner.create_pool("http://life.test", MIN_STAKE, RATE, TRAINER, activate=False)
    assert actors.reader.get_pool(pid).status == PoolStatus.PENDING
    owner.register_validator(pid, Actors.addr(actors.validator))
    with pytest.raises(ChainRevert, match="pool not active"):
        worker.join(pid, MIN_STAKE)
    with pytest.raises(ChainRevert, match="pool not active"):
        actors.validator.attest_work(pid, [Work(a, 0, 1)])

    # The slash policy is set while pending, by the owner, within bounds.
    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.set_slash_policy(pid, 0, True)
    with pytest.raises(ChainRevert, match="reporter_bps above 10000"):
        owner.set_slash_policy(pid, 10_001, False)
    owner.set_slash_policy(pid, 2_500, True)

    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.activate_pool(pid)
    owner.activate_pool(pid)
    with pytest.raises(ChainRevert, match="pool not pending"):
        owner.activate_pool(pid)
    # ...and never again once workers can have joined under it.
    with pytest.raises(ChainRevert, match="pool not pending"):
        owner.set_slash_policy(pid, 0, False)
    worker.join(pid, MIN_STAKE)
    actors.validator.attest_work(pid, [Work(a, 0, 1)])

    with pytest.raises(ChainRevert, match="not the pool owner"):
        actors.stranger.end_pool(pid)
    owner.end_pool(pid)
    with pytest.raises(ChainRevert, match="pool already ended"):
        owner.end_pool(pid)
    with pytest.raises(ChainRevert, match="pool not active"):
        actors.workers[1].join(pid, MIN_STAKE)
    # Work leased before the end is still attested, and members still leave as usual.
    assert actors.validator.attest_work(pid, [Work(a, 1, 1)]).attested == [Work(a, 1, 1)]
    worker.leave(pid)

    p = actors.reader.get_pool(pid)
    assert (p.status, p.reporter_bps, p.burn_slashed) == (PoolStatus.ENDED, 2_500, True)
    statuses = [
        e["args"]["status"] for e in actors.reader.events("PoolStatusChanged", from_block=start)
    ]
    assert statuses == [PoolStatus.ACTIVE, PoolStatus.ENDED]
    assert event_names(actors.reader, pid, start) == [
        "PoolCreated", "ValidatorRegistered", "SlashPolicySet", "PoolStatusChanged",
        "WorkerJoined", "WorkCredited", "BatchAttested", "PoolStatusChanged",
        "WorkCredited", "BatchAttested", "WorkerLeft",
    ]  # fmt: skip


# --- attested work ------------------------------------------------------------------------------


def test_attest_credits_units_and_commits_a_merkle_root(actors: Actors, pool: int) -> None:
    a, b = Actors.addr(actors.workers[0]), Actors.addr(actors.workers[1])
    actors.workers[1].join(pool, MIN_STAKE)
    start = actors.reader.block_number() + 1
    work = [Work(b, 0, 5)] + [Work(a, i, 2) for i in range(3)]

    result = actors.validator.attest_work(pool, work)
    ordered = sorted(work, key=lambda w: (w.worker.lower(), w.work_id))
    assert result.attested == ordered and result.skipped == []
    [batch] = result.batches
    assert batch.batch_id == 1 == actors.reader.batch_count(pool)
    assert batch.root == merkle.root(pool, ordered)
    assert actors.reader.work_units(pool, a) == 6
    assert actors.reader.work_units(pool, b) == 5
    assert actors.reader.attested_units(pool) == 11
    assert actors.reader.get_pool(pool).total_attested_units == 11
    # Credited, but inside the challenge window: pending, not claimable.
    rewards = actors.reader.rewards(pool, a)
    assert (rewards.claimable, rewards.pending) == (0, 6 * RATE)
    assert actors.reader.reward_balance(pool, b) == 5 * RATE
    assert all(settled(actors.reader, pool, w.worker, w.work_id) for w in work)
    assert not settled(actors.reader, pool, a, 3)
    assert actors.reader.work_id_floor(pool, a) == 3
    assert actors.reader.work_id_floor(pool, b) == 1

    # Every item proves against the root, on chain; a changed item does not.
    for i, item in enumerate(ordered):
        proof = merkle.proof(pool, ordered, i)
        assert merkle.verify(pool, item, proof, batch.root)
        assert proves(actors.reader, pool, batch.batch_id, item, proof)
    proof = merkle.proof(pool, ordered, 0)
    forged = Work(ordered[0].worker, ordered[0].work_id, ordered[0].units + 1)
    assert not proves(actors.reader, pool, batch.batch_id, forged, proof)
    assert not proves(actors.reader, pool, 99, ordered[0], proof)

    credited = [
        e["args"] for e in actors.reader.events("WorkCredited", from_block=start, pool_id=pool)
    ]
    assert sorted((e.worker, e.items, e.units, e.reward) for e in credited) == sorted(
        [(a, 3, 6, 6 * RATE), (b, 1, 5, 5 * RATE)]
    )
    assert {e.batch_id for e in credited} == {1}
    assert len(actors.reader.events("WorkCredited", from_block=start, pool_id=pool, worker=b)) == 1
    assert event_names(actors.reader, pool, start) == [
        "WorkCredited", "WorkCredited", "BatchAttested",
    ]  # fmt: skip


def test_double_attestation_is_skipped(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    actors.validator.attest_work(pool, [Work(a, 0, 4)])
    start = actors.reader.block_number() + 1

    # A retry of the same item, and an item repeated inside one batch: paid once each.
    result = actors.validator.attest_work(pool, [Work(a, 0, 4), Work(a, 1, 1), Work(a, 1, 1)])
    assert result.attested == [Work(a, 1, 1)]
    assert [(s.work_id, s.reason) for s in result.skipped] == [
        (0, SkipReason.SETTLED),
        (1, SkipReason.SETTLED),
    ]
    assert actors.reader.work_units(pool, a) == 5
    assert actors.reader.reward_balance(pool, a) == 5 * RATE
    assert [b.items for b in result.batches] == [[Work(a, 1, 1)]]
    assert event_names(actors.reader, pool, start) == [
        "WorkSkipped", "WorkSkipped", "WorkCredited", "BatchAttested",
    ]  # fmt: skip
    # A batch that credits nothing commits nothing.
    again = actors.validator.attest_work(pool, [Work(a, 0, 4)])
    assert again.batches == [] and actors.reader.batch_count(pool) == 2


def test_sparse_work_ids_are_still_exact(actors: Actors, pool: int) -> None:
    """Ids far apart (a counter restarted from elsewhere) cost a word each but stay exact."""
    a = Actors.addr(actors.workers[0])
    far = [0, 255, 256, 2**64, 2**127]
    assert len(actors.validator.attest_work(pool, [Work(a, i, 1) for i in far]).attested) == 5
    assert all(settled(actors.reader, pool, a, i) for i in far)
    assert not any(settled(actors.reader, pool, a, i) for i in (1, 254, 257, 2**64 + 1))
    again = actors.validator.attest_work(pool, [Work(a, i, 1) for i in far])
    assert again.attested == [] and len(again.skipped) == 5
    assert actors.reader.work_id_floor(pool, a) == 2**127 + 1


def test_non_member_work_is_skipped(actors: Actors, pool: int) -> None:
    outsider = Actors.addr(actors.stranger)
    result = actors.validator.attest_work(pool, [Work(outsider, 0, 3)])
    assert result.attested == []
    assert [s.reason for s in result.skipped] == [SkipReason.NOT_MEMBER]
    assert actors.reader.reward_balance(pool, outsider) == 0
    assert not settled(actors.reader, pool, outsider, 0)  # still open once they join


def test_malformed_batches_refused(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    with pytest.raises(ChainError, match="units must be positive"):
        actors.validator.attest_work(pool, [Work(a, 0, 0)])
    with pytest.raises(ChainError, match="work id out of range"):
        actors.validator.attest_work(pool, [Work(a, -1, 1)])
    with pytest.raises(ChainError, match="invalid address"):
        actors.validator.attest_work(pool, [Work("0x1234", 0, 1)])
    # The contract's own checks, reached without the client's validation.
    fn = actors.validator.contract.functions.attest_work(pool, [a, a], [0], [1])
    with pytest.raises(ChainRevert, match="array lengths differ"):
        actors.validator._send(fn, "attest_work")
    fn = actors.validator.contract.functions.attest_work(pool, [a], [0], [0])
    with pytest.raises(ChainRevert, match="zero units"):
        actors.validator._send(fn, "attest_work")


def test_batches_beyond_max_are_split(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    work = [Work(a, i, 1) for i in range(MAX_BATCH + 6)]
    result = actors.validator.attest_work(pool, work)
    assert len(result.txs) == 2 and len(result.batches) == 2
    assert len(result.attested) == MAX_BATCH + 6
    assert actors.reader.attested_units(pool) == MAX_BATCH + 6
    # The biggest batch's root still proves its items (the deepest proof the ledger takes).
    big = result.batches[0]
    assert len(big.items) == MAX_BATCH
    proof = merkle.proof(pool, big.items, MAX_BATCH - 1)
    assert proves(actors.reader, pool, big.batch_id, big.items[-1], proof)


def test_batch_items_rebuilt_from_the_chain_alone(actors: Actors, pool: int) -> None:
    """The audit path: a reader with nothing but an RPC URL recovers a batch's items from its
    calldata (less what the contract skipped) and proves each against the stored root."""
    a, b = Actors.addr(actors.workers[0]), Actors.addr(actors.workers[1])
    actors.workers[1].join(pool, MIN_STAKE)
    actors.validator.attest_work(pool, [Work(a, 2, 1)])
    sent = [Work(a, i, 3) for i in range(4)] + [
        Work(b, 0, 7),
        Work(actors.owner.account.address, 0, 1),
    ]
    result = actors.validator.attest_work(pool, sent)
    [batch] = result.batches
    items = actors.reader.batch_items(pool, batch.batch_id)
    assert items == batch.items == result.attested
    assert Work(a, 2, 3) not in items and len(items) == 4  # settled before / not a member
    info = actors.reader.batch(pool, batch.batch_id)
    assert (info.root, info.items, info.units, info.validator) == (
        batch.root, 4, 3 * 3 + 7, Actors.addr(actors.validator),
    )  # fmt: skip
    for i, item in enumerate(items):
        assert proves(actors.reader, pool, batch.batch_id, item, merkle.proof(pool, items, i))
    with pytest.raises(ChainError, match="has no batch"):
        actors.reader.batch(pool, 42)


# --- slashing -----------------------------------------------------------------------------------


def test_slash_pays_the_reporter_funds_the_pool_and_settles_the_item(
    actors: Actors, pool: int
) -> None:
    a, validator = Actors.addr(actors.workers[0]), Actors.addr(actors.validator)
    start = actors.reader.block_number() + 1

    with pytest.raises(ChainRevert, match="not a validator"):
        actors.stranger.slash(pool, a, 0, "bad proof", amount=1)

    before = actors.reader.balance_of(validator)
    result = actors.validator.slash(pool, a, 0, "toploc proof mismatch")
    assert result.amount == MIN_STAKE * 1000 // 10_000  # the largest share: SLASH_BPS
    assert result.reporter_share == result.amount // 10 and result.burnt == 0
    assert actors.reader.stake_of(pool, a) == MIN_STAKE - result.amount
    assert actors.reader.pool_funds(pool) == result.amount - result.reporter_share
    fee = gas_cost(actors.validator, result.tx.tx_hash)
    assert actors.reader.balance_of(validator) == before + result.reporter_share - fee
    assert settled(actors.reader, pool, a, 0)

    [ev] = actors.reader.worker_slashed_events(pool, from_block=start)
    assert (ev.worker, ev.work_id, ev.amount, ev.reason, ev.validator) == (
        a, 0, result.amount, "toploc proof mismatch", validator,
    )  # fmt: skip

    # Topped back up to the minimum (a member below it is paid nothing: see the test below).
    actors.workers[0].join(pool, result.amount)
    # Rejected work is never paid afterwards, and cannot be slashed twice.
    attest = actors.validator.attest_work(pool, [Work(a, 0, 9)])
    assert [s.reason for s in attest.skipped] == [SkipReason.SETTLED]
    assert actors.reader.reward_balance(pool, a) == 0
    with pytest.raises(ChainRevert, match="work already settled"):
        actors.validator.slash(pool, a, 0, "again", amount=0)
    # ...and attested work cannot be slashed (a dispute is the way to reverse it).
    actors.validator.attest_work(pool, [Work(a, 1, 1)])
    with pytest.raises(ChainRevert, match="work already settled"):
        actors.validator.slash(pool, a, 1, "late", amount=0)

    stake = actors.reader.stake_of(pool, a)
    with pytest.raises(ChainRevert, match="slash exceeds stake"):
        actors.validator.slash(pool, a, 2, "too much", amount=stake + 1)
    with pytest.raises(ChainRevert, match="slash above SLASH_BPS of stake"):
        actors.validator.slash(pool, a, 2, "too much", amount=stake // 2)
    assert actors.reader.stake_of(pool, a) == stake and not settled(actors.reader, pool, a, 2)
    assert event_names(actors.reader, pool, start) == [
        "WorkerSlashed", "StakeAdded", "WorkSkipped", "WorkCredited", "BatchAttested",
    ]  # fmt: skip


def test_a_member_slashed_below_the_minimum_is_paid_again_only_after_a_top_up(
    actors: Actors, pool: int
) -> None:
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    taken = actors.validator.slash(pool, a, 0, "toploc proof mismatch").amount
    assert actors.reader.is_member(pool, a) and actors.reader.stake_of(pool, a) < MIN_STAKE
    result = actors.validator.attest_work(pool, [Work(a, 1, 3)])
    assert result.attested == []
    assert [(s.worker, s.reason) for s in result.skipped] == [(a, SkipReason.BELOW_MINIMUM)]
    assert actors.reader.work_units(pool, a) == 0 and not settled(actors.reader, pool, a, 1)
    worker.join(pool, taken)
    assert [w.work_id for w in actors.validator.attest_work(pool, [Work(a, 1, 3)]).attested] == [1]
    assert actors.reader.work_units(pool, a) == 3


def test_a_work_id_past_what_the_ledger_stores_is_refused(actors: Actors, pool: int) -> None:
    """One past a worker's highest id is kept in 128 bits: a larger id would wrap it."""
    a = Actors.addr(actors.workers[0])
    with pytest.raises(ChainError, match="work id out of range"):
        actors.validator.attest_work(pool, [Work(a, 2**128 - 1, 1)])
    fn = actors.validator.contract.functions.attest_work(pool, [a], [2**128 - 1], [1])
    with pytest.raises(ChainRevert, match="work id too large"):
        actors.validator._send(fn, "attest_work")
    with pytest.raises(ChainRevert, match="work id too large"):
        actors.validator.slash(pool, a, 2**256 - 1, "bad", amount=0)
    last = 2**128 - 2
    assert [w.work_id for w in actors.validator.attest_work(pool, [Work(a, last, 1)]).attested] == [
        last
    ]
    assert actors.reader.work_id_floor(pool, a) == 2**128 - 1


def test_slash_policy_can_burn_the_rest(actors: Actors) -> None:
    pid = actors.owner.create_pool("http://burn.test", MIN_STAKE, RATE, TRAINER, activate=False)
    actors.owner.set_slash_policy(pid, 0, True)
    actors.owner.register_validator(pid, Actors.addr(actors.validator))
    actors.owner.activate_pool(pid)
    a = Actors.addr(actors.workers[2])
    actors.workers[2].join(pid, MIN_STAKE)
    result = actors.validator.slash(pid, a, 0, "cheat")
    assert (result.reporter_share, result.burnt) == (0, result.amount)
    assert actors.reader.burnt(pid) == result.amount
    assert actors.reader.pool_funds(pid) == 0


def test_leaving_does_not_dodge_a_pending_slash(actors: Actors, pool: int) -> None:
    """The stake stays slashable while it unbonds; withdraw pays only what the slash left."""
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    left = worker.leave(pool)
    long_reason = "é" * 40  # 80 bytes: cut to the contract's 64, never refused
    taken = actors.validator.slash(pool, a, 0, long_reason).amount
    assert taken == MIN_STAKE * 1000 // 10_000
    [ev] = actors.reader.worker_slashed_events(pool, worker=a)
    assert ev.reason == "é" * 32
    assert settled(actors.reader, pool, a, 0)
    assert actors.reader.stake_of(pool, a) == MIN_STAKE - taken

    mine_until(actors.reader, left.unbonding_until)
    assert worker.withdraw(pool) == MIN_STAKE - taken


def test_attest_skips_a_worker_who_left(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    actors.workers[0].leave(pool)
    result = actors.validator.attest_work(pool, [Work(a, 0, 3)])
    assert result.attested == []
    assert [(s.worker, s.reason) for s in result.skipped] == [(a, SkipReason.NOT_MEMBER)]
    assert actors.reader.reward_balance(pool, a) == 0
    assert actors.reader.work_units(pool, a) == 0


# --- disputes -----------------------------------------------------------------------------------


def test_dispute_reverses_an_attested_item_inside_the_window(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    items = [Work(a, i, 4) for i in range(5)]
    [batch] = actors.validator.attest_work(pool, items).batches
    target, proof = items[2], merkle.proof(pool, items, 2)
    start = actors.reader.block_number() + 1

    with pytest.raises(ChainRevert, match="not a validator"):
        actors.stranger.dispute(pool, batch.batch_id, target, proof, "x", amount=0)
    with pytest.raises(ChainRevert, match="invalid merkle proof"):
        actors.validator.dispute(pool, batch.batch_id, target, proof[:-1], "x", amount=0)
    with pytest.raises(ChainRevert, match="invalid merkle proof"):
        actors.validator.dispute(pool, batch.batch_id, Work(a, 2, 5), proof, "x", amount=0)
    with pytest.raises(ChainRevert, match="unknown batch"):
        actors.validator.dispute(pool, 77, target, proof, "x", amount=0)

    result = actors.validator.dispute(pool, batch.batch_id, target, proof, "replayed proof")
    assert result.amount == MIN_STAKE * 1000 // 10_000
    assert actors.reader.work_units(pool, a) == 16
    assert actors.reader.attested_units(pool) == 16
    assert actors.reader.rewards(pool, a).pending == 16 * RATE
    assert actors.reader.stake_of(pool, a) == MIN_STAKE - result.amount
    [ev] = actors.reader.events("WorkDisputed", from_block=start, pool_id=pool)
    assert (ev["args"]["work_id"], ev["args"]["units"], ev["args"]["reward"]) == (2, 4, 4 * RATE)
    with pytest.raises(ChainRevert, match="already disputed"):
        actors.validator.dispute(pool, batch.batch_id, target, proof, "again", amount=0)
    assert event_names(actors.reader, pool, start) == ["WorkDisputed", "WorkerSlashed"]

    # Once the window has passed, the attestation stands and its reward can be claimed.
    mine_until(actors.reader, batch.tx.block_number + CHALLENGE)
    with pytest.raises(ChainRevert, match="challenge window closed"):
        actors.validator.dispute(
            pool, batch.batch_id, items[0], merkle.proof(pool, items, 0), "late", amount=0
        )
    mature(actors.reader)
    actors.owner.fund_pool(pool, ETH)
    assert actors.workers[0].claim_rewards(pool) == 16 * RATE


# --- rewards ------------------------------------------------------------------------------------


def test_rewards_claimable_after_the_window_and_capped_by_funds(actors: Actors, pool: int) -> None:
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    with pytest.raises(ChainRevert, match="no matured rewards"):
        worker.claim_rewards(pool)
    attested = actors.validator.attest_work(pool, [Work(a, i, 10) for i in range(3)])
    owed = 30 * RATE
    actors.owner.fund_pool(pool, 20 * RATE)
    # Inside the challenge window nothing is claimable, funded or not.
    with pytest.raises(ChainRevert, match="no matured rewards"):
        worker.claim_rewards(pool)
    # A credit matures at the start of the epoch after next: strictly after its window.
    epoch = attested.batches[0].tx.block_number // CHALLENGE
    mine_until(actors.reader, (epoch + 2) * CHALLENGE - 2)
    with pytest.raises(ChainRevert, match="no matured rewards"):
        worker.claim_rewards(pool)
    mine_until(actors.reader, (epoch + 2) * CHALLENGE)
    assert actors.reader.rewards(pool, a).claimable == owed

    start = actors.reader.block_number() + 1
    assert worker.claim_rewards(pool) == 20 * RATE  # underfunded: pays what it can
    assert actors.reader.reward_balance(pool, a) == owed - 20 * RATE
    assert actors.reader.pool_funds(pool) == 0
    with pytest.raises(ChainRevert, match="pool has no funds"):
        worker.claim_rewards(pool)

    actors.owner.fund_pool(pool, ETH)
    before = actors.reader.balance_of(a)
    paid = worker.claim_rewards(pool)
    assert paid == owed - 20 * RATE
    assert actors.reader.reward_balance(pool, a) == 0
    assert actors.reader.pool_funds(pool) == ETH - paid

    claims = actors.reader.events("RewardsClaimed", from_block=start, pool_id=pool)
    fee = gas_cost(worker, claims[-1]["transactionHash"])
    assert actors.reader.balance_of(a) == before + paid - fee
    assert [(e["args"]["amount"], e["args"]["remaining"]) for e in claims] == [
        (20 * RATE, owed - 20 * RATE),
        (paid, 0),
    ]


def test_rewards_across_epochs_keep_their_own_windows(actors: Actors, pool: int) -> None:
    """Credits of consecutive epochs sit in two buckets; each matures on its own."""
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    actors.owner.fund_pool(pool, ETH)
    first = actors.validator.attest_work(pool, [Work(a, 0, 1)]).batches[0].tx.block_number
    e1 = first // CHALLENGE
    mine_until(actors.reader, (e1 + 1) * CHALLENGE)  # the next epoch
    actors.validator.attest_work(pool, [Work(a, 1, 2)])
    mine_until(actors.reader, (e1 + 2) * CHALLENGE)
    assert (actors.reader.rewards(pool, a).claimable, actors.reader.rewards(pool, a).pending) == (
        RATE, 2 * RATE,
    )  # fmt: skip
    actors.validator.attest_work(pool, [Work(a, 2, 4)])  # reuses the first, matured bucket
    assert actors.reader.rewards(pool, a).pending == 6 * RATE
    assert worker.claim_rewards(pool) == RATE
    mature(actors.reader)
    mature(actors.reader)
    assert worker.claim_rewards(pool) == 6 * RATE


def test_a_matured_bucket_moved_to_claimable_is_paid_once(actors: Actors, pool: int) -> None:
    """Credits in epochs e and e + 1, then one in e + 3: both buckets have matured and both are
    moved to claimable; the one not reused must be emptied, or the next credit moves (and a
    claim pays) it again. Found by the ledger's state machine (test_ledger_invariants.py)."""
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    actors.owner.fund_pool(pool, ETH)
    first = actors.validator.attest_work(pool, [Work(a, 0, 1)]).batches[0].tx.block_number
    e = first // CHALLENGE
    mine_until(actors.reader, (e + 1) * CHALLENGE)
    actors.validator.attest_work(pool, [Work(a, 1, 2)])
    mine_until(actors.reader, (e + 3) * CHALLENGE)
    actors.validator.attest_work(pool, [Work(a, 2, 4)])
    actors.validator.attest_work(pool, [Work(a, 3, 8)])  # same epoch: reuses the new bucket
    assert (actors.reader.rewards(pool, a).claimable, actors.reader.rewards(pool, a).pending) == (
        3 * RATE, 12 * RATE,
    )  # fmt: skip
    assert worker.claim_rewards(pool) == 3 * RATE
    mature(actors.reader)
    mature(actors.reader)
    assert worker.claim_rewards(pool) == 12 * RATE
    assert actors.reader.rewards(pool, a).claimable == 0


def test_rewards_survive_leaving(actors: Actors, pool: int) -> None:
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    actors.owner.fund_pool(pool, ETH)
    actors.validator.attest_work(pool, [Work(a, 0, 7)])
    worker.leave(pool)
    mature(actors.reader)
    assert worker.claim_rewards(pool) == 7 * RATE


def test_reentrant_withdraw_and_claim_are_refused(actors: Actors, pool: int) -> None:
    """A worker contract that calls back into the ledger when paid: paying out the stake, it
    tries to claim its rewards too, and paying its rewards, to withdraw. The other call would
    succeed on its own; inside a payment the lock refuses it, and each payment happens once."""
    from prime_swarm.libs.chain.compile import compile_source
    from prime_swarm.libs.chain.transactions import TxSender

    owner = actors.accounts[13]
    sender = TxSender(actors.reader.w3, owner, timeout=10)
    artifact = compile_source(Path(__file__).parent / "contracts" / "ReentrantWorker.vy")
    factory = actors.reader.w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    receipt = sender.send(factory.constructor(actors.reader.address, pool), "deploy attacker")
    attacker = actors.reader.w3.eth.contract(
        address=receipt["contractAddress"], abi=artifact["abi"]
    )
    addr = attacker.address

    sender.send(attacker.functions.join(), "join", value=MIN_STAKE)
    actors.validator.attest_work(pool, [Work(addr, 0, 5)])
    actors.owner.fund_pool(pool, ETH)
    sender.send(attacker.functions.leave(), "leave")
    mine_until(actors.reader, actors.reader.unbonding_until(pool, addr))
    mature(actors.reader)

    sender.send(attacker.functions.withdraw(2), "withdraw, re-entering claim")
    assert (
        attacker.functions.reentered().call() and not attacker.functions.reentry_succeeded().call()
    )
    assert attacker.functions.received().call() == MIN_STAKE
    assert actors.reader.rewards(pool, addr).claimable == 5 * RATE  # untouched by the attempt

    sender.send(attacker.functions.join(), "rejoin", value=MIN_STAKE)
    sender.send(attacker.functions.leave(), "leave")
    mine_until(actors.reader, actors.reader.unbonding_until(pool, addr))
    sender.send(attacker.functions.claim(1), "claim, re-entering withdraw")
    assert (
        attacker.functions.reentered().call() and not attacker.functions.reentry_succeeded().call()
    )
    assert attacker.functions.received().call() == MIN_STAKE + 5 * RATE
    assert actors.reader.stake_of(pool, addr) == MIN_STAKE  # the re-entrant withdraw failed
    assert actors.reader.balance_of(actors.reader.address) >= MIN_STAKE


# --- clients ------------------------------------------------------------------------------------


def test_read_only_client_cannot_send(actors: Actors, pool: int) -> None:
    with pytest.raises(ChainError, match="read-only"):
        actors.reader.join(pool, MIN_STAKE)


def test_unreachable_node_is_a_chain_error(actors: Actors) -> None:
    from prime_swarm.libs.chain.anvil import free_port

    client = LedgerClient(f"http://127.0.0.1:{free_port()}", actors.deployment.address)
    with pytest.raises(ChainError, match="cannot reach the node"):
        client.block_number()


def test_concurrent_accounts_and_a_shared_client(actors: Actors, anvil: Anvil) -> None:
    """Accounts sending at once never collide on nonces; one client shared by threads neither."""
    pid = actors.owner.create_pool("http://concurrent.test", 1, 1, TRAINER)
    clients = [actors.client(i) for i in range(6, 12)]
    errors: list[BaseException] = []

    def run(fn, *args) -> None:  # type: ignore[no-untyped-def]
        try:
            fn(*args)
        except BaseException as exc:  # reported below, on the main thread
            errors.append(exc)

    def join_and_fund(c: LedgerClient) -> None:
        c.join(pid, 1)
        for _ in range(3):
            c.fund_pool(pid, 1)

    threads = [threading.Thread(target=run, args=(join_and_fund, c)) for c in clients]
    shared = actors.client(12)
    threads += [threading.Thread(target=run, args=(shared.fund_pool, pid, 1)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert actors.reader.pool_funds(pid) == len(clients) * 3 + 6
    assert all(actors.reader.is_member(pid, Actors.addr(c)) for c in clients)


def test_owner_ejects_a_member_without_a_slash(actors: Actors, pool: int) -> None:
    worker, me = actors.workers[0], Actors.addr(actors.workers[0])
    start = actors.reader.block_number() + 1
    for stranger in (actors.stranger, worker, actors.validator):
        with pytest.raises(ChainRevert, match="not the pool owner"):
            stranger.eject(pool, me, "silent")
    with pytest.raises(ChainRevert, match="not a member"):
        actors.owner.eject(pool, Actors.addr(actors.stranger), "silent")

    ejected = actors.owner.eject(pool, me, "no heartbeat for 300 s " + "é" * 40)
    assert ejected.stake == MIN_STAKE  # nothing taken
    assert ejected.unbonding_until == ejected.tx.block_number + UNBONDING
    assert not actors.reader.is_member(pool, me)
    assert actors.reader.stake_of(pool, me) == MIN_STAKE
    [ev] = actors.reader.events("WorkerEjected", from_block=start, pool_id=pool)
    assert ev["args"]["worker"] == me and ev["args"]["reason"].startswith("no heartbeat for 300 s")
    assert len(ev["args"]["reason"].encode()) <= 64
    assert event_names(actors.reader, pool, start) == ["WorkerEjected"]
    with pytest.raises(ChainRevert, match="not a member"):
        actors.owner.eject(pool, me, "again")

    # The stake comes back exactly as after `leave`; rejoining cancels nothing owed.
    mine_until(actors.reader, ejected.unbonding_until)
    assert worker.withdraw(pool) == MIN_STAKE
