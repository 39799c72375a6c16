"""Sign, send and confirm transactions from a local key, turning every failure into `ChainError`.

One `TxSender` per account. Nonces come from the node's pending count, raised to at least the
last nonce this sender used, so several processes with different accounts never interfere and
threads sharing one sender stay in order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import requests
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import (
    ContractLogicError,
    TimeExhausted,
    Web3Exception,
    Web3RPCError,
)
from web3.providers.rpc.utils import ExceptionRetryConfiguration
from web3.types import TxParams, TxReceipt

from .errors import ChainError, ChainRevert

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
    """Sends transactions for one account and waits for their receipts."""

    def __init__(
        self,
        w3: Web3,
        account: LocalAccount,
        *,
        timeout: float = 60.0,
        gas_margin: float = 1.2,
        poll_interval: float = 0.1,
    ) -> None:
        self.w3 = w3
        self.account = account
        self.timeout = timeout
        # Headroom over the estimate: state can move between estimate and inclusion (e.g. an
        # attest batch whose skips turn into writes).
        self.gas_margin = gas_margin
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._next_nonce = 0

    @property
    def rpc_url(self) -> str:
        return str(getattr(self.w3.provider, "endpoint_uri", "?"))

    def send(self, call: Buildable, action: str, *, value: int = 0) -> TxReceipt:
        """Estimate, sign, send and wait; raise `ChainError` (with the revert reason) on failure."""
        with chain_errors(action, self.rpc_url):
            tx_hash, tx = self._submit(call, value)
            try:
                receipt = self.w3.eth.wait_for_transaction_receipt(
                    tx_hash, timeout=self.timeout, poll_latency=self.poll_interval
                )
            except TimeExhausted:
                # The transaction may still land; re-read the nonce next time instead of
                # guessing whether this one will be mined.
                self._next_nonce = 0
                raise ChainError(
                    f"{action}: no receipt for {tx_hash.to_0x_hex()} within {self.timeout:.0f} s",
                    tx_hash=tx_hash.to_0x_hex(),
                ) from None
            if receipt["status"] != 1:
                reason = self._replay_reason(tx, receipt)
                raise ChainRevert(
                    f"{action} reverted on chain: {reason}",
                    reason=reason,
                    tx_hash=tx_hash.to_0x_hex(),
                )
            return receipt

    def _submit(self, call: Buildable, value: int) -> tuple[Any, TxParams]:
        address = self.account.address
        with self._lock:
            pending = self.w3.eth.get_transaction_count(address, "pending")
            nonce = max(pending, self._next_nonce)
            # build_transaction estimates gas, which runs the call: a revert surfaces here with
            # its reason, before anything is signed.
            tx = call.build_transaction({"from": address, "nonce": nonce, "value": value})
            tx["gas"] = int(tx["gas"] * self.gas_margin)
            signed = self.account.sign_transaction(tx)
            try:
                tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except Web3RPCError as exc:
                # A send retried after a lost reply finds its own transaction in the pool.
                if "already known" not in _rpc_message(exc).lower():
                    raise
                tx_hash = signed.hash
            self._next_nonce = nonce + 1
        return tx_hash, tx

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
