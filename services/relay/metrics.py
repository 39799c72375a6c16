"""Prometheus metrics of one relay process (own registry, so several apps can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from prime_swarm.libs.shardcast import VersionStore


class RelayMetrics:
    def __init__(self, store: VersionStore, mode: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.bytes_served = Counter(
            "shardcast_bytes_served", "Shard bytes sent to clients.", registry=r
        )
        self.shards_served = Counter(
            "shardcast_shards_served", "Shard responses started (GET, incl. ranges).", registry=r
        )
        self.shards_received = Counter(
            "shardcast_shards_received", "Verified shards stored (uploaded or pulled).", registry=r
        )
        self.shards_rejected = Counter(
            "shardcast_shards_rejected", "Uploaded shards refused for size or hash.", registry=r
        )
        self.upstream_errors = Counter(
            "shardcast_upstream_errors",
            "Failed requests to parents, by kind (error, demoted).",
            ["kind"],
            registry=r,
        )
        versions = Gauge("shardcast_versions_held", "Complete versions held.", registry=r)
        versions.set_function(lambda: len(store.versions()))
        latest = Gauge(
            "shardcast_latest_version", "Newest complete version, -1 if none.", registry=r
        )
        latest.set_function(lambda: -1 if store.latest() is None else store.latest())
        info = Gauge(
            "shardcast_relay_info", "Static facts about this process.", ["mode"], registry=r
        )
        info.labels(mode=mode).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
