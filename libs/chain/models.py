"""Typed values the ledger client returns; amounts are in wei, ids and units are plain ints."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class PoolStatus(IntEnum):
    """A pool's lifecycle; mirrors the POOL_* constants of SwarmLedger.vy."""

    PENDING = 1
    ACTIVE = 2
    ENDED = 3


class SkipReason(IntEnum):
    """Why attest_work skipped an item; mirrors the SKIP_* constants of SwarmLedger.vy."""

    SETTLED = 1
    NOT_MEMBER = 2
    BELOW_MINIMUM = 3


@dataclass(frozen=True)
class Pool:
    pool_id: int
    owner: str
    orchestrator_url: str
    # The address whose signatures on policy manifests the pool accepts.
    trainer: str
    min_stake: int
    reward_per_unit: int
    funds: int
    total_attested_units: int
    status: PoolStatus
    # Share of each slash paid to the reporting validator, in basis points.
    reporter_bps: int
    # Whether the rest of a slash is burnt rather than added to the pool's funds.
    burn_slashed: bool


@dataclass(frozen=True)
class Work:
    """One attested item: `units` of verified work by `worker`, named by `work_id`, the
    orchestrator's per-worker sequence number handed out with the lease."""

    worker: str
    work_id: int
    units: int


@dataclass(frozen=True)
class TxInfo:
    tx_hash: str
    block_number: int
    gas_used: int


@dataclass(frozen=True)
class SkippedWork:
    worker: str
    work_id: int
    reason: SkipReason


@dataclass(frozen=True)
class AttestedBatch:
    """One transaction's commitment: `items` (in the order the root was built from) can each
    be proven against `root` with `merkle.proof`."""

    batch_id: int
    root: bytes
    items: list[Work]
    tx: TxInfo


@dataclass(frozen=True)
class BatchInfo:
    batch_id: int
    root: bytes
    validator: str
    block_number: int
    items: int
    units: int
    tx_hash: str


@dataclass(frozen=True)
class Rewards:
    """Claimable now, and credited but still inside the challenge window."""

    claimable: int
    pending: int

    @property
    def total(self) -> int:
        return self.claimable + self.pending


@dataclass(frozen=True)
class AttestResult:
    """What one `attest_work` call did; batches over MAX_BATCH span several transactions."""

    attested: list[Work]
    skipped: list[SkippedWork]
    batches: list[AttestedBatch]

    @property
    def txs(self) -> list[TxInfo]:
        return [b.tx for b in self.batches]

    @property
    def gas_used(self) -> int:
        return sum(tx.gas_used for tx in self.txs)


@dataclass(frozen=True)
class LeaveResult:
    """A worker left: `stake` wei stays slashable until block `unbonding_until`; from then on
    `withdraw` pays what slashes left of it."""

    stake: int
    unbonding_until: int
    tx: TxInfo


@dataclass(frozen=True)
class SlashResult:
    amount: int
    reporter_share: int
    burnt: int
    tx: TxInfo


@dataclass(frozen=True)
class WorkerSlashedEvent:
    pool_id: int
    worker: str
    work_id: int
    validator: str
    amount: int
    reporter_share: int
    burnt: int
    reason: str
    block_number: int
    tx_hash: str
    log_index: int
