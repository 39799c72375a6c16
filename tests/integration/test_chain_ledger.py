"""SwarmLedger through LedgerClient against a real anvil: every rule and every event."""

from __future__ import annotations

import threading

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import TxReceipt

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.chain.client import MAX_BATCH, LedgerClient
from prime_swarm.libs.chain.deploy import deploy_ledger
from prime_swarm.libs.chain.deployment import Deployment
from prime_swarm.libs.chain.errors import ChainError, ChainRevert
from prime_swarm.libs.chain.models import SkipReason, Work, WorkStatus, work_key_for

ETH = 10**18
MIN_STAKE = ETH
RATE = 10**12  # wei per unit
# Short, so that tests reach the end of unbonding with a cheap `anvil_mine`.
UNBONDING = 20
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
    return Actors(deploy_ledger(anvil.rpc_url, accounts[0], unbonding_blocks=UNBONDING), accounts)


@pytest.fixture
def pool(actors: Actors) -> int:
    """A fresh pool per test, with a registered validator and one staked worker."""
    pid = actors.owner.create_pool("http://orchestrator.test", MIN_STAKE, RATE, TRAINER)
    actors.owner.register_validator(pid, Actors.addr(actors.validator))
    actors.workers[0].join(pid, MIN_STAKE)
    return pid


def keys(prefix: str, n: int) -> list[bytes]:
    return [work_key_for(f"{prefix}-{i}") for i in range(n)]


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


# --- deployment and pools -----------------------------------------------------------------------


def test_deployment_record_and_checks(anvil: Anvil, actors: Actors) -> None:
    d = actors.deployment
    assert d.chain_id == anvil.chain_id == 31337
    assert d.deployer == actors.accounts[0].address
    assert d.slash_bps == actors.reader.slash_bps() == 1000
    assert d.unbonding_blocks == actors.reader.unbonding_blocks() == UNBONDING
    with pytest.raises(ChainError, match="unbonding_blocks must be >= 0"):
        deploy_ledger(anvil.rpc_url, actors.accounts[0], unbonding_blocks=-1)
    with pytest.raises(ChainError, match="deployment is on 1"):
        LedgerClient.from_deployment(Deployment(**{**d.__dict__, "chain_id": 1}))
    with pytest.raises(ChainError, match="no contract at"):
        LedgerClient.from_deployment(Deployment(**{**d.__dict__, "address": d.deployer}))


def test_create_pool_ids_views_and_events(actors: Actors) -> None:
    start = actors.reader.block_number() + 1
    first = actors.owner.create_pool("http://a.test", 5, 7, TRAINER)
    second = actors.workers[1].create_pool("http://b.test", 0, 0, TRAINER.lower())
    assert second == first + 1 == actors.reader.pool_count()

    p = actors.reader.get_pool(first)
    assert (p.owner, p.orchestrator_url, p.trainer, p.min_stake, p.reward_per_unit) == (
        Actors.addr(actors.owner), "http://a.test", TRAINER, 5, 7,
    )  # fmt: skip
    assert (p.funds, p.total_attested_units) == (0, 0)
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
    taken = actors.validator.slash(pool, me, work_key_for("rejoin"), "bad proof").amount
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
    work = [Work(Actors.addr(actors.workers[0]), work_key_for("x"), 1)]
    for outsider in (actors.stranger, actors.owner, actors.workers[0]):
        with pytest.raises(ChainRevert) as err:
            outsider.attest_work(pool, work)
        assert err.value.reason == "not a validator"
    # A validator of another pool is an outsider here too.
    other = actors.owner.create_pool("http://other.test", 0, 0, TRAINER)
    with pytest.raises(ChainRevert, match="not a validator"):
        actors.validator.attest_work(other, work)
    assert actors.reader.work_status(pool, work[0].work_key) == WorkStatus.NONE


# --- attested work ------------------------------------------------------------------------------


def test_attest_credits_units_and_rewards(actors: Actors, pool: int) -> None:
    a, b = Actors.addr(actors.workers[0]), Actors.addr(actors.workers[1])
    actors.workers[1].join(pool, MIN_STAKE)
    start = actors.reader.block_number() + 1
    ka, kb = keys("credit-a", 3), keys("credit-b", 1)
    work = [Work(a, k, 2) for k in ka] + [Work(b, kb[0], 5)]

    result = actors.validator.attest_work(pool, work)
    assert result.attested == work and result.skipped == []
    assert actors.reader.work_units(pool, a) == 6
    assert actors.reader.work_units(pool, b) == 5
    assert actors.reader.reward_balance(pool, a) == 6 * RATE
    assert actors.reader.reward_balance(pool, b) == 5 * RATE
    assert actors.reader.attested_units(pool) == 11
    assert actors.reader.get_pool(pool).total_attested_units == 11
    assert all(actors.reader.work_status(pool, k) == WorkStatus.ATTESTED for k in ka + kb)

    evs = actors.reader.work_attested_events(pool, from_block=start)
    assert [(e.worker, e.work_key, e.units, e.reward) for e in evs] == [
        (w.worker, w.work_key, w.units, w.units * RATE) for w in work
    ]
    assert {e.validator for e in evs} == {Actors.addr(actors.validator)}
    assert len(actors.reader.work_attested_events(pool, from_block=start, worker=b)) == 1


def test_double_attestation_is_skipped(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    k1, k2 = keys("dup", 2)
    actors.validator.attest_work(pool, [Work(a, k1, 4)])
    start = actors.reader.block_number() + 1

    # A retry of the same key, and a key repeated inside one batch: paid once each.
    result = actors.validator.attest_work(pool, [Work(a, k1, 4), Work(a, k2, 1), Work(a, k2, 1)])
    assert result.attested == [Work(a, k2, 1)]
    assert [(s.work_key, s.reason) for s in result.skipped] == [
        (k1, SkipReason.ALREADY_ATTESTED),
        (k2, SkipReason.ALREADY_ATTESTED),
    ]
    assert actors.reader.work_units(pool, a) == 5
    assert actors.reader.reward_balance(pool, a) == 5 * RATE
    assert event_names(actors.reader, pool, start) == ["WorkSkipped", "WorkAttested", "WorkSkipped"]


def test_non_member_work_is_skipped(actors: Actors, pool: int) -> None:
    outsider = Actors.addr(actors.stranger)
    [k] = keys("outsider", 1)
    result = actors.validator.attest_work(pool, [Work(outsider, k, 3)])
    assert result.attested == []
    assert [s.reason for s in result.skipped] == [SkipReason.NOT_MEMBER]
    assert actors.reader.reward_balance(pool, outsider) == 0
    assert actors.reader.work_status(pool, k) == WorkStatus.NONE  # still open once they join


def test_malformed_batches_refused(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    with pytest.raises(ChainError, match="units must be positive"):
        actors.validator.attest_work(pool, [Work(a, work_key_for("zero"), 0)])
    with pytest.raises(ChainError, match="invalid work key"):
        actors.validator.attest_work(pool, [Work(a, b"short", 1)])
    with pytest.raises(ChainError, match="invalid address"):
        actors.validator.attest_work(pool, [Work("0x1234", work_key_for("bad"), 1)])
    # The contract's own checks, reached without the client's validation.
    fn = actors.validator.contract.functions.attest_work(pool, [a, a], [work_key_for("r")], [1])
    with pytest.raises(ChainRevert, match="array lengths differ"):
        actors.validator._send(fn, "attest_work")


def test_batches_beyond_max_are_split(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    work = [Work(a, k, 1) for k in keys("big", MAX_BATCH + 6)]
    result = actors.validator.attest_work(pool, work)
    assert len(result.txs) == 2
    assert len(result.attested) == MAX_BATCH + 6
    assert actors.reader.attested_units(pool) == MAX_BATCH + 6


def test_attest_gas_for_batch_of_32(actors: Actors, pool: int) -> None:
    """Record (and bound) the gas of a full validator batch: 32 fresh keys over 4 workers."""
    for w in actors.workers[1:]:
        w.join(pool, MIN_STAKE)
    workers = [Actors.addr(w) for w in actors.workers] + [Actors.addr(actors.workers[0])]
    work = [Work(workers[i % 4], k, 3) for i, k in enumerate(keys("gas", 32))]
    result = actors.validator.attest_work(pool, work)
    assert len(result.attested) == 32
    print(f"attest_work gas, batch of 32: {result.gas_used}")
    assert result.gas_used < 1_200_000


# --- slashing -----------------------------------------------------------------------------------


def test_slash_takes_stake_into_funds_and_blocks_the_key(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    bad, good = keys("slash", 2)
    start = actors.reader.block_number() + 1

    with pytest.raises(ChainRevert, match="not a validator"):
        actors.stranger.slash(pool, a, bad, "bad proof")

    result = actors.validator.slash(pool, a, bad, "toploc proof mismatch")
    assert result.amount == MIN_STAKE * 1000 // 10_000
    assert actors.reader.stake_of(pool, a) == MIN_STAKE - result.amount
    assert actors.reader.pool_funds(pool) == result.amount
    assert actors.reader.work_status(pool, bad) == WorkStatus.SLASHED

    [ev] = actors.reader.worker_slashed_events(pool, from_block=start)
    assert (ev.worker, ev.work_key, ev.amount, ev.reason) == (
        a, bad, result.amount, "toploc proof mismatch",
    )  # fmt: skip
    assert ev.validator == Actors.addr(actors.validator)

    # A slashed key is never paid, and cannot be slashed twice.
    attest = actors.validator.attest_work(pool, [Work(a, bad, 9)])
    assert [s.reason for s in attest.skipped] == [SkipReason.ALREADY_SLASHED]
    assert actors.reader.reward_balance(pool, a) == 0
    with pytest.raises(ChainRevert, match="work key already slashed"):
        actors.validator.slash(pool, a, bad, "again")

    # ...and an attested key cannot be slashed afterwards.
    actors.validator.attest_work(pool, [Work(a, good, 1)])
    with pytest.raises(ChainRevert, match="work key already attested"):
        actors.validator.slash(pool, a, good, "late")
    assert actors.reader.stake_of(pool, a) == MIN_STAKE - result.amount

    assert event_names(actors.reader, pool, start) == [
        "WorkerSlashed",
        "WorkSkipped",
        "WorkAttested",
    ]


def test_leaving_does_not_dodge_a_pending_slash(actors: Actors, pool: int) -> None:
    """The stake stays slashable while it unbonds; withdraw pays only what the slash left."""
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    [k] = keys("departed", 1)
    left = worker.leave(pool)
    long_reason = "é" * 40  # 80 bytes: cut to the contract's 64, never refused
    taken = actors.validator.slash(pool, a, k, long_reason).amount
    assert taken == MIN_STAKE * 1000 // 10_000
    [ev] = actors.reader.worker_slashed_events(pool, worker=a)
    assert ev.reason == "é" * 32
    assert actors.reader.work_status(pool, k) == WorkStatus.SLASHED
    assert actors.reader.pool_funds(pool) == taken
    assert actors.reader.stake_of(pool, a) == MIN_STAKE - taken

    mine_until(actors.reader, left.unbonding_until)
    assert worker.withdraw(pool) == MIN_STAKE - taken


def test_attest_skips_a_worker_who_left(actors: Actors, pool: int) -> None:
    a = Actors.addr(actors.workers[0])
    [k] = keys("after-leave", 1)
    actors.workers[0].leave(pool)
    result = actors.validator.attest_work(pool, [Work(a, k, 3)])
    assert result.attested == []
    assert [(s.worker, s.reason) for s in result.skipped] == [(a, SkipReason.NOT_MEMBER)]
    assert actors.reader.reward_balance(pool, a) == 0
    assert actors.reader.work_units(pool, a) == 0


# --- rewards ------------------------------------------------------------------------------------


def test_rewards_claimable_and_capped_by_funds(actors: Actors, pool: int) -> None:
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    with pytest.raises(ChainRevert, match="no rewards to claim"):
        worker.claim_rewards(pool)
    actors.validator.attest_work(pool, [Work(a, k, 10) for k in keys("claim", 3)])
    owed = 30 * RATE
    with pytest.raises(ChainRevert, match="pool has no funds"):
        worker.claim_rewards(pool)

    start = actors.reader.block_number() + 1
    actors.owner.fund_pool(pool, 20 * RATE)  # underfunded: pays what it can
    assert worker.claim_rewards(pool) == 20 * RATE
    assert actors.reader.reward_balance(pool, a) == owed - 20 * RATE
    assert actors.reader.pool_funds(pool) == 0

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


def test_rewards_survive_leaving(actors: Actors, pool: int) -> None:
    worker, a = actors.workers[0], Actors.addr(actors.workers[0])
    actors.owner.fund_pool(pool, ETH)
    actors.validator.attest_work(pool, [Work(a, work_key_for("before-leave"), 7)])
    worker.leave(pool)
    assert worker.claim_rewards(pool) == 7 * RATE


# --- clients ------------------------------------------------------------------------------------


def test_read_only_client_cannot_send(actors: Actors, pool: int) -> None:
    with pytest.raises(ChainError, match="read-only"):
        actors.reader.join(pool, MIN_STAKE)


def test_unreachable_node_is_a_chain_error(actors: Actors) -> None:
    from prime_swarm.libs.chain.anvil import free_port

    client = LedgerClient(f"http://127.0.0.1:{free_port()}", actors.deployment.address)
    with pytest.raises(ChainError, match="cannot reach the node"):
        client.pool_count()


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
