"""`LedgerClient`: typed access to a deployed SwarmLedger over JSON-RPC.

Reads need no account; writes are signed locally with the client's account and wait for their
receipt. Every failure is a `ChainError`; a contract refusal is a `ChainRevert` whose `reason`
is the contract's revert string (e.g. "not a validator").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.contract import Contract
from web3.logs import DISCARD
from web3.types import BlockIdentifier, EventData, TxReceipt

from .artifacts import LEDGER_CONTRACT, load_artifact
from .deployment import Deployment, load_deployment
from .errors import ChainError
from .models import (
    AttestResult,
    LeaveResult,
    Pool,
    SkippedWork,
    SkipReason,
    SlashResult,
    TxInfo,
    Work,
    WorkAttestedEvent,
    WorkerSlashedEvent,
    WorkStatus,
    as_work_key,
)
from .transactions import Buildable, TxSender, chain_errors, make_web3

T = TypeVar("T")

# Mirrors MAX_BATCH in SwarmLedger.vy; longer batches are split into several transactions.
MAX_BATCH = 64


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
        self, orchestrator_url: str, min_stake: int, reward_per_unit: int, trainer: str
    ) -> int:
        """Open a pool owned by this client's account, its policies signed by `trainer`;
        returns the new pool id."""
        receipt = self._send(
            self.contract.functions.create_pool(
                orchestrator_url, min_stake, reward_per_unit, to_address(trainer)
            ),
            "create_pool",
        )
        (event,) = self._events_in(receipt, "PoolCreated")
        return int(event["args"]["pool_id"])

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
        return Pool(
            pool_id=pool_id,
            owner=owner,
            orchestrator_url=url,
            trainer=trainer,
            min_stake=min_stake,
            reward_per_unit=reward_per_unit,
            funds=self.pool_funds(pool_id),
            total_attested_units=self.attested_units(pool_id),
        )

    def pool_count(self) -> int:
        return self._call("pool_count", lambda f: f.pool_count())

    def pool_funds(self, pool_id: int) -> int:
        return self._call("pool_funds", lambda f: f.pool_funds(pool_id))

    def slash_bps(self) -> int:
        return self._call("SLASH_BPS", lambda f: f.SLASH_BPS())

    def unbonding_blocks(self) -> int:
        return self._call("UNBONDING_BLOCKS", lambda f: f.UNBONDING_BLOCKS())

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
        """Attest verified work, MAX_BATCH entries per transaction.

        Entries whose key is already attested or slashed, or whose worker is not a member, are
        skipped by the contract (not an error) and listed in `AttestResult.skipped`; so a retry
        after a lost receipt is safe. If a later transaction of a long list fails, the earlier
        ones stay on chain; retrying the whole list is again safe.
        """
        entries = [self._checked_work(w) for w in work]
        attested: list[Work] = []
        skipped: list[SkippedWork] = []
        txs: list[TxInfo] = []
        for start in range(0, len(entries), MAX_BATCH):
            batch = entries[start : start + MAX_BATCH]
            receipt = self._send(
                self.contract.functions.attest_work(
                    pool_id,
                    [w.worker for w in batch],
                    [w.work_key for w in batch],
                    [w.units for w in batch],
                ),
                "attest_work",
            )
            txs.append(_tx_info(receipt))
            for ev in self._events_in(receipt, "WorkAttested"):
                a = ev["args"]
                attested.append(Work(a["worker"], bytes(a["work_key"]), a["units"]))
            for ev in self._events_in(receipt, "WorkSkipped"):
                a = ev["args"]
                skipped.append(
                    SkippedWork(a["worker"], bytes(a["work_key"]), SkipReason(a["reason"]))
                )
        return AttestResult(attested=attested, skipped=skipped, txs=txs)

    def slash(self, pool_id: int, worker: str, work_key: bytes | str, reason: str) -> SlashResult:
        """Slash `worker` for the work behind `work_key`; reverts if the key is already used.

        `reason` is cut to the contract's 64 bytes (at a character boundary): a verdict must not
        fail to land because its explanation is long.
        """
        short = reason.encode()[:64].decode(errors="ignore")
        receipt = self._send(
            self.contract.functions.slash(pool_id, to_address(worker), _key(work_key), short),
            "slash",
        )
        (event,) = self._events_in(receipt, "WorkerSlashed")
        return SlashResult(amount=int(event["args"]["amount"]), tx=_tx_info(receipt))

    def work_status(self, pool_id: int, work_key: bytes | str) -> WorkStatus:
        return WorkStatus(
            self._call("work_status", lambda f: f.work_status(pool_id, _key(work_key)))
        )

    def work_units(self, pool_id: int, worker: str) -> int:
        return self._call("work_units", lambda f: f.work_units(pool_id, to_address(worker)))

    def attested_units(self, pool_id: int) -> int:
        """Total units attested in the pool, over all workers."""
        return self._call("total_attested_units", lambda f: f.total_attested_units(pool_id))

    # --- rewards ----------------------------------------------------------------------------

    def reward_balance(self, pool_id: int, worker: str) -> int:
        return self._call("reward_balance", lambda f: f.reward_balance(pool_id, to_address(worker)))

    def claim_rewards(self, pool_id: int) -> int:
        """Claim this account's rewards; returns the wei paid (capped by the pool's funds)."""
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

    def work_attested_events(
        self,
        pool_id: int,
        from_block: BlockIdentifier = 0,
        to_block: BlockIdentifier = "latest",
        worker: str | None = None,
    ) -> list[WorkAttestedEvent]:
        filters = _filters(pool_id=pool_id, worker=worker and to_address(worker))
        return [
            WorkAttestedEvent(**_event_fields(ev))
            for ev in self.events(
                "WorkAttested", from_block=from_block, to_block=to_block, **filters
            )
        ]

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

    def _send(self, call: Buildable, action: str, value: int = 0) -> TxReceipt:
        if self._sender is None:
            raise ChainError(f"{action} needs an account: this client is read-only")
        if value < 0:
            raise ChainError(f"{action}: negative value {value}")
        return self._sender.send(call, action, value=value)

    def _tx(self, call: Buildable, action: str, value: int = 0) -> TxInfo:
        return _tx_info(self._send(call, action, value))

    def _call(self, action: str, pick: Callable[[Any], Any]) -> Any:
        with chain_errors(action, self.rpc_url):
            return pick(self.contract.functions).call()

    def _events_in(self, receipt: TxReceipt, name: str) -> Iterable[EventData]:
        # DISCARD: the receipt also holds this contract's other events, which do not decode as
        # `name` and are not errors.
        return getattr(self.contract.events, name)().process_receipt(receipt, errors=DISCARD)

    @staticmethod
    def _checked_work(w: Work) -> Work:
        if w.units <= 0:
            raise ChainError(f"work units must be positive, got {w.units}")
        return Work(to_address(w.worker), _key(w.work_key), w.units)


def _key(work_key: bytes | str) -> bytes:
    try:
        return as_work_key(work_key)
    except ValueError as exc:
        raise ChainError(f"invalid work key {work_key!r}: {exc}") from None


def _tx_info(receipt: TxReceipt) -> TxInfo:
    return TxInfo(
        tx_hash=receipt["transactionHash"].to_0x_hex(),
        block_number=receipt["blockNumber"],
        gas_used=receipt["gasUsed"],
    )


def _filters(**filters: Any) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if v is not None}


def _event_fields(ev: EventData) -> dict[str, Any]:
    args = dict(ev["args"])
    if "work_key" in args:
        args["work_key"] = bytes(args["work_key"])
    return {
        **args,
        "block_number": ev["blockNumber"],
        "tx_hash": ev["transactionHash"].to_0x_hex(),
        "log_index": ev["logIndex"],
    }
