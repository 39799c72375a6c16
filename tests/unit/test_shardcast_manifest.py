"""Manifest building, signing and the integrity checks that sit on top of it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from eth_account import Account

from prime_swarm.libs.shardcast import ShardHashError, ShardTooLargeError, build_manifest
from prime_swarm.libs.shardcast.errors import ManifestLayoutError, UnsafeNameError
from prime_swarm.libs.shardcast.manifest import check_file_name, check_layout, iter_shard_bytes
from prime_swarm.libs.shardcast.verify import ShardVerifier
from prime_swarm.protocol.manifest_signing import ManifestError, sign_manifest, verify_manifest
from prime_swarm.protocol.messages import FileDelta, SignedManifest


def _model_dir(tmp_path: Path, weights: int = 100_000) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 8}')
    (d / "tokenizer.json").write_text('{"vocab": {}}')
    (d / "model.safetensors").write_bytes(os.urandom(weights))
    (d / "empty.txt").write_bytes(b"")
    return d


def test_shards_cover_each_file_and_hash_it(tmp_path: Path) -> None:
    d = _model_dir(tmp_path)
    acct = Account.create()
    m = build_manifest(d, 3, 2, 32_768, acct.address)
    weights = next(f for f in m.files if f.name == "model.safetensors")
    assert [s.size for s in weights.shards] == [32_768, 32_768, 32_768, 1_696]
    data = (d / "model.safetensors").read_bytes()
    assert weights.sha256 == hashlib.sha256(data).hexdigest()
    for s in weights.shards:
        assert s.sha256 == hashlib.sha256(data[s.offset : s.offset + s.size]).hexdigest()
        assert (
            b"".join(iter_shard_bytes(d / weights.name, s, chunk=1000))
            == data[s.offset : s.offset + s.size]
        )
    empty = next(f for f in m.files if f.name == "empty.txt")
    assert empty.size == 0 and empty.shards == []


def test_exact_multiple_of_shard_size_has_no_empty_tail(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, weights=65_536)
    m = build_manifest(d, 0, None, 32_768, Account.create().address)
    weights = next(f for f in m.files if f.name == "model.safetensors")
    assert [s.size for s in weights.shards] == [32_768, 32_768]


def test_sign_verify_roundtrip_through_json(tmp_path: Path) -> None:
    acct = Account.create()
    signed = sign_manifest(build_manifest(_model_dir(tmp_path), 1, 0, 10_000, acct.address), acct)
    again = SignedManifest.model_validate_json(signed.model_dump_json())
    assert verify_manifest(again, acct.address) == signed.manifest
    # Kept as the trainer wrote it: a manifest signed by a trainer that sent EIP-55 must read
    # back to the same text to verify.
    assert again.manifest.trainer == acct.address
    assert verify_manifest(again, acct.address.lower()) == signed.manifest


def test_wrong_signer_and_tampered_shard_hash_are_refused(tmp_path: Path) -> None:
    trainer, forger = Account.create(), Account.create()
    m = build_manifest(_model_dir(tmp_path), 1, 0, 10_000, trainer.address)
    with pytest.raises(ManifestError):
        verify_manifest(
            sign_manifest(m.model_copy(update={"trainer": forger.address}), forger), trainer.address
        )
    signed = sign_manifest(m, trainer)
    files = [f.model_copy(deep=True) for f in m.files]
    s0 = files[0].shards[0]
    files[0] = files[0].model_copy(
        update={"shards": [s0.model_copy(update={"sha256": "0" * 64}), *files[0].shards[1:]]}
    )
    tampered = SignedManifest(
        manifest=m.model_copy(update={"files": files}), signature=signed.signature
    )
    with pytest.raises(ManifestError):
        verify_manifest(tampered, trainer.address)


def test_verifier_catches_bad_bytes_and_overrun(tmp_path: Path) -> None:
    d = _model_dir(tmp_path)
    m = build_manifest(d, 1, 0, 32_768, Account.create().address)
    weights = next(f for f in m.files if f.name == "model.safetensors")
    good = b"".join(iter_shard_bytes(d / weights.name, weights.shards[0]))

    v = ShardVerifier(weights.shards[0])
    v.update(good)
    v.finish()

    flipped = bytes([good[0] ^ 1]) + good[1:]
    v = ShardVerifier(weights.shards[0])
    v.update(flipped)
    with pytest.raises(ShardHashError):
        v.finish()

    v = ShardVerifier(weights.shards[0])
    v.update(good[:-1])
    with pytest.raises(ShardHashError):  # short
        v.finish()

    v = ShardVerifier(weights.shards[0])
    with pytest.raises(ShardTooLargeError):
        v.update(good + b"x")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "..\\x", "x\0"])
def test_unsafe_file_names(name: str) -> None:
    with pytest.raises(UnsafeNameError):
        check_file_name(name)


def test_layout_refuses_duplicate_and_dot_names(tmp_path: Path) -> None:
    m = build_manifest(_model_dir(tmp_path), 1, 0, 10_000, Account.create().address)
    with pytest.raises(ManifestLayoutError):
        check_layout(m.model_copy(update={"files": [m.files[0], m.files[0]]}))
    with pytest.raises(ManifestLayoutError):
        check_layout(m.model_copy(update={"files": [m.files[0].model_copy(update={"name": ".."})]}))


def test_layout_refuses_deltas_that_rebuild_nothing(tmp_path: Path) -> None:
    m = build_manifest(_model_dir(tmp_path), 1, 0, 10_000, Account.create().address)
    weights = next(f for f in m.files if f.name == "model.safetensors")
    body = weights.model_copy(update={"name": "model.safetensors.delta"})
    offer = FileDelta(name="model.safetensors", parent_sha256="ab" * 32, delta=body)
    check_layout(m.model_copy(update={"deltas": [offer]}))  # a well-formed offer
    for bad in (
        {"deltas": [offer.model_copy(update={"name": "missing.bin"})]},  # no such file
        {"deltas": [offer], "parent_version": None},  # a delta against no parent
        {"deltas": [offer, offer]},  # two deltas for one file
        {"deltas": [offer.model_copy(update={"delta": m.files[0]})]},  # clashes with a file
    ):
        with pytest.raises(ManifestLayoutError):
            check_layout(m.model_copy(update=bad))
