"""Sign, send and confirm transactions from a local key, turning every failure into `ChainError`.

One `TxSender` per account: nonces, fees, fee bumps on stuck transactions and receipt waiting
with a deadline (see the class).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import requests
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import (
    ContractLogicError,
    TimeExhausted,
    TransactionNotFound,
    Web3Exception,
    Web3RPCError,
)
from web3.providers.rpc.utils import ExceptionRetryConfiguration
from web3.types import TxParams, TxReceipt

from .errors import ChainError, ChainRevert

log = logging.getLogger("chain.tx")
_REVERT_PREFIX = "execution reverted: "


class Buildable(Protocol):
    """A contract function call or constructor: anything web3 can turn into a transaction."""

    def build_transaction(self, transaction: TxParams | None = None) -> TxParams: ...


def revert_reason(exc: ContractLogicError) -> str:
    message = str(exc.message or exc)
    if message.startswith(_REVERT_PREFIX):
        return message[len(_REVERT_PREFIX) :]
    return message.removeprefix("execution reverted").strip(": ") or "reverted without reason"


@contextmanager
def chain_errors(action: str, rpc_url: str) -> Iterator[None]:
    """Re-raise web3/transport failures of `action` as `ChainError` naming what failed."""
    try:
        yield
    except ChainError:
        raise
    except ContractLogicError as exc:
        reason = revert_reason(exc)
        raise ChainRevert(f"{action} reverted: {reason}", reason=reason) from None
    except Web3RPCError as exc:
        raise ChainError(f"{action} refused by the node: {_rpc_message(exc)}") from None
    except TimeExhausted as exc:
        raise ChainError(f"{action} timed out: {exc}") from None
    except requests.RequestException as exc:
        raise ChainError(f"{action}: cannot reach the node at {rpc_url}: {exc}") from None
    except Web3Exception as exc:
        raise ChainError(f"{action} failed: {exc}") from None


def _rpc_message(exc: Web3RPCError) -> str:
    rpc = getattr(exc, "rpc_response", None) or {}
    error = rpc.get("error") if isinstance(rpc, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(exc)


class TxSender:
    """Sends transactions for one account and waits for their receipts; never wedges.

    - Nonces: the node's pending count, raised to at least the last nonce this sender used, so
      threads sharing a sender stay in order; a nonce another process with the same key took
      first ("nonce too low", "replacement underpriced" on a fresh send), or a base fee that
      rose past the offer before it arrived, is re-read and the send retried, `nonce_retries`
      times.
    - Fees: EIP-1559, chosen here: priority fee from the node (`eth_maxPriorityFeePerGas`),
      max fee twice the latest base fee plus it, capped by `max_fee_cap_wei`.
    - Stuck transactions: with no receipt after `stuck_after_s`, the same nonce is re-signed
      with both fees raised by `bump_factor` (nodes want at least +10 % to replace) and sent
      again, up to `max_bumps` times; whichever of the sent versions is mined is the receipt.
      After `timeout` the send fails with `ChainError` and the next send re-reads the nonce.
    """

    def __init__(
        self,
        w3: Web3,
        account: LocalAccount,
        *,
        timeout: float = 60.0,
        gas_margin: float = 1.2,
        poll_interval: float = 0.1,
        stuck_after_s: float | None = None,
        bump_factor: float = 1.125,
        max_bumps: int = 5,
        max_fee_cap_wei: int | None = None,
        nonce_retries: int = 6,
    ) -> None:
        if bump_factor < 1.1:
            raise ValueError("bump_factor below 1.1: nodes refuse such a replacement")
        self.w3 = w3
        self.account = account
        self.timeout = timeout
        # Headroom over the estimate: state can move between estimate and inclusion (e.g. an
        # attest batch whose skips turn into writes).
        self.gas_margin = gas_margin
        self.poll_interval = poll_interval
        self.stuck_after_s = stuck_after_s if stuck_after_s is not None else timeout / 4
        self.bump_factor = bump_factor
        self.max_bumps = max_bumps
        self.max_fee_cap_wei = max_fee_cap_wei
        self.nonce_retries = nonce_retries
        self.bumps = 0  # fee bumps sent over this sender's life (for tests and metrics)
        self._lock = threading.Lock()
        self._next_nonce = 0

    @property
    def rpc_url(self) -> str:
        return str(getattr(self.w3.provider, "endpoint_uri", "?"))

    def send(
        self, call: Buildable, action: str, *, value: int = 0, extra_gas: int = 0
    ) -> TxReceipt:
        """Estimate, sign, send and wait; raise `ChainError` (with the revert reason) on failure.
        `extra_gas` is added to the estimate for calls whose cost depends on the block they land
        in (a ledger batch that opens a new reward epoch)."""
        with chain_errors(action, self.rpc_url):
            for attempt in range(self.nonce_retries + 1):
                try:
                    tx, hashes = self._submit(call, value, extra_gas)
                    break
                except Web3RPCError as exc:
                    if attempt == self.nonce_retries or not _retryable(exc):
                        raise
                    log.info("%s: %s; retrying", action, _rpc_message(exc))
                    self._next_nonce = 0  # re-read from the node
                    # Jittered: two senders of one key that collided should not collide again.
                    time.sleep(random.uniform(0, 0.05) * (attempt + 1))
            receipt = self._await(tx, hashes, action)
            if receipt["status"] != 1:
                reason = self._replay_reason(tx, receipt)
                raise ChainRevert(
                    f"{action} reverted on chain: {reason}",
                    reason=reason,
                    tx_hash=receipt["transactionHash"].to_0x_hex(),
                )
            return receipt

    def _fees(self) -> tuple[int, int]:
        """(max fee, priority fee) per gas for a new transaction."""
        base = int(self.w3.eth.get_block("latest").get("baseFeePerGas") or 0)
        try:
            tip = int(self.w3.eth.max_priority_fee)
        except (Web3Exception, ValueError):
            tip = 10**9
        max_fee = 2 * base + tip
        if self.max_fee_cap_wei is not None:
            max_fee = min(max_fee, self.max_fee_cap_wei)
            tip = min(tip, max_fee)
        return max_fee, tip

    def _submit(self, call: Buildable, value: int, extra_gas: int) -> tuple[TxParams, list[Any]]:
        address = self.account.address
        with self._lock:
            pending = self.w3.eth.get_transaction_count(address, "pending")
            nonce = max(pending, self._next_nonce)
            max_fee, tip = self._fees()
            # build_transaction estimates gas, which runs the call: a revert surfaces here with
            # its reason, before anything is signed.
            params: TxParams = {
                "from": address,
                "nonce": nonce,
                "value": value,
                "maxFeePerGas": max_fee,
                "maxPriorityFeePerGas": tip,
            }
            try:
                tx = call.build_transaction(params)
            except Web3RPCError as exc:
                # With a fee set, a node estimates within what the balance can pay for and
                # words an empty account as "gas required exceeds allowance".
                if "exceeds allowance" not in _rpc_message(exc):
                    raise
                balance = self.w3.eth.get_balance(address)
                raise ChainError(
                    f"insufficient funds: {address} holds {balance} wei, not enough for the "
                    f"gas at {max_fee} wei per gas" + (f" plus {value} wei" if value else "")
                ) from None
            tx["gas"] = int(tx["gas"] * self.gas_margin) + extra_gas
            tx_hash = self._send_signed(tx)
            self._next_nonce = nonce + 1
        return tx, [tx_hash]

    def _send_signed(self, tx: TxParams) -> Any:
        signed = self.account.sign_transaction(tx)
        try:
            return self.w3.eth.send_raw_transaction(signed.raw_transaction)
        except Web3RPCError as exc:
            # A send retried after a lost reply finds its own transaction in the pool (geth
            # says "already known", anvil "already imported").
            message = _rpc_message(exc).lower()
            if "already known" not in message and "already imported" not in message:
                raise
            return signed.hash

    def _await(self, tx: TxParams, hashes: list[Any], action: str) -> TxReceipt:
        """The receipt of whichever sent version of `tx` is mined, bumping fees while stuck."""
        start = time.monotonic()
        deadline = start + self.timeout
        next_bump = start + self.stuck_after_s
        bumps = 0
        while True:
            for h in hashes:
                try:
                    return self.w3.eth.get_transaction_receipt(h)
                except TransactionNotFound:
                    continue
            now = time.monotonic()
            if now >= deadline:
                # It may still land; re-read the nonce next time instead of guessing.
                self._next_nonce = 0
                raise ChainError(
                    f"{action}: no receipt for {hashes[-1].to_0x_hex()} within "
                    f"{self.timeout:.0f} s ({bumps} fee bumps)",
                    tx_hash=hashes[-1].to_0x_hex(),
                )
            if now >= next_bump and bumps < self.max_bumps:
                bumps += 1
                next_bump = now + self.stuck_after_s
                self._bump(tx, hashes, action)
            time.sleep(self.poll_interval)

    def _bump(self, tx: TxParams, hashes: list[Any], action: str) -> None:
        old_fee, old_tip = int(tx["maxFeePerGas"]), int(tx["maxPriorityFeePerGas"])
        fee = max(math.ceil(old_fee * self.bump_factor), old_fee + 1)
        tip = max(math.ceil(old_tip * self.bump_factor), old_tip + 1)
        if self.max_fee_cap_wei is not None and fee > self.max_fee_cap_wei:
            return  # at the cap: keep waiting rather than overpay
        tx["maxFeePerGas"], tx["maxPriorityFeePerGas"] = fee, tip
        try:
            hashes.append(self._send_signed(tx))
        except Web3RPCError as exc:
            # "nonce too low": a version already sent was mined (the next poll finds it);
            # "underpriced": the pool wants more (the next bump gives more).
            log.info("%s: fee bump not accepted: %s", action, _rpc_message(exc))
            return
        self.bumps += 1
        log.info(
            "%s: no receipt after %.0f s, fees raised",
            action,
            self.stuck_after_s,
            extra={"fields": {"nonce": tx["nonce"], "from_wei": old_fee, "to_wei": fee}},
        )

    def _replay_reason(self, tx: TxParams, receipt: TxReceipt) -> str:
        # Estimation passed but the mined transaction failed, so the state moved in between;
        # re-running it on the state of its block usually reproduces the reason.
        call: TxParams = {k: tx[k] for k in ("from", "to", "data", "value", "gas") if k in tx}
        try:
            self.w3.eth.call(call, block_identifier=receipt["blockNumber"])
        except ContractLogicError as exc:
            return revert_reason(exc)
        except Web3Exception:
            pass
        return "reason unknown (out of gas or state changed)"


def _retryable(exc: Web3RPCError) -> bool:
    """A send refused for a reason a fresh nonce and fees fix: another sender of this key took
    the nonce, or the base fee rose past our offer between reading it and sending."""
    message = _rpc_message(exc).lower()
    return any(
        m in message
        for m in (
            "nonce too low",
            "replacement transaction underpriced",
            "less than block base fee",
        )
    )


def make_web3(rpc_url: str, timeout: float = 30.0, retries: int = 3) -> Web3:
    """A Web3 over HTTP whose every request gives up after `timeout` seconds.

    Idempotent reads are retried `retries` times with a short backoff (0.1 s, doubling): enough
    to ride out a node restart's blip, short enough that a wrong URL fails within a second
    rather than after web3's default ~2 s per call.
    """
    provider = Web3.HTTPProvider(
        rpc_url,
        request_kwargs={"timeout": timeout},
        exception_retry_configuration=ExceptionRetryConfiguration(
            errors=(requests.ConnectionError, requests.HTTPError, requests.Timeout),
            retries=retries,
            backoff_factor=0.1,
        ),
    )
    return Web3(provider)
