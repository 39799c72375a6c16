"""The relay HTTP paths, in one place so the client, the publisher and the service agree."""

from __future__ import annotations

from urllib.parse import quote

PREFIX = "/v1"
VERSIONS = f"{PREFIX}/versions"
# Versions whose manifest is held but not every shard yet (same body as VERSIONS).
PARTIAL = f"{VERSIONS}/partial"
# Longest a relay holds a request for a shard it is still pulling (`?wait=` seconds).
MAX_WAIT_S = 30.0


def manifest_path(version: int) -> str:
    return f"{VERSIONS}/{int(version)}/manifest"


def shard_path(version: int, file_name: str, index: int) -> str:
    # Manifest names are already restricted to [A-Za-z0-9._-]; quoting is defence in depth.
    return f"{VERSIONS}/{int(version)}/files/{quote(file_name, safe='')}/shards/{int(index)}"


def join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path
