"""Client download logic against scripted relays: real HTTP on 127.0.0.1, the production
shard transport."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from eth_account import Account
from scripted_relay import Reply, ScriptedRelay, closed_port_url

from prime_swarm.libs.shardcast import (
    NotAvailableError,
    RelayPool,
    build_manifest,
    download_version,
    routes,
)
from prime_swarm.libs.shardcast.client import HeldFiles
from prime_swarm.libs.shardcast.manifest import iter_shard_bytes
from prime_swarm.protocol.manifest_signing import sign_manifest
from prime_swarm.protocol.messages import RelayVersions, SignedManifest

TRAINER = Account.create()


@pytest.fixture()
def published(tmp_path: Path) -> tuple[Path, SignedManifest]:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(os.urandom(70_000))
    return d, sign_manifest(build_manifest(d, 5, 4, 16_384, TRAINER.address), TRAINER)


def _script(model: Path, signed: SignedManifest, mode: str):  # type: ignore[no-untyped-def]
    """mode: good | flip (one bit of every shard) | overrun (more bytes than the shard, and a
    Content-Length that says so) | missing (404 for shards)."""

    def script(path: str, headers: object) -> Reply:
        path = path.split("?")[0]
        if path == routes.VERSIONS:
            return Reply(body=RelayVersions(versions=[5], latest=5).model_dump_json().encode())
        if path == routes.manifest_path(5):
            return Reply(body=signed.model_dump_json().encode())
        for f in signed.manifest.files:
            for s in f.shards:
                if path == routes.shard_path(5, f.name, s.index):
                    data = b"".join(iter_shard_bytes(model / f.name, s))
                    if mode == "missing":
                        return Reply(404)
                    if mode == "flip":
                        data = bytes([data[0] ^ 1]) + data[1:]
                    if mode == "overrun":
                        data += b"X" * 999
                    return Reply(body=data)
        return Reply(404)

    return script


@contextmanager
def _relays(published, behaviour: dict[str, str]) -> Iterator[dict[str, str]]:
    """One real relay per name (`down`: a closed port); yields name -> URL."""
    model, signed = published
    servers = {
        n: ScriptedRelay(_script(model, signed, m)) for n, m in behaviour.items() if m != "down"
    }
    try:
        yield {n: servers[n].url if n in servers else closed_port_url() for n in behaviour}
    finally:
        for server in servers.values():
            server.close()


def _download(tmp_path: Path, published, behaviour: dict[str, str], **kw) -> tuple[Path, RelayPool]:
    with _relays(published, behaviour) as urls:
        pool = RelayPool(list(urls.values()))
        out = download_version(pool, "latest", tmp_path / "out", TRAINER.address, **kw)
        names = {url: name for name, url in urls.items()}
        pool.names = names  # type: ignore[attr-defined]
    return out, pool


@pytest.mark.parametrize("liar", ["flip", "overrun"])
def test_lying_relay_is_demoted_and_download_completes(
    tmp_path: Path, published, liar: str
) -> None:
    out, pool = _download(tmp_path, published, {"liar": liar, "down": "down", "good": "good"})
    for f in published[0].iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes()
    names = pool.names  # type: ignore[attr-defined]
    assert [names[u] for u in pool.demoted] == ["liar"]
    down = next(u for u, n in names.items() if n == "down")
    assert pool.report()[down]["shards_ok"] == 0


def test_budget_exhausted_raises_and_leaves_nothing(tmp_path: Path, published) -> None:
    with pytest.raises(NotAvailableError):
        _download(tmp_path, published, {"a": "flip", "b": "missing"}, attempts_per_shard=3)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_progress_and_overwrite(tmp_path: Path, published) -> None:
    seen: list[tuple[int, int]] = []
    _download(tmp_path, published, {"good": "good"}, progress=lambda d, t: seen.append((d, t)))
    total = sum(f.size for f in published[1].manifest.files)
    assert seen[-1] == (total, total) and all(d <= t for d, t in seen)
    with pytest.raises(FileExistsError):
        _download(tmp_path, published, {"good": "good"})
    out, _ = _download(tmp_path, published, {"good": "good"}, overwrite=True)
    assert (out / "config.json").read_text() == "{}"


def test_files_unchanged_since_a_held_version_are_linked_not_fetched(
    tmp_path: Path, published
) -> None:
    model, signed = published
    held_dir = tmp_path / "v4"
    held_dir.mkdir()
    (held_dir / "config.json").write_text("{}")  # same bytes as v5's: linked
    (held_dir / "model.safetensors").write_bytes(os.urandom(70_000))  # other weights: fetched
    held = HeldFiles(held_dir, build_manifest(held_dir, 4, 3, 16_384, TRAINER.address))
    relay = ScriptedRelay(_script(model, signed, "good"))
    try:
        out = download_version(
            RelayPool([relay.url]), 5, tmp_path / "out", TRAINER.address, held=held
        )
        for f in model.iterdir():
            assert (out / f.name).read_bytes() == f.read_bytes()
        assert not [a for a in relay.requests if "config.json" in a]
        assert [a for a in relay.requests if "model.safetensors" in a]
        # A held copy that vanished meanwhile (its version evicted) is fetched instead.
        (held_dir / "config.json").unlink()
        relay.requests.clear()
        download_version(RelayPool([relay.url]), 5, tmp_path / "again", TRAINER.address, held=held)
        asked = relay.requests
    finally:
        relay.close()
    assert [a for a in asked if "config.json" in a]
