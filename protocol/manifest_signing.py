"""Signing and checking policy manifests: the trainer's key is the root of weight integrity."""

from __future__ import annotations

import hashlib

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from .messages import FileEntry, Manifest, SignedManifest, normal_address


def model_hash(files: list[FileEntry]) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        h.update(f"{f.name}:{f.sha256}\n".encode())
    return h.hexdigest()


def _signing_text(manifest: Manifest) -> str:
    # Pydantic's JSON dump is deterministic for a given model (field order is declaration order).
    return "prime-swarm-manifest-v1\n" + manifest.model_dump_json()


def sign_manifest(manifest: Manifest, account: LocalAccount) -> SignedManifest:
    if normal_address(manifest.trainer) != normal_address(account.address):
        raise ValueError("manifest names a different trainer than the signing key")
    sig = account.sign_message(encode_defunct(text=_signing_text(manifest))).signature
    return SignedManifest(manifest=manifest, signature="0x" + sig.hex().removeprefix("0x"))


class ManifestError(ValueError):
    pass


def verify_manifest(signed: SignedManifest, trusted_trainer: str) -> Manifest:
    """Raise ManifestError unless the manifest is signed by the trusted trainer and consistent."""
    m = signed.manifest
    if normal_address(m.trainer) != normal_address(trusted_trainer):
        raise ManifestError(f"manifest trainer {m.trainer} is not the trusted {trusted_trainer}")
    try:
        signer = Account.recover_message(
            encode_defunct(text=_signing_text(m)), signature=signed.signature
        )
    except Exception as exc:
        raise ManifestError(f"malformed manifest signature: {type(exc).__name__}") from exc
    if normal_address(signer) != normal_address(trusted_trainer):
        raise ManifestError("manifest signature is not the trainer's")
    if model_hash(m.files) != m.model_hash:
        raise ManifestError("model_hash does not match the file list")
    for f in m.files:
        expected_offset = 0
        for i, s in enumerate(f.shards):
            if s.index != i or s.offset != expected_offset or s.size > m.shard_size:
                raise ManifestError(f"shard table of {f.name} is inconsistent at shard {i}")
            expected_offset += s.size
        if expected_offset != f.size:
            raise ManifestError(f"shards of {f.name} do not add up to its size")
    return m
