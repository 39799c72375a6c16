"""The on-disk version store: atomic writes, completeness, eviction and path safety."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from eth_account import Account

from prime_swarm.libs.shardcast import (
    NotHeldError,
    ShardHashError,
    ShardTooLargeError,
    UnsafeNameError,
    VersionConflictError,
    VersionStore,
    build_manifest,
)
from prime_swarm.libs.shardcast.manifest import iter_shard_bytes
from prime_swarm.protocol.manifest_signing import sign_manifest
from prime_swarm.protocol.messages import SignedManifest

TRAINER = Account.create()


def _version(tmp_path: Path, version: int, size: int = 50_000) -> tuple[Path, SignedManifest]:
    d = tmp_path / f"model{version}"
    d.mkdir()
    (d / "config.json").write_text(f'{{"v": {version}}}')
    (d / "model.safetensors").write_bytes(os.urandom(size))
    m = build_manifest(d, version, version - 1 if version else None, 20_000, TRAINER.address)
    return d, sign_manifest(m, TRAINER)


def _fill(store: VersionStore, model_dir: Path, signed: SignedManifest) -> None:
    store.put_manifest(signed)
    for f in signed.manifest.files:
        for s in f.shards:
            with store.open_shard_writer(signed.manifest.version, f.name, s.index) as w:
                for chunk in iter_shard_bytes(model_dir / f.name, s, chunk=7000):
                    w.write(chunk)
                w.commit()
    assert store.mark_complete(signed.manifest.version)


def test_version_is_listed_only_when_complete(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    d, signed = _version(tmp_path, 1)
    assert store.put_manifest(signed) is True
    assert store.put_manifest(signed) is False  # idempotent re-upload
    assert store.versions() == [] and store.held_versions() == [1]
    assert not store.mark_complete(1)
    _fill(store, d, signed)
    assert store.versions() == [1] and store.latest() == 1
    first = signed.manifest.files[0]
    path = store.shard_path(1, first.name, 0)
    assert path.read_bytes() == (d / first.name).read_bytes()[: first.shards[0].size]
    # A fresh store over the same directory sees the same state.
    again = VersionStore(tmp_path / "store")
    assert again.versions() == [1] and again.get_manifest(1) == signed


def test_missing_shards_are_tracked_as_writers_commit(tmp_path: Path) -> None:
    """One scan per version, then every commit, rejected write and fresh store keeps the count
    exact (the origin and relays ask after every shard)."""
    store = VersionStore(tmp_path / "store")
    d, signed = _version(tmp_path, 1)
    store.put_manifest(signed)
    shards = [(f, s) for f in signed.manifest.files for s in f.shards]
    assert store.missing_count(1) == len(shards)
    for done, (f, s) in enumerate(shards, 1):
        with store.open_shard_writer(1, f.name, s.index) as w:
            w.write(b"x")  # a wrong start: the writer refuses it and nothing becomes held
            with pytest.raises(ShardHashError):
                w.commit()
        assert store.missing_count(1) == len(shards) - done + 1
        with store.open_shard_writer(1, f.name, s.index) as w:
            for chunk in iter_shard_bytes(d / f.name, s):
                w.write(chunk)
            w.commit()
        assert store.missing_count(1) == len(shards) - done
        assert [(g.name, t.index) for g, t in store.missing_shards(1)] == [
            (g.name, t.index) for g, t in shards[done:]
        ]
        # A store opened on the same directory (a restarted relay) scans and agrees.
        assert VersionStore(tmp_path / "store").missing_count(1) == len(shards) - done
    assert store.mark_complete(1)


def test_bad_shard_bytes_are_never_visible(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    d, signed = _version(tmp_path, 1)
    store.put_manifest(signed)
    f = next(f for f in signed.manifest.files if f.name == "model.safetensors")
    good = b"".join(iter_shard_bytes(d / f.name, f.shards[0]))
    with store.open_shard_writer(1, f.name, 0) as w:
        w.write(bytes([good[0] ^ 0xFF]) + good[1:])
        with pytest.raises(ShardHashError):
            w.commit()
    with store.open_shard_writer(1, f.name, 0) as w, pytest.raises(ShardTooLargeError):
        w.write(good + b"!")
    assert not store.has_shard(1, f.name, 0)
    assert not list((store.root / "v1").rglob("*.tmp"))  # temp files cleaned up


def test_unknown_version_file_or_shard(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    _, signed = _version(tmp_path, 1)
    store.put_manifest(signed)
    for args in [(2, "config.json", 0), (1, "nope.bin", 0), (1, "config.json", 5)]:
        with pytest.raises(NotHeldError):
            store.open_shard_writer(*args)
    assert store.get_manifest(9) is None


@pytest.mark.parametrize(
    "name,index", [("..", 0), (".", 0), ("../../etc", 0), ("a/b", 0), ("ok", -1)]
)
def test_path_traversal_is_refused(tmp_path: Path, name: str, index: int) -> None:
    store = VersionStore(tmp_path / "store")
    with pytest.raises(UnsafeNameError):
        store.shard_path(1, name, index)
    with pytest.raises(UnsafeNameError):
        store.version_dir(-1)


def test_eviction_keeps_newest_k_and_drops_stale_partials(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    models = {v: _version(tmp_path, v) for v in range(1, 7)}
    for v in (1, 2, 4, 5):
        _fill(store, *models[v])
    store.put_manifest(models[3][1])  # partial, older than what will be kept
    store.put_manifest(models[6][1])  # partial, newer: still being pulled
    evicted = store.evict(keep=2)
    assert sorted(evicted) == [1, 2, 3]
    assert store.versions() == [4, 5] and store.held_versions() == [4, 5, 6]
    assert store.get_manifest(1) is None
    assert not (store.root / "v1").exists()
    assert not [p for p in store.root.iterdir() if p.name.startswith(".trash-")]


def test_conflicting_manifest_replaces_partial_but_not_complete(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    d1, first = _version(tmp_path / "a", 1)
    _, second = _version(tmp_path / "b", 1)
    store.put_manifest(first)
    assert store.put_manifest(second) is True  # trainer restarted mid-upload
    assert store.get_manifest(1) == second
    store2 = VersionStore(tmp_path / "store2")
    _fill(store2, d1, first)
    with pytest.raises(VersionConflictError):
        store2.put_manifest(second)


def test_unchanged_shards_are_linked_from_a_held_version(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    d0, v0 = _version(tmp_path, 0)
    _fill(store, d0, v0)
    # Version 1: the same config and the weights' first shard unchanged, the rest new.
    d1 = tmp_path / "model1"
    d1.mkdir()
    (d1 / "config.json").write_bytes((d0 / "config.json").read_bytes())
    weights = bytearray((d0 / "model.safetensors").read_bytes())
    weights[25_000:] = os.urandom(len(weights) - 25_000)  # shards are 20 kB: index 0 unchanged
    (d1 / "model.safetensors").write_bytes(weights)
    v1 = sign_manifest(build_manifest(d1, 1, 0, 20_000, TRAINER.address), TRAINER)
    store.put_manifest(v1)
    missing = {(f.name, s.index) for f, s in store.missing_shards(1)}
    assert missing == {("model.safetensors", 1), ("model.safetensors", 2)}
    linked = store.shard_path(1, "model.safetensors", 0)
    assert linked.read_bytes() == bytes(weights[:20_000])
    assert os.path.samefile(linked, store.shard_path(0, "model.safetensors", 0))
    # Evicting the old version leaves the new one whole.
    _fill(store, d1, v1)
    assert store.evict(1) == [0]
    assert store.shard_path(1, "config.json", 0).read_bytes() == (d1 / "config.json").read_bytes()


def test_a_partial_version_lends_nothing(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    _, v0 = _version(tmp_path, 0)
    store.put_manifest(v0)  # never completed: its shards are not all checked in
    d1 = tmp_path / "model1"
    d1.mkdir()
    (d1 / "config.json").write_text('{"v": 0}')
    (d1 / "model.safetensors").write_bytes(os.urandom(1000))
    v1 = sign_manifest(build_manifest(d1, 1, 0, 20_000, TRAINER.address), TRAINER)
    store.put_manifest(v1)
    assert len(store.missing_shards(1)) == 2


def test_rotted_bytes_are_not_linked(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "store")
    d0, v0 = _version(tmp_path, 0)
    _fill(store, d0, v0)
    rotted = store.shard_path(0, "config.json", 0)
    rotted.write_bytes(rotted.read_bytes().replace(b"0", b"9"))  # bit rot after check-in
    d1 = tmp_path / "model1"
    d1.mkdir()
    (d1 / "config.json").write_bytes((d0 / "config.json").read_bytes())
    (d1 / "model.safetensors").write_bytes((d0 / "model.safetensors").read_bytes())
    store.put_manifest(sign_manifest(build_manifest(d1, 1, 0, 20_000, TRAINER.address), TRAINER))
    assert [(f.name, s.index) for f, s in store.missing_shards(1)] == [("config.json", 0)]
