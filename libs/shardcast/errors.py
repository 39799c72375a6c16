"""Errors of the shardcast library, split by who is to blame.

Callers react differently to each: bad bytes demote a relay, a missing shard only moves on to
the next relay, and an unusable manifest aborts the download.
"""

from __future__ import annotations


class ShardcastError(Exception):
    """Base class for everything this library raises on purpose."""


class UnsafeNameError(ShardcastError, ValueError):
    """A file name or version that could escape the store or output directory."""


class ManifestLayoutError(ShardcastError, ValueError):
    """A validly signed manifest whose file table cannot be laid out safely on disk."""


class IntegrityError(ShardcastError):
    """Bytes that do not match the signed manifest: whoever served them is not to be trusted."""


class ShardTooLargeError(IntegrityError):
    """More bytes than the manifest allows for a shard."""


class ShardHashError(IntegrityError):
    """A shard (or file) whose size or sha256 differs from the manifest."""


class NotAvailableError(ShardcastError):
    """No relay could provide what was asked within the retry budget."""


class PublishError(ShardcastError):
    """The origin refused or failed an upload."""
