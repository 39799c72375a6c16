"""Range resume of partial shards and throughput-aware relay choice (no sockets)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
from eth_account import Account

from prime_swarm.libs.shardcast import RelayPool, build_manifest, download_version, routes
from prime_swarm.libs.shardcast.manifest import iter_shard_bytes
from prime_swarm.protocol.manifest_signing import sign_manifest

TRAINER = Account.create()


def test_cut_transfer_resumes_with_range_on_another_relay(tmp_path: Path) -> None:
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(100_000))
    signed = sign_manifest(build_manifest(d, 1, None, 32_768, TRAINER.address), TRAINER)
    f = signed.manifest.files[0]
    shards = {
        routes.shard_path(1, f.name, s.index): b"".join(iter_shard_bytes(d / f.name, s))
        for s in f.shards
    }
    sent = {"a": 0, "b": 0}
    ranges: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == routes.manifest_path(1):
            return httpx.Response(200, content=signed.model_dump_json())
        data = shards[request.url.path]
        if host == "a":  # sends half of every shard, then the connection drops

            def cut():  # type: ignore[no-untyped-def]
                sent["a"] += len(data) // 2
                yield data[: len(data) // 2]
                raise httpx.ReadError("connection reset")

            return httpx.Response(200, headers={"Content-Length": str(len(data))}, content=cut())
        rng = request.headers.get("range")
        if rng is None:  # a shard that went to b first
            sent["b"] += len(data)
            return httpx.Response(200, content=data)
        ranges.append(rng)
        start = int(re.match(r"bytes=(\d+)-$", rng).group(1))  # type: ignore[union-attr]
        sent["b"] += len(data) - start
        return httpx.Response(
            206,
            headers={"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"},
            content=data[start:],
        )

    pool = RelayPool(["http://a", "http://b"])
    http = httpx.Client(transport=httpx.MockTransport(handler))
    out = download_version(
        pool, 1, tmp_path / "out", TRAINER.address, http=http, max_workers=1, verify_files=True
    )
    assert (out / f.name).read_bytes() == (d / f.name).read_bytes()
    errors_a = pool.report()["http://a"]["errors"]
    assert ranges and len(ranges) == errors_a
    # Nothing was downloaded twice: the halves from a plus the rest from b make the file.
    assert sent["a"] + sent["b"] == f.size
    assert not pool.demoted


def test_pick_prefers_measured_throughput_and_spreads_in_flight_work() -> None:
    pool = RelayPool(["http://slow", "http://fast"])
    pool.record_ok("http://slow", 1_000_000, 1.0)
    pool.record_ok("http://fast", 10_000_000, 1.0)
    assert pool.pick(0) == "http://fast"
    for _ in range(10):
        pool.begin("http://fast")
    assert pool.pick(0) == "http://slow"  # 11 queued on fast cost more than 1 on slow
    pool.demote("http://slow", "lied")
    assert pool.pick(0) == "http://fast"
