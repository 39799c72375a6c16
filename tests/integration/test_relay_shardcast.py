"""SHARDCAST end to end with real processes: trainer -> origin -> relays -> client.

Every server is a real `prime-relay` uvicorn process on a free 127.0.0.1 port.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.libs.shardcast import (
    NotAvailableError,
    PublishError,
    RelayPool,
    build_manifest,
    download_version,
    fetch_manifest,
    publish_version,
    wait_for_version,
)
from prime_swarm.libs.shardcast.client import HeldFiles
from prime_swarm.libs.shardcast.publish import encode_deltas
from prime_swarm.protocol.manifest_signing import sign_manifest
from prime_swarm.protocol.messages import SignedManifest

SHARD = 256 * 1024
WEIGHTS = 4 * 1024 * 1024 + 12345  # a ragged last shard


Server = RelayProcess


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shardcast")


@pytest.fixture(scope="module")
def trainer() -> LocalAccount:
    return Account.create()


def _model(root: Path, name: str, weights: int = WEIGHTS) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "tiny", "name": name}))
    (d / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (d / "model.safetensors").write_bytes(os.urandom(weights))
    return d


def _same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


@pytest.fixture(scope="module")
def servers(work: Path, trainer: LocalAccount) -> Iterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    try:
        origin = Server(
            ["origin", "--trainer", trainer.address, "--keep-versions", "2"],
            work / "origin",
        )
        started["origin"] = origin
        for name in ("relay_a", "relay_b"):
            started[name] = Server(
                [
                    "relay",
                    "--trainer",
                    trainer.address,
                    "--parent",
                    origin.url,
                    "--poll-interval",
                    "0.2",
                    "--keep-versions",
                    "2",
                ],
                work / name,
            )
        for s in started.values():
            s.wait_healthy()
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def v1(
    work: Path, servers: dict[str, Server], trainer: LocalAccount
) -> tuple[Path, SignedManifest]:
    model = _model(work, "model_v1")
    signed = publish_version(servers["origin"].url, model, 1, 0, trainer, SHARD, 10.0)
    return model, signed


def test_republishing_a_complete_version_is_a_no_op(
    work: Path, servers: dict[str, Server], v1: tuple[Path, SignedManifest], trainer: LocalAccount
) -> None:
    """A trainer killed after uploading, before announcing, publishes the version again on
    restart: the origin's complete copy is returned, not refused as another manifest."""
    model, signed = v1
    again = publish_version(servers["origin"].url, model, 1, 0, trainer, SHARD, 10.0)
    assert again == signed
    with pytest.raises(PublishError, match="another model"):
        other = _model(work, "not_v1", WEIGHTS + 8)
        publish_version(servers["origin"].url, other, 1, 0, trainer, SHARD, 10.0)


def test_policy_store_downloads_apart_from_loading(
    work: Path, servers: dict[str, Server], v1: tuple[Path, SignedManifest], trainer: LocalAccount
) -> None:
    """A worker downloads the next version on a background thread and loads it on its own:
    `download` verifies files into the cache only, `get` then loads them without refetching."""
    from prime_swarm.libs.policy.store import PolicyError, PolicyStore

    relay = servers["relay_a"].url
    wait_for_version(relay, 1, timeout_s=20)
    store = PolicyStore(work / "policy_store", trainer.address, keep=2, timeout_s=5)
    store.download(1, [relay])
    assert store.is_downloaded(1) and store.latest_loaded() is None
    # With no relay left to ask, `get` goes straight to loading the verified files (this
    # module's test "model" is not a loadable LM, so the load itself is what fails).
    with pytest.raises(PolicyError, match="does not load"):
        store.get(1, ["http://127.0.0.1:1"])
    # Without a download first, the same dead relay is a fetch failure.
    with pytest.raises(PolicyError, match="could not fetch"):
        PolicyStore(work / "policy_store2", trainer.address, timeout_s=2).get(
            1, ["http://127.0.0.1:1"]
        )


def test_a_prefetch_ahead_of_the_relays_is_said_once(
    work: Path, servers: dict[str, Server], trainer: LocalAccount, caplog: pytest.LogCaptureFixture
) -> None:
    """Workers and validators prefetch an announced version on every loop until a relay holds
    it (relays poll their parents): routine, so one INFO line per version, not a warning each
    time (a bare-metal pool logged 95 in 40 s)."""
    from prime_swarm.libs.policy.store import PolicyStore

    store = PolicyStore(work / "policy_store3", trainer.address, timeout_s=2)
    caplog.set_level(logging.DEBUG, logger="policy")
    for _ in range(3):
        fetching = store.prefetch(99, [servers["relay_a"].url])
        assert fetching is not None
        fetching.join(20)
    said = [r.levelno for r in caplog.records if "v99 not on the relays yet" in r.getMessage()]
    assert said == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert not [r for r in caplog.records if r.name == "policy" and r.levelno >= logging.WARNING]


def test_closing_a_policy_store_cancels_its_download(
    work: Path, servers: dict[str, Server], v1: tuple[Path, SignedManifest], trainer: LocalAccount
) -> None:
    """A worker stopping mid-prefetch cancels the download rather than leave a thread running
    into interpreter shutdown (which aborted a stopped worker): the transfers not yet started
    are dropped, nothing is installed, and a closed store starts no more prefetches."""
    import threading

    from prime_swarm.libs.policy.store import PolicyStore
    from prime_swarm.libs.shardcast.fetch import Cancelled

    relay = servers["relay_a"].url
    wait_for_version(relay, 1, timeout_s=20)
    stop = threading.Event()
    shards: list[int] = []

    def first_shard_then_stop(done: int, total: int) -> None:
        shards.append(done)
        stop.set()

    out = work / "dl_cancelled"
    with pytest.raises(Cancelled):
        download_version(
            [relay],
            1,
            out,
            trainer.address,
            timeout_s=5,
            max_workers=1,
            progress=first_shard_then_stop,
            stop=stop,
        )
    total = sum(f.size for f in v1[1].manifest.files)
    assert len(shards) == 1 and shards[0] < total  # one transfer, then no more
    assert not out.exists() and not list(work.glob(".dl_cancelled.partial-*"))

    store = PolicyStore(work / "policy_store_closed", trainer.address, timeout_s=5)
    store.close()
    assert store.prefetch(1, [relay]) is None and not store.is_downloaded(1)


def test_publish_pull_download_identical(
    work: Path, servers: dict[str, Server], v1: tuple[Path, SignedManifest], trainer: LocalAccount
) -> None:
    model, signed = v1
    relay = servers["relay_a"].url
    wait_for_version(relay, 1, timeout_s=20)
    seen: list[tuple[int, int]] = []
    started = time.monotonic()
    out = download_version(
        [relay],
        1,
        work / "dl_v1",
        trainer.address,
        timeout_s=5,
        progress=lambda d, t: seen.append((d, t)),
    )
    elapsed = time.monotonic() - started
    assert _same_tree(model, out)
    total = sum(f.size for f in signed.manifest.files)
    assert seen and seen[-1] == (total, total)
    print(
        f"\ndownload through relay: {total / 1e6:.1f} MB in {elapsed:.3f}s "
        f"= {total / 1e6 / elapsed:.0f} MB/s"
    )
    # latest resolves to the same version, and the metric counted the bytes served.
    assert fetch_manifest([relay], "latest", trainer.address).manifest.version == 1
    metrics = httpx.get(relay + "/metrics").text
    served = next(x for x in metrics.splitlines() if x.startswith("shardcast_bytes_served_total"))
    assert float(served.split()[-1]) >= total
    assert "shardcast_versions_held 1.0" in metrics


def test_shard_route_http_semantics(
    servers: dict[str, Server], v1: tuple[Path, SignedManifest]
) -> None:
    model, signed = v1
    f = next(f for f in signed.manifest.files if f.name == "model.safetensors")
    s = f.shards[1]
    url = f"{servers['origin'].url}/v1/versions/1/files/{f.name}/shards/1"
    data = (model / f.name).read_bytes()[s.offset : s.offset + s.size]
    r = httpx.get(url)
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-length"] == str(s.size) and r.headers["etag"] == f'"{s.sha256}"'
    h = httpx.head(url)
    assert h.status_code == 200 and h.headers["content-length"] == str(s.size) and not h.content
    part = httpx.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{s.size}"
    assert httpx.get(url, headers={"If-None-Match": f'"{s.sha256}"'}).status_code == 304


def test_bad_requests_are_4xx_not_500(
    servers: dict[str, Server], v1: tuple[Path, SignedManifest]
) -> None:
    base = servers["relay_a"].url
    r = httpx.get(base + "/v1/versions/99/manifest")
    assert r.status_code == 404 and "99" in r.json()["detail"] and r.json()["held_versions"]
    assert httpx.get(base + "/v1/versions/99/files/config.json/shards/0").status_code == 404
    for path in [
        "/v1/versions/1/files/model.safetensors/shards/abc",
        "/v1/versions/1/files/model.safetensors/shards/-1",
        "/v1/versions/1/files/model.safetensors/shards/99999999999999999999999",
        "/v1/versions/1/files/nope.bin/shards/0",
        "/v1/versions/1/files/../shards/0",
        "/v1/versions/1/files/%2e%2e/shards/0",
        "/v1/versions/1/files/..%2f..%2fetc%2fpasswd/shards/0",
        "/v1/versions/x/manifest",
        "/v1/versions/-3/manifest",
    ]:
        status = httpx.get(base + path).status_code
        assert 400 <= status < 500, (path, status)
    # Uploads exist only on the origin.
    assert httpx.put(base + "/v1/versions/1/manifest", content=b"{}").status_code == 405


def test_origin_refuses_forged_and_bad_uploads(
    work: Path, servers: dict[str, Server], trainer: LocalAccount, v1: tuple[Path, SignedManifest]
) -> None:
    origin = servers["origin"].url
    forger = Account.create()
    model = _model(work, "forged", weights=50_000)
    m = build_manifest(model, 7, 1, SHARD, forger.address)
    r = httpx.put(
        f"{origin}/v1/versions/7/manifest", content=sign_manifest(m, forger).model_dump_json()
    )
    assert r.status_code == 403
    # Names the trusted trainer but carries the forger's signature.
    claimed = m.model_copy(update={"trainer": trainer.address})
    fake = SignedManifest(manifest=claimed, signature=sign_manifest(m, forger).signature)
    r = httpx.put(f"{origin}/v1/versions/7/manifest", content=fake.model_dump_json())
    assert r.status_code == 403
    assert httpx.put(f"{origin}/v1/versions/7/manifest", content=b"{not json").status_code == 400
    assert httpx.get(f"{origin}/v1/versions/7/manifest").status_code == 404

    # Shards are checked against the signed manifest: wrong bytes 400, too many bytes 413.
    _, signed = v1
    f = next(f for f in signed.manifest.files if f.name == "model.safetensors")
    url = f"{origin}/v1/versions/1/files/{f.name}/shards/0"
    assert httpx.put(url, content=b"\0" * f.shards[0].size).status_code == 400
    assert httpx.put(url, content=b"\0" * (f.shards[0].size + 1)).status_code == 413
    assert httpx.get(url).content == (v1[0] / f.name).read_bytes()[: f.shards[0].size]


def test_client_refuses_manifest_from_wrong_signer(work: Path, trainer: LocalAccount) -> None:
    forger = Account.create()
    rogue = Server(["origin", "--trainer", forger.address], work / "rogue")
    try:
        rogue.wait_healthy()
        publish_version(rogue.url, _model(work, "rogue_model", 50_000), 1, 0, forger, SHARD, 10.0)
        pool = RelayPool([rogue.url])
        with pytest.raises(NotAvailableError):
            download_version(pool, 1, work / "dl_rogue", trainer.address, timeout_s=5)
        assert rogue.url in pool.demoted
        assert not (work / "dl_rogue").exists()
    finally:
        rogue.stop()


def test_corrupt_relay_is_detected_and_dead_relay_skipped(
    work: Path, servers: dict[str, Server], v1: tuple[Path, SignedManifest], trainer: LocalAccount
) -> None:
    model, signed = v1
    bad, good = servers["relay_b"], servers["relay_a"]
    wait_for_version(bad.url, 1, timeout_s=20)
    wait_for_version(good.url, 1, timeout_s=20)
    # Flip a byte in every shard of every file the bad relay holds, behind its back: whichever
    # shard the scheduler sends it for, the bytes are wrong (corrupting the weights alone let a
    # run fetch only small, intact files from it and never see the lie).
    shard_files = list((bad.data_dir / "v1" / "shards").glob("*/*"))
    assert len(shard_files) > len(list(model.iterdir()))  # every file, weights in several shards
    for shard_file in shard_files:
        raw = bytearray(shard_file.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        shard_file.write_bytes(bytes(raw))
    dead = f"http://127.0.0.1:{free_port()}"
    pool = RelayPool([dead, bad.url, good.url])
    out = download_version(pool, 1, work / "dl_v1_mixed", trainer.address, timeout_s=3)
    assert _same_tree(model, out)
    assert list(pool.demoted) == [bad.url]
    report = pool.report()
    assert report[dead]["errors"] >= 1 and report[dead]["shards_ok"] == 0
    assert report[good.url]["shards_ok"] >= 1


def test_origin_and_relay_evict_beyond_k(
    work: Path, servers: dict[str, Server], v1: tuple[Path, SignedManifest], trainer: LocalAccount
) -> None:
    origin, relay = servers["origin"].url, servers["relay_a"].url
    for v in (2, 3):
        publish_version(
            origin, _model(work, f"model_v{v}", 100_000), v, v - 1, trainer, SHARD, 10.0
        )
    listing = httpx.get(origin + "/v1/versions").json()
    assert listing["versions"] == [2, 3] and listing["latest"] == 3
    gone = httpx.get(origin + "/v1/versions/1/manifest")
    assert gone.status_code == 404 and gone.json()["held_versions"] == [2, 3]
    wait_for_version(relay, 3, timeout_s=20)
    deadline = time.monotonic() + 10
    while httpx.get(relay + "/v1/versions").json()["versions"] != [2, 3]:
        assert time.monotonic() < deadline, "relay did not evict version 1"
        time.sleep(0.2)
    out = download_version([relay], "latest", work / "dl_latest", trainer.address, timeout_s=5)
    assert _same_tree(work / "model_v3", out)
    # A version is listed only once every shard has arrived.
    m4 = build_manifest(_model(work, "model_v4", 1000), 4, 3, SHARD, trainer.address)
    put = httpx.put(
        f"{origin}/v1/versions/4/manifest", content=sign_manifest(m4, trainer).model_dump_json()
    )
    assert put.status_code == 200 and put.json()["complete"] is False
    assert httpx.get(origin + "/v1/versions").json()["latest"] == 3


def _metric(url: str, name: str) -> float:
    """A counter from the relay's /metrics."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} at {url}")


def _received(url: str) -> float:
    return _metric(url, "shardcast_shards_received_total")


def test_unchanged_files_are_neither_uploaded_nor_pulled_again(
    work: Path, servers: dict[str, Server], trainer: LocalAccount
) -> None:
    """A new version that changes only the weights moves only the weights: the origin and the
    relay link the config and tokenizer from the version before, and clients still get every
    file whole and hash-checked."""
    origin, relay = servers["origin"].url, servers["relay_b"].url
    first = _model(work, "model_v20", 100_000)
    publish_version(origin, first, 20, 19, trainer, SHARD, 10.0)
    wait_for_version(relay, 20, timeout_s=20)
    second = work / "model_v21"
    second.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (second / name).write_bytes((first / name).read_bytes())
    (second / "model.safetensors").write_bytes(os.urandom(100_000))
    at_origin, at_relay = _received(origin), _received(relay)
    publish_version(origin, second, 21, 20, trainer, SHARD, 10.0)
    wait_for_version(relay, 21, timeout_s=20)
    assert _received(origin) - at_origin == 1  # the weights' one shard, nothing else
    assert _received(relay) - at_relay == 1
    out = download_version([relay], 21, work / "dl_v21", trainer.address, timeout_s=5)
    assert _same_tree(second, out)


def _served_bytes(url: str) -> float:
    return _metric(url, "shardcast_bytes_served_total")


def _rl_step(parent: Path, child: Path, fraction: float, seed: int) -> None:
    """`child`: `parent` with `fraction` of its weights' 16-bit words changed, as an RL step at
    a small learning rate leaves bf16 weights; config and tokenizer unchanged."""
    child.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (child / name).write_bytes((parent / name).read_bytes())
    words = np.frombuffer((parent / "model.safetensors").read_bytes(), dtype=np.uint16).copy()
    rng = np.random.default_rng(seed)
    at = rng.choice(words.size, int(fraction * words.size), replace=False)
    words[at] ^= 1  # the last mantissa bit: a value rounded the other way
    (child / "model.safetensors").write_bytes(words.tobytes())


def test_a_client_holding_the_parent_fetches_the_delta(
    work: Path, servers: dict[str, Server], trainer: LocalAccount
) -> None:
    origin, relay = servers["origin"].url, servers["relay_a"].url
    v40 = _model(work, "model_v40", 2_000_000)
    publish_version(origin, v40, 40, 39, trainer, SHARD, 10.0)
    v41 = work / "model_v41"
    _rl_step(v40, v41, 0.01, seed=41)
    signed = publish_version(origin, v41, 41, 40, trainer, SHARD, 10.0, parent_dir=v40)
    (offer,) = signed.manifest.deltas
    assert offer.name == "model.safetensors" and offer.delta.size < 0.03 * 2_000_000
    wait_for_version(relay, 41, timeout_s=20)
    held_dir = download_version([relay], 40, work / "held_v40", trainer.address, timeout_s=5)
    held = HeldFiles(held_dir, fetch_manifest([relay], 40, trainer.address).manifest)
    before = _served_bytes(relay)
    out = download_version([relay], 41, work / "dl_v41", trainer.address, timeout_s=5, held=held)
    assert _same_tree(v41, out)
    assert _served_bytes(relay) - before < 0.05 * 2_000_000  # the delta and a manifest

    # A client without the parent, or whose parent rotted on disk, gets the full file.
    out = download_version([relay], 41, work / "dl_v41_full", trainer.address, timeout_s=5)
    assert _same_tree(v41, out)
    weights = held_dir / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))
    before = _served_bytes(relay)
    out = download_version(
        [relay], 41, work / "dl_v41_rot", trainer.address, timeout_s=5, held=held
    )
    assert _same_tree(v41, out)
    assert _served_bytes(relay) - before > 2_000_000  # the delta did not rebuild: the file came


def test_no_delta_where_it_would_not_pay(work: Path) -> None:
    v50 = _model(work, "model_v50", 100_000)
    v51 = work / "model_v51"
    _rl_step(v50, v51, 0.9, seed=51)  # most words changed: the full file is as cheap
    assert encode_deltas(v51, v50, work, SHARD) == []
    grown = _model(work, "model_v52", 100_001)  # another length: no delta applies
    assert encode_deltas(grown, v50, work, SHARD) == []


def test_a_delta_names_its_parent_by_the_hash_the_trainer_holds(work: Path) -> None:
    """The parent's hash comes from its manifest when the trainer passes it (no second pass
    over the parent), and is the file's own otherwise."""
    v60 = _model(work, "model_v60", 100_000)
    v61 = work / "model_v61"
    _rl_step(v60, v61, 0.01, seed=61)
    (scratch := work / "deltas_v61").mkdir()
    (offered,) = encode_deltas(v61, v60, scratch, SHARD)
    real = hashlib.sha256((v60 / offered.name).read_bytes()).hexdigest()
    assert offered.parent_sha256 == real
    (again := work / "deltas_v61_known").mkdir()
    (known,) = encode_deltas(v61, v60, again, SHARD, parent_hashes={offered.name: "ab" * 32})
    assert known.parent_sha256 == "ab" * 32 and known.delta.sha256 == offered.delta.sha256
