"""`LedgerClient`: typed access to a deployed SwarmLedger over JSON-RPC.

Reads need no account; writes are signed locally with the client's account and wait for their
receipt. Every failure is a `ChainError`; a contract refusal is a `ChainRevert` whose `reason`
is the contract's revert string (e.g. "not a validator").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.contract import Contract
from web3.logs import DISCARD
from web3.types import BlockIdentifier, EventData, TxReceipt

from prime_swarm.protocol.messages import normal_address

from . import merkle
from .artifacts import LEDGER_CONTRACT, load_artifact
from .deployment import Deployment, load_deployment
from .errors import ChainError, ChainRevert
from .models import (
    AttestedBatch,
    AttestResult,
    BatchInfo,
    LeaveResult,
    Pool,
    PoolStatus,
    Rewards,
    SkippedWork,
    SkipReason,
    SlashResult,
    TxInfo,
    Work,
    WorkerSlashedEvent,
)
from .transactions import Buildable, TxSender, chain_errors, make_web3

T = TypeVar("T")

# Mirrors MAX_BATCH in SwarmLedger.vy; longer batches are split into several transactions.
MAX_BATCH = 256
# Work ids the ledger takes: it keeps one past a worker's highest id in 128 bits.
WORK_ID_LIMIT = 2**128 - 1
BPS = 10_000
NEW_EPOCH_GAS_PER_WORKER = 25_000


def to_address(value: str) -> str:
    """Checksum an address, or raise `ChainError` naming the bad value."""
    if not isinstance(value, str) or not Web3.is_address(value):
        raise ChainError(f"invalid address: {value!r}")
    return Web3.to_checksum_address(value)


class LedgerClient:
    def __init__(
        self,
        rpc_url: str,
        ledger_address: str,
        account: LocalAccount | None = None,
        *,
        timeout: float = 60.0,
        request_timeout: float = 30.0,
    ) -> None:
        """`timeout` bounds the wait for a receipt; `request_timeout` each JSON-RPC request."""
        self.rpc_url = rpc_url
        self.address = to_address(ledger_address)
        self.account = account
        self.w3 = make_web3(rpc_url, timeout=request_timeout)
        self.contract: Contract = self.w3.eth.contract(
            address=self.address, abi=load_artifact(LEDGER_CONTRACT).abi
        )
        self._sender = TxSender(self.w3, account, timeout=timeout) if account else None

    @classmethod
    def from_deployment(
        cls,
        deployment: Deployment | str | Path,
        account: LocalAccount | None = None,
        *,
        rpc_url: str | None = None,
        timeout: float = 60.0,
        check: bool = True,
    ) -> LedgerClient:
        """A client for a deployment record; `rpc_url` overrides the recorded one (e.g. the
        node is reached under another host name from inside a container)."""
        if not isinstance(deployment, Deployment):
            deployment = load_deployment(deployment)
        client = cls(rpc_url or deployment.rpc_url, deployment.address, account, timeout=timeout)
        if check:
            client.check(expected_chain_id=deployment.chain_id)
        return client

    def check(self, expected_chain_id: int | None = None) -> None:
        """Fail early, with a clear message, if the node or the contract is not what we expect."""
        with chain_errors("connect", self.rpc_url):
            chain_id = self.w3.eth.chain_id
            code = self.w3.eth.get_code(self.address)
        if expected_chain_id is not None and chain_id != expected_chain_id:
            raise ChainError(
                f"node at {self.rpc_url} is chain {chain_id}, deployment is on {expected_chain_id}"
            )
        if len(code) == 0:
            raise ChainError(f"no contract at {self.address} on {self.rpc_url}")

    # --- pools ------------------------------------------------------------------------------

    def create_pool(
        self,
        orchestrator_url: str,
        min_stake: int,
        reward_per_unit: int,
        trainer: str,
        *,
        activate: bool = True,
    ) -> int:
        """Open a pool owned by this client's account, its policies signed by `trainer`;
        returns the new pool id. The contract opens it PENDING; `activate` (the default, what
        a pool that needs no further setup wants) makes it ACTIVE in a second transaction."""
        receipt = self._send(
            self.contract.functions.create_pool(
                orchestrator_url, min_stake, reward_per_unit, to_address(trainer)
            ),
            "create_pool",
        )
        (event,) = self._events_in(receipt, "PoolCreated")
        pool_id = int(event["args"]["pool_id"])
        if activate:
            self.activate_pool(pool_id)
        return pool_id

    def activate_pool(self, pool_id: int) -> TxInfo:
        """PENDING -> ACTIVE: workers may join and work is attested (pool owner only)."""
        return self._tx(self.contract.functions.activate_pool(pool_id), "activate_pool")

    def end_pool(self, pool_id: int) -> TxInfo:
        """No more joins; leased work is still attested and paid (pool owner only)."""
        return self._tx(self.contract.functions.end_pool(pool_id), "end_pool")

    def set_slash_policy(self, pool_id: int, reporter_bps: int, burn_slashed: bool) -> TxInfo:
        """Share of each slash for the reporting validator, and whether the rest is burnt
        rather than added to the pool's funds (pool owner, PENDING pools only)."""
        return self._tx(
            self.contract.functions.set_slash_policy(pool_id, reporter_bps, burn_slashed),
            "set_slash_policy",
        )

    def set_orchestrator_url(self, pool_id: int, orchestrator_url: str) -> TxInfo:
        return self._tx(
            self.contract.functions.set_orchestrator_url(pool_id, orchestrator_url),
            "set_orchestrator_url",
        )

    def set_trainer(self, pool_id: int, trainer: str) -> TxInfo:
        """Name the pool's new manifest signer (pool owner only)."""
        return self._tx(
            self.contract.functions.set_trainer(pool_id, to_address(trainer)), "set_trainer"
        )

    def fund_pool(self, pool_id: int, amount: int) -> TxInfo:
        return self._tx(self.contract.functions.fund_pool(pool_id), "fund_pool", value=amount)

    def get_pool(self, pool_id: int) -> Pool:
        owner, url, min_stake, reward_per_unit, trainer = self._call(
            "pool", lambda f: f.pool(pool_id)
        )
        status, funds, reporter_bps, burn = self._call(
            "pool_state", lambda f: f.pool_state(pool_id)
        )
        return Pool(
            pool_id=pool_id,
            owner=owner,
            orchestrator_url=url,
            trainer=trainer,
            min_stake=min_stake,
            reward_per_unit=reward_per_unit,
            funds=funds,
            total_attested_units=self.attested_units(pool_id),
            status=PoolStatus(status),
            reporter_bps=reporter_bps,
            burn_slashed=burn,
        )

    def pool_funds(self, pool_id: int) -> int:
        return self._call("pool_funds", lambda f: f.pool_funds(pool_id))

    def slash_bps(self) -> int:
        return self._call("SLASH_BPS", lambda f: f.SLASH_BPS())

    def unbonding_blocks(self) -> int:
        return self._call("UNBONDING_BLOCKS", lambda f: f.UNBONDING_BLOCKS())

    def challenge_blocks(self) -> int:
        return self._call("CHALLENGE_BLOCKS", lambda f: f.CHALLENGE_BLOCKS())

    # --- stakes -----------------------------------------------------------------------------

    def join(self, pool_id: int, stake: int) -> TxInfo:
        """Stake into a pool (or top up an existing stake)."""
        return self._tx(self.contract.functions.join(pool_id), "join", value=stake)

    def leave(self, pool_id: int) -> LeaveResult:
        """Leave a pool. Nothing is paid yet: the stake stays slashable while it unbonds, and
        `withdraw` pays what is left of it once `block_number() >= result.unbonding_until`."""
        receipt = self._send(self.contract.functions.leave(pool_id), "leave")
        (event,) = self._events_in(receipt, "WorkerLeft")
        return LeaveResult(
            stake=int(event["args"]["stake"]),
            unbonding_until=int(event["args"]["unbonding_until"]),
            tx=_tx_info(receipt),
        )

    def withdraw(self, pool_id: int) -> int:
        """Take back the stake of a pool this account left; returns the wei paid.

        Refused ("still unbonding") until `block_number() >= unbonding_until`: the contract
        would accept a transaction mined in that block, but gas estimation runs the call on the
        latest block and refuses one block earlier. On a chain that mines only per transaction
        (anvil), blocks must be mined for the wait to end.
        """
        receipt = self._send(self.contract.functions.withdraw(pool_id), "withdraw")
        (event,) = self._events_in(receipt, "StakeWithdrawn")
        return int(event["args"]["amount"])

    def eject(self, pool_id: int, worker: str, reason: str) -> LeaveResult:
        """End `worker`'s membership as the pool's owner (no slash): its stake unbonds as after
        `leave`. `reason` (at most 64 bytes on chain) lands in the WorkerEjected event."""
        reason = reason.encode()[:64].decode(errors="ignore")
        call = self.contract.functions.eject(pool_id, to_address(worker), reason)
        receipt = self._send(call, "eject")
        (event,) = self._events_in(receipt, "WorkerEjected")
        return LeaveResult(
            stake=int(event["args"]["stake"]),
            unbonding_until=int(event["args"]["unbonding_until"]),
            tx=_tx_info(receipt),
        )

    def unbonding_until(self, pool_id: int, worker: str) -> int:
        """First block `withdraw` pays `worker` from; 0 for a member or after a withdrawal."""
        return self._call(
            "unbonding_until", lambda f: f.unbonding_until(pool_id, to_address(worker))
        )

    def is_member(self, pool_id: int, worker: str) -> bool:
        return self._call("is_member", lambda f: f.is_member(pool_id, to_address(worker)))

    def stake_of(self, pool_id: int, worker: str) -> int:
        return self._call("stake_of", lambda f: f.stake_of(pool_id, to_address(worker)))

    # --- validators -------------------------------------------------------------------------

    def register_validator(self, pool_id: int, validator: str) -> TxInfo:
        return self._tx(
            self.contract.functions.register_validator(pool_id, to_address(validator)),
            "register_validator",
        )

    def remove_validator(self, pool_id: int, validator: str) -> TxInfo:
        return self._tx(
            self.contract.functions.remove_validator(pool_id, to_address(validator)),
            "remove_validator",
        )

    def is_validator(self, pool_id: int, address: str) -> bool:
        return self._call("is_validator", lambda f: f.is_validator(pool_id, to_address(address)))

    # --- work -------------------------------------------------------------------------------

    def attest_work(self, pool_id: int, work: Sequence[Work]) -> AttestResult:
        """Attest verified work, sorted by (worker, work id) so that each worker costs one
        credit and one bitmap write per batch, MAX_BATCH items per transaction.

        Items already settled, or whose worker is not a member, are skipped by the contract
        (not an error) and listed in `AttestResult.skipped`; so a retry after a lost receipt is
        safe. If a later transaction of a long list fails, the earlier ones stay on chain;
        retrying the whole list is again safe.
        """
        entries = sorted(
            (self._checked_work(w) for w in work),
            key=lambda w: (normal_address(w.worker), w.work_id),
        )
        attested: list[Work] = []
        skipped: list[SkippedWork] = []
        batches: list[AttestedBatch] = []
        for start in range(0, len(entries), MAX_BATCH):
            chunk = entries[start : start + MAX_BATCH]
            receipt = self._send(
                self.contract.functions.attest_work(
                    pool_id,
                    [w.worker for w in chunk],
                    [w.work_id for w in chunk],
                    [w.units for w in chunk],
                ),
                "attest_work",
                # The estimate runs on the latest block; mined in a new challenge epoch, the
                # batch opens a reward bucket per worker (a fresh slot, about 20k gas more).
                extra_gas=NEW_EPOCH_GAS_PER_WORKER * len({w.worker for w in chunk}),
            )
            missed = self._skipped_in(receipt)
            skipped.extend(missed)
            credited = _without(chunk, missed)
            attested.extend(credited)
            for ev in self._events_in(receipt, "BatchAttested"):
                batches.append(
                    AttestedBatch(
                        batch_id=int(ev["args"]["batch_id"]),
                        root=bytes(ev["args"]["root"]),
                        items=credited,
                        tx=_tx_info(receipt),
                    )
                )
        return AttestResult(attested=attested, skipped=skipped, batches=batches)

    def slash(
        self, pool_id: int, worker: str, work_id: int, reason: str, amount: int | None = None
    ) -> SlashResult:
        """Slash `worker` for rejected item `work_id`; reverts if the item is already settled.

        `amount` defaults to the largest share the ledger allows (SLASH_BPS of the stake as it
        is now), re-read once if another slash lowered the stake in between. `reason` is cut to
        the contract's 64 bytes (at a character boundary): a verdict must not fail to land
        because its explanation is long.
        """
        worker = to_address(worker)
        for attempt in range(2):
            share = self._slash_amount(pool_id, worker) if amount is None else amount
            call = self.contract.functions.slash(pool_id, worker, work_id, share, _short(reason))
            try:
                receipt = self._send(call, "slash")
            except ChainRevert as exc:
                if amount is None and attempt == 0 and (exc.reason or "").startswith("slash "):
                    continue  # the stake moved between our read and the send
                raise
            return _slash_result(self._events_in(receipt, "WorkerSlashed"), receipt)
        raise AssertionError("unreachable")

    def _slash_amount(self, pool_id: int, worker: str) -> int:
        return self.stake_of(pool_id, worker) * self.slash_bps() // BPS

    def dispute(
        self,
        pool_id: int,
        batch_id: int,
        item: Work,
        proof: Sequence[bytes],
        reason: str,
        amount: int | None = None,
    ) -> SlashResult:
        """Reverse attested `item` of batch `batch_id` inside its challenge window (its units
        and reward are taken back) and slash its worker; `proof` is `merkle.proof` of the item
        among the batch's items (see `batch_items`)."""
        worker = to_address(item.worker)
        if amount is None:
            amount = self._slash_amount(pool_id, worker)
        receipt = self._send(
            self.contract.functions.dispute(
                pool_id,
                batch_id,
                worker,
                item.work_id,
                item.units,
                list(proof),
                amount,
                _short(reason),
            ),
            "dispute",
        )
        return _slash_result(self._events_in(receipt, "WorkerSlashed"), receipt)

    def batch(self, pool_id: int, batch_id: int) -> BatchInfo:
        """A batch's commitment as its `BatchAttested` event gave it (full root, validator,
        size); the ledger itself keeps the root's high 192 bits and the block."""
        stored, block = self._call("batch", lambda f: f.batch(pool_id, batch_id))
        if block == 0:
            raise ChainError(f"pool {pool_id} has no batch {batch_id}")
        evs = self.events(
            "BatchAttested", from_block=block, to_block=block, pool_id=pool_id, batch_id=batch_id
        )
        if len(evs) != 1:
            raise ChainError(f"batch {batch_id} of pool {pool_id}: {len(evs)} BatchAttested logs")
        a = evs[0]["args"]
        root = bytes(a["root"])
        if root[:24] != bytes(stored)[:24]:
            raise ChainError(f"batch {batch_id} of pool {pool_id}: event and storage disagree")
        return BatchInfo(
            batch_id=batch_id,
            root=root,
            validator=a["validator"],
            block_number=block,
            items=int(a["items"]),
            units=int(a["units"]),
            tx_hash=evs[0]["transactionHash"].to_0x_hex(),
        )

    def batch_items(self, pool_id: int, batch_id: int) -> list[Work]:
        """The items batch `batch_id` credited, rebuilt from its transaction's calldata (less
        the items it skipped) and checked against its root: the audit path, which needs
        nothing but the chain. `merkle.proof(pool_id, items, i)` then proves item i."""
        info = self.batch(pool_id, batch_id)
        with chain_errors("batch_items", self.rpc_url):
            tx = self.w3.eth.get_transaction(info.tx_hash)
            receipt = self.w3.eth.get_transaction_receipt(info.tx_hash)
        _, args = self.contract.decode_function_input(tx["input"])
        sent = [
            Work(to_address(w), int(i), int(u))
            for w, i, u in zip(args["workers"], args["work_ids"], args["units"], strict=True)
        ]
        items = _without(sent, self._skipped_in(receipt))
        if merkle.root(pool_id, items) != info.root:
            raise ChainError(f"batch {batch_id} of pool {pool_id}: calldata does not match root")
        return items

    def work_id_floor(self, pool_id: int, worker: str) -> int:
        """One past the highest work id settled for `worker` (0: none): where an orchestrator
        that lost its counter resumes numbering."""
        return self._call("work_id_floor", lambda f: f.work_id_floor(pool_id, to_address(worker)))

    def work_units(self, pool_id: int, worker: str) -> int:
        return self._call("work_units", lambda f: f.work_units(pool_id, to_address(worker)))

    def batch_count(self, pool_id: int) -> int:
        return self._call("batch_count", lambda f: f.batch_count(pool_id))

    def burnt(self, pool_id: int) -> int:
        """Slashed wei the pool burnt (locked in the ledger for good)."""
        return self._call("burnt", lambda f: f.burnt(pool_id))

    def attested_units(self, pool_id: int) -> int:
        """Total units attested in the pool, over all workers."""
        return self._call("total_attested_units", lambda f: f.total_attested_units(pool_id))

    # --- rewards ----------------------------------------------------------------------------

    def rewards(self, pool_id: int, worker: str) -> Rewards:
        claimable, pending = self._call(
            "rewards_of", lambda f: f.rewards_of(pool_id, to_address(worker))
        )
        return Rewards(claimable, pending)

    def reward_balance(self, pool_id: int, worker: str) -> int:
        """Everything credited and not yet paid, claimable or still inside the window."""
        return self.rewards(pool_id, worker).total

    def claim_rewards(self, pool_id: int) -> int:
        """Claim this account's matured rewards; returns the wei paid (capped by the pool's
        funds). Refused ("no matured rewards") while everything is inside the window."""
        receipt = self._send(self.contract.functions.claim_rewards(pool_id), "claim_rewards")
        (event,) = self._events_in(receipt, "RewardsClaimed")
        return int(event["args"]["amount"])

    def balance_of(self, address: str) -> int:
        """Native balance (wei) of any address."""
        with chain_errors("get_balance", self.rpc_url):
            return int(self.w3.eth.get_balance(to_address(address)))

    # --- events -----------------------------------------------------------------------------

    def events(
        self,
        name: str,
        *,
        from_block: BlockIdentifier = 0,
        to_block: BlockIdentifier = "latest",
        **argument_filters: Any,
    ) -> list[EventData]:
        """Raw logs of event `name`, filtered on indexed arguments (e.g. pool_id=1)."""
        try:
            event = getattr(self.contract.events, name)
        except AttributeError:
            raise ChainError(f"the ledger has no event {name!r}") from None
        with chain_errors(f"get_logs({name})", self.rpc_url):
            return list(
                event().get_logs(
                    from_block=from_block,
                    to_block=to_block,
                    argument_filters=argument_filters or None,
                )
            )

    def worker_slashed_events(
        self,
        pool_id: int,
        from_block: BlockIdentifier = 0,
        to_block: BlockIdentifier = "latest",
        worker: str | None = None,
    ) -> list[WorkerSlashedEvent]:
        filters = _filters(pool_id=pool_id, worker=worker and to_address(worker))
        return [
            WorkerSlashedEvent(**_event_fields(ev))
            for ev in self.events(
                "WorkerSlashed", from_block=from_block, to_block=to_block, **filters
            )
        ]

    def block_number(self) -> int:
        with chain_errors("block_number", self.rpc_url):
            return int(self.w3.eth.block_number)

    # --- plumbing ---------------------------------------------------------------------------

    def _send(self, call: Buildable, action: str, value: int = 0, extra_gas: int = 0) -> TxReceipt:
        if self._sender is None:
            raise ChainError(f"{action} needs an account: this client is read-only")
        if value < 0:
            raise ChainError(f"{action}: negative value {value}")
        return self._sender.send(call, action, value=value, extra_gas=extra_gas)

    def _tx(self, call: Buildable, action: str, value: int = 0) -> TxInfo:
        return _tx_info(self._send(call, action, value))

    def _call(self, action: str, pick: Callable[[Any], Any]) -> Any:
        with chain_errors(action, self.rpc_url):
            return pick(self.contract.functions).call()

    def _skipped_in(self, receipt: TxReceipt) -> list[SkippedWork]:
        return [
            SkippedWork(e["args"]["worker"], e["args"]["work_id"], SkipReason(e["args"]["reason"]))
            for e in self._events_in(receipt, "WorkSkipped")
        ]

    def _events_in(self, receipt: TxReceipt, name: str) -> Iterable[EventData]:
        # DISCARD: the receipt also holds this contract's other events, which do not decode as
        # `name` and are not errors.
        return getattr(self.contract.events, name)().process_receipt(receipt, errors=DISCARD)

    @staticmethod
    def _checked_work(w: Work) -> Work:
        if w.units <= 0:
            raise ChainError(f"work units must be positive, got {w.units}")
        if not 0 <= w.work_id < WORK_ID_LIMIT:
            raise ChainError(f"work id out of range: {w.work_id}")
        return Work(to_address(w.worker), w.work_id, w.units)


def _without(items: Sequence[Work], skipped: Sequence[SkippedWork]) -> list[Work]:
    """The items the contract credited, in its order (the order of the root's leaves). Of the
    occurrences of one (worker, id), the contract credits at most the first, and logs a skip
    for every other: so an item is credited if it is the first occurrence of its id and the
    id has fewer skips than occurrences."""

    def key(worker: str, work_id: int) -> tuple[str, int]:
        return normal_address(worker), work_id

    occurrences = Counter(key(w.worker, w.work_id) for w in items)
    skips = Counter(key(s.worker, s.work_id) for s in skipped)
    seen: set[tuple[str, int]] = set()
    credited = []
    for w in items:
        k = key(w.worker, w.work_id)
        if k not in seen and skips[k] < occurrences[k]:
            credited.append(w)
        seen.add(k)
    return credited


def _short(reason: str) -> str:
    return reason.encode()[:64].decode(errors="ignore")


def _slash_result(events: Iterable[EventData], receipt: TxReceipt) -> SlashResult:
    (event,) = events
    a = event["args"]
    return SlashResult(
        amount=int(a["amount"]),
        reporter_share=int(a["reporter_share"]),
        burnt=int(a["burnt"]),
        tx=_tx_info(receipt),
    )


def _tx_info(receipt: TxReceipt) -> TxInfo:
    return TxInfo(
        tx_hash=receipt["transactionHash"].to_0x_hex(),
        block_number=receipt["blockNumber"],
        gas_used=receipt["gasUsed"],
    )


def _filters(**filters: Any) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if v is not None}


def _event_fields(ev: EventData) -> dict[str, Any]:
    return {
        **dict(ev["args"]),
        "block_number": ev["blockNumber"],
        "tx_hash": ev["transactionHash"].to_0x_hex(),
        "log_index": ev["logIndex"],
    }
