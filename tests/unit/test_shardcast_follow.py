"""Byte-level cut-through: following a shard writer while it receives the shard."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from eth_account import Account

from prime_swarm.libs.shardcast import ShardHashError, VersionStore, build_manifest
from prime_swarm.libs.shardcast.follow import FollowBroken, ShardFollower
from prime_swarm.libs.shardcast.manifest import iter_shard_bytes
from prime_swarm.libs.shardcast.store import ShardWriter
from prime_swarm.protocol.manifest_signing import sign_manifest

TRAINER = Account.create()
SIZE = 300_000


@pytest.fixture()
def shard(tmp_path: Path) -> tuple[VersionStore, ShardWriter, bytes]:
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(SIZE))
    signed = sign_manifest(build_manifest(d, 1, None, SIZE, TRAINER.address), TRAINER)
    store = VersionStore(tmp_path / "store")
    store.put_manifest(signed)
    f = signed.manifest.files[0]
    data = b"".join(iter_shard_bytes(d / f.name, f.shards[0]))
    return store, store.open_shard_writer(1, f.name, 0), data


def _collect(follower: ShardFollower) -> bytes:
    async def run() -> bytes:
        out = bytearray()
        async for chunk in follower.chunks():
            out += chunk
        return bytes(out)

    return asyncio.run(run())


def _write_slowly(writer: ShardWriter, data: bytes, pieces: int, then: str = "commit") -> None:
    step = len(data) // pieces + 1
    for i in range(0, len(data), step):
        writer.write(data[i : i + step])
        threading.Event().wait(0.01)
    if then == "commit":
        writer.commit()
    elif then == "abort":
        writer.abort()


def test_follower_streams_bytes_as_they_arrive_then_the_file_is_committed(
    shard: tuple[VersionStore, ShardWriter, bytes],
) -> None:
    store, writer, data = shard
    assert store.writer_of(1, "model.safetensors", 0) is writer
    follower = ShardFollower(writer)
    t = threading.Thread(target=_write_slowly, args=(writer, data, 30))
    t.start()
    got = _collect(follower)
    t.join()
    assert got == data
    assert writer.state == "committed"
    assert store.writer_of(1, "model.safetensors", 0) is None  # done: served from the file now
    assert store.shard_path(1, "model.safetensors", 0).read_bytes() == data


def test_follower_resumes_from_an_offset(shard: tuple[VersionStore, ShardWriter, bytes]) -> None:
    _, writer, data = shard
    writer.write(data[:1000])
    follower = ShardFollower(writer, start=12_345)
    t = threading.Thread(target=_write_slowly, args=(writer, data[1000:], 5))
    t.start()
    assert _collect(follower) == data[12_345:]
    t.join()


@pytest.mark.parametrize("failure", ["abort", "reset"])
def test_follower_is_cut_off_when_the_writer_fails_or_starts_over(
    shard: tuple[VersionStore, ShardWriter, bytes], failure: str
) -> None:
    _, writer, data = shard
    writer.write(data[:100_000])
    follower = ShardFollower(writer)

    async def run() -> int:
        got = 0
        async for chunk in follower.chunks():
            got += len(chunk)
            if got >= 100_000:
                # The writer fails while the reader waits for more.
                if failure == "abort":
                    writer.abort()
                else:
                    writer.reset()
        return got

    with pytest.raises(FollowBroken):
        asyncio.run(run())
    if failure == "reset":
        writer.abort()


def test_follower_of_a_writer_whose_hash_fails_is_cut_off(
    shard: tuple[VersionStore, ShardWriter, bytes],
) -> None:
    _, writer, data = shard
    bad = bytes([data[0] ^ 1]) + data[1:]
    follower = ShardFollower(writer)

    def write_then_commit() -> None:
        writer.write(bad[: SIZE // 2])
        threading.Event().wait(0.2)
        writer.write(bad[SIZE // 2 : -1])  # one byte short: the reader waits for it
        threading.Event().wait(0.1)
        with pytest.raises(ShardHashError):
            writer.write(bad[-1:])
            writer.commit()

    t = threading.Thread(target=write_then_commit)
    t.start()
    # Every byte but the last arrives; the last is held back until the hash is checked.
    with pytest.raises(FollowBroken):
        _collect(follower)
    t.join()
    assert writer.state == "failed"


def test_a_stalled_writer_ends_the_follow_after_the_idle_timeout(
    shard: tuple[VersionStore, ShardWriter, bytes],
) -> None:
    _, writer, data = shard
    writer.write(data[:10])
    follower = ShardFollower(writer, idle_timeout_s=0.2)
    with pytest.raises(FollowBroken, match="no bytes"):
        _collect(follower)
    writer.abort()


def test_a_finished_writer_cannot_be_followed(
    shard: tuple[VersionStore, ShardWriter, bytes],
) -> None:
    _, writer, data = shard
    writer.write(data)
    writer.commit()
    with pytest.raises(FileNotFoundError):
        ShardFollower(writer)
