"""Client download logic against scripted relays (httpx.MockTransport, no sockets)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from eth_account import Account

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


def _transport(
    model: Path, signed: SignedManifest, behaviour: dict[str, str]
) -> httpx.MockTransport:
    """behaviour maps relay host -> good | flip | overrun | missing | down."""

    def handler(request: httpx.Request) -> httpx.Response:
        mode = behaviour[request.url.host]
        if mode == "down":
            raise httpx.ConnectError("refused", request=request)
        path = request.url.path
        if path == routes.VERSIONS:
            return httpx.Response(
                200, content=RelayVersions(versions=[5], latest=5).model_dump_json()
            )
        if path == routes.manifest_path(5):
            return httpx.Response(200, content=signed.model_dump_json())
        for f in signed.manifest.files:
            for s in f.shards:
                if path == routes.shard_path(5, f.name, s.index):
                    data = b"".join(iter_shard_bytes(model / f.name, s))
                    if mode == "missing":
                        return httpx.Response(404)
                    if mode == "flip":
                        data = bytes([data[0] ^ 1]) + data[1:]
                    if mode == "overrun":  # no Content-Length, more bytes than the shard
                        return httpx.Response(200, content=iter([data, b"X" * 999]))
                    return httpx.Response(200, content=data)
        return httpx.Response(404)

    return httpx.MockTransport(handler)


def _download(tmp_path: Path, published, behaviour: dict[str, str], **kw) -> tuple[Path, RelayPool]:
    model, signed = published
    pool = RelayPool([f"http://{h}" for h in behaviour])
    http = httpx.Client(transport=_transport(model, signed, behaviour))
    out = download_version(pool, "latest", tmp_path / "out", TRAINER.address, http=http, **kw)
    return out, pool


@pytest.mark.parametrize("liar", ["flip", "overrun"])
def test_lying_relay_is_demoted_and_download_completes(
    tmp_path: Path, published, liar: str
) -> None:
    out, pool = _download(tmp_path, published, {"liar": liar, "down": "down", "good": "good"})
    for f in published[0].iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes()
    assert list(pool.demoted) == ["http://liar"]
    assert pool.report()["http://down"]["shards_ok"] == 0


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
    asked: list[str] = []
    transport = _transport(model, signed, {"good": "good"})

    def counting(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return transport.handle_request(request)

    http = httpx.Client(transport=httpx.MockTransport(counting))
    out = download_version(
        RelayPool(["http://good"]), 5, tmp_path / "out", TRAINER.address, http=http, held=held
    )
    for f in model.iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes()
    assert not [a for a in asked if "config.json" in a]
    assert [a for a in asked if "model.safetensors" in a]
    # A held copy that vanished meanwhile (its version evicted) is fetched instead.
    (held_dir / "config.json").unlink()
    asked.clear()
    download_version(
        RelayPool(["http://good"]), 5, tmp_path / "again", TRAINER.address, http=http, held=held
    )
    assert [a for a in asked if "config.json" in a]
