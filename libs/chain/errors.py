"""Errors raised by the chain library; every failure a caller can act on is a `ChainError`."""

from __future__ import annotations


class ChainError(Exception):
    """A chain operation failed: revert, unreachable node, timeout or bad input.

    `reason` is the contract's revert string when there is one (e.g. "not a validator"), so
    callers can branch on it without parsing the message.
    """

    def __init__(self, message: str, *, reason: str | None = None, tx_hash: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.tx_hash = tx_hash


class ChainRevert(ChainError):
    """The contract refused the call; `reason` holds its revert string."""


class KeyFileError(ValueError):
    """A key file exists but cannot be used (unreadable, malformed, wrong key)."""
