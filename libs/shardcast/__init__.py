"""SHARDCAST: distributing signed policy versions through untrusted HTTP relays.

Library only (no service loop): the relay service in `services/relay` and the workers, validators
and trainer all build on these functions.
"""

from .client import (
    download_version,
    fetch_manifest,
    list_versions,
    wait_for_manifest,
    wait_for_version,
)
from .errors import (
    IntegrityError,
    ManifestLayoutError,
    NotAvailableError,
    PublishError,
    ShardcastError,
    ShardHashError,
    ShardTooLargeError,
    UnsafeNameError,
)
from .manifest import DEFAULT_SHARD_SIZE, build_manifest
from .publish import publish_version
from .relays import RelayPool
from .store import NotHeldError, VersionConflictError, VersionStore

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "IntegrityError",
    "ManifestLayoutError",
    "NotAvailableError",
    "NotHeldError",
    "PublishError",
    "RelayPool",
    "ShardHashError",
    "ShardTooLargeError",
    "ShardcastError",
    "UnsafeNameError",
    "VersionConflictError",
    "VersionStore",
    "build_manifest",
    "download_version",
    "fetch_manifest",
    "list_versions",
    "publish_version",
    "wait_for_manifest",
    "wait_for_version",
]
