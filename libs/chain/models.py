"""Typed values the ledger client returns; amounts are in wei, ids and units are plain ints."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from eth_utils import keccak


class WorkStatus(IntEnum):
    """State of a work key in a pool; mirrors the WORK_* constants of SwarmLedger.vy."""

    NONE = 0
    ATTESTED = 1
    SLASHED = 2


class SkipReason(IntEnum):
    """Why attest_work skipped an entry; mirrors the SKIP_* constants of SwarmLedger.vy."""

    ALREADY_ATTESTED = 1
    ALREADY_SLASHED = 2
    NOT_MEMBER = 3


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


@dataclass(frozen=True)
class Work:
    """One attestation: `units` of verified work by `worker`, identified by a 32-byte key."""

    worker: str
    work_key: bytes
    units: int


@dataclass(frozen=True)
class TxInfo:
    tx_hash: str
    block_number: int
    gas_used: int


@dataclass(frozen=True)
class SkippedWork:
    worker: str
    work_key: bytes
    reason: SkipReason


@dataclass(frozen=True)
class AttestResult:
    """What one `attest_work` call did; batches over MAX_BATCH span several transactions."""

    attested: list[Work]
    skipped: list[SkippedWork]
    txs: list[TxInfo]

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
    tx: TxInfo


@dataclass(frozen=True)
class WorkAttestedEvent:
    pool_id: int
    worker: str
    work_key: bytes
    validator: str
    units: int
    reward: int
    block_number: int
    tx_hash: str
    log_index: int


@dataclass(frozen=True)
class WorkerSlashedEvent:
    pool_id: int
    worker: str
    work_key: bytes
    validator: str
    amount: int
    reason: str
    block_number: int
    tx_hash: str
    log_index: int


def work_key_for(identifier: str) -> bytes:
    """The on-chain key for an off-chain work id (e.g. a rollout id): keccak256 of its UTF-8."""
    return keccak(text=identifier)


def as_work_key(value: bytes | str) -> bytes:
    """A 32-byte key from raw bytes or 0x-hex; anything else is a caller bug."""
    raw = bytes.fromhex(value.removeprefix("0x")) if isinstance(value, str) else bytes(value)
    if len(raw) != 32:
        raise ValueError(f"a work key is 32 bytes, got {len(raw)}")
    return raw
