"""Range resume of partial shards (real HTTP on 127.0.0.1, the production transport) and
throughput-aware relay choice."""

from __future__ import annotations

import os
import re
from email.message import Message
from pathlib import Path

import pytest
from eth_account import Account
from scripted_relay import Reply, ScriptedRelay

from prime_swarm.libs.shardcast import (
    NotAvailableError,
    RelayPool,
    build_manifest,
    download_version,
    routes,
)
from prime_swarm.libs.shardcast.manifest import iter_shard_bytes
from prime_swarm.libs.shardcast.transport import FetchOptions
from prime_swarm.protocol.manifest_signing import sign_manifest
from prime_swarm.protocol.messages import SignedManifest

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

    def manifest_or(path: str) -> Reply | None:
        if path.split("?")[0] == routes.manifest_path(1):
            return Reply(body=signed.model_dump_json().encode())
        return None

    def relay_a(path: str, headers: Message) -> Reply:
        """Sends half of every shard, then the connection drops."""
        if (reply := manifest_or(path)) is not None:
            return reply
        data = shards[path.split("?")[0]]
        sent["a"] += len(data) // 2
        return Reply(body=data, cut_after=len(data) // 2)

    def relay_b(path: str, headers: Message) -> Reply:
        if (reply := manifest_or(path)) is not None:
            return reply
        data = shards[path.split("?")[0]]
        rng = headers.get("range")
        if rng is None:  # a shard that went to b first
            sent["b"] += len(data)
            return Reply(body=data)
        ranges.append(rng)
        start = int(re.match(r"bytes=(\d+)-$", rng).group(1))  # type: ignore[union-attr]
        sent["b"] += len(data) - start
        return Reply(
            206,
            body=data[start:],
            headers={"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"},
        )

    a, b = ScriptedRelay(relay_a), ScriptedRelay(relay_b)
    try:
        pool = RelayPool([a.url, b.url])
        out = download_version(
            pool, 1, tmp_path / "out", TRAINER.address, max_workers=1, verify_files=True
        )
    finally:
        a.close()
        b.close()
    assert (out / f.name).read_bytes() == (d / f.name).read_bytes()
    errors_a = pool.report()[a.url]["errors"]
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


def test_a_transfers_deadline_is_its_share_of_the_slowest_link_tolerated() -> None:
    """Eight transfers sharing a 25 Mbit/s home link (about 390 KB/s each) must finish a
    16 MiB shard within their deadline; one trickling at a tenth of that is cut off."""
    from prime_swarm.libs.shardcast.fetch import transfer_deadline
    from prime_swarm.protocol.messages import ShardInfo

    shard = ShardInfo(index=0, offset=0, size=16 << 20, sha256="0" * 64)
    opts = FetchOptions(timeout_s=10.0, max_workers=8)
    share_of_home_link = 25e6 / 8 / 8
    assert shard.size / share_of_home_link < transfer_deadline(shard, opts)
    assert shard.size / (share_of_home_link / 10) > transfer_deadline(shard, opts)
    # Alone on the link, a transfer gets the whole floor: a trickle is cut as soon as before.
    alone = FetchOptions(timeout_s=10.0, max_workers=1)
    assert transfer_deadline(shard, alone) < transfer_deadline(shard, opts) / 4


def _one_file_version(tmp_path: Path, size: int, shard_size: int) -> tuple[SignedManifest, bytes]:
    """Version 1: one file of `size` random bytes in shards of `shard_size`, signed."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(size))
    signed = sign_manifest(build_manifest(d, 1, None, shard_size, TRAINER.address), TRAINER)
    return signed, (d / "model.safetensors").read_bytes()


def _flaky_relay_download(tmp_path: Path, per_attempt: int) -> tuple[int, Exception | None]:
    """One 6 MiB shard from one relay that cuts every transfer after `per_attempt` new bytes
    (resuming where the last one stopped), with a budget of 3 attempts. Returns the attempts
    the relay saw and the download's error, if any."""
    signed, data = _one_file_version(tmp_path, 6 << 20, 8 << 20)
    f = signed.manifest.files[0]
    seen = {"attempts": 0}

    def relay(path: str, headers: Message) -> Reply:
        if path.split("?")[0] == routes.manifest_path(1):
            return Reply(body=signed.model_dump_json().encode())
        seen["attempts"] += 1
        m = re.match(r"bytes=(\d+)-$", headers.get("range") or "bytes=0-")
        start = int(m.group(1))  # type: ignore[union-attr]
        cut = per_attempt if start + per_attempt < len(data) else None
        if start == 0:
            return Reply(body=data, cut_after=cut)
        return Reply(
            206,
            body=data[start:],
            headers={"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"},
            cut_after=cut,
        )

    r = ScriptedRelay(relay)
    try:
        download_version([r.url], 1, tmp_path / "out", TRAINER.address, attempts_per_shard=3)
    except NotAvailableError as exc:
        return seen["attempts"], exc
    finally:
        r.close()
    assert (tmp_path / "out" / f.name).read_bytes() == data
    return seen["attempts"], None


def test_an_attempt_that_moved_the_shard_forward_is_given_back(tmp_path: Path) -> None:
    # Cut off every 1.5 MiB: four attempts for a 6 MiB shard within a budget of three.
    attempts, error = _flaky_relay_download(tmp_path, 3 << 19)
    assert error is None
    assert attempts == 4


def test_a_relay_that_trickles_between_cuts_still_exhausts_the_budget(tmp_path: Path) -> None:
    # 64 KiB an attempt is not progress worth a retry: three attempts, then the shard fails.
    attempts, error = _flaky_relay_download(tmp_path, 64 << 10)
    assert attempts == 3
    assert error is not None and "in 3 attempts" in str(error)


def test_a_transfer_under_its_floor_is_cut_and_resumed_on_a_new_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transfer at half its floor (MIN_RATE_BPS shared by 8 transfers) is cut after one
    low-speed window and resumed by Range; without the cut it would have run to its end within
    its deadline (6 s of 13 s) at that pace. Scaled up so it takes seconds: a 1 MiB/s floor."""
    from prime_swarm.libs.shardcast import fetch

    monkeypatch.setattr(fetch, "LOW_SPEED_WINDOW_S", 1.0)
    monkeypatch.setattr(fetch, "MIN_RATE_BPS", 8 << 20)
    signed, data = _one_file_version(tmp_path, 3 << 20, 4 << 20)
    f = signed.manifest.files[0]
    ranges: list[str | None] = []

    def relay(path: str, headers: Message) -> Reply:
        if path.split("?")[0] == routes.manifest_path(1):
            return Reply(body=signed.model_dump_json().encode())
        ranges.append(headers.get("range"))
        if len(ranges) == 1:
            return Reply(body=data, pace_bps=fetch.low_speed_floor_bps(FetchOptions()) / 2)
        m = re.match(r"bytes=(\d+)-$", ranges[-1] or "")
        start = int(m.group(1)) if m else 0
        return Reply(
            206,
            body=data[start:],
            headers={"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"},
        )

    r = ScriptedRelay(relay)
    try:
        download_version([r.url], 1, tmp_path / "out", TRAINER.address, timeout_s=10.0)
    finally:
        r.close()
    assert (tmp_path / "out" / f.name).read_bytes() == data
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int((ranges[1] or "").removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at < len(data)  # cut mid-shard, its bytes kept
