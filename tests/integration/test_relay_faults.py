"""SHARDCAST under faults, with real `prime-relay` processes on free 127.0.0.1 ports.

Cut-through (a relay serves verified shards of a version it is still pulling), a relay killed
mid-broadcast, several parents, the `?wait=` bound, and the `prime-relay fetch` command.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.libs.shardcast import (
    RelayPool,
    build_manifest,
    download_version,
    publish_version,
    wait_for_manifest,
    wait_for_version,
)
from prime_swarm.libs.shardcast.manifest import iter_shard_bytes
from prime_swarm.protocol.manifest_signing import sign_manifest

SHARD = 64 * 1024
WEIGHTS = 2 * 1024 * 1024 + 777


Server = RelayProcess


@pytest.fixture()
def trainer() -> LocalAccount:
    return Account.create()


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


def _model(root: Path, name: str, weights: int = WEIGHTS) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "tiny"}')
    (d / "model.safetensors").write_bytes(os.urandom(weights))
    return d


def _origin(tmp_path: Path, trainer: LocalAccount, started: list[Server]) -> Server:
    s = Server(["origin", "--trainer", trainer.address], tmp_path / "origin")
    started.append(s)
    return s.wait_healthy()


def _relay(
    tmp_path: Path, name: str, parents: list[str], trainer: LocalAccount, started: list[Server]
) -> Server:
    args = ["relay", "--trainer", trainer.address, "--poll-interval", "0.05", "--timeout", "4"]
    for p in parents:
        args += ["--parent", p]
    s = Server(args, tmp_path / name)
    started.append(s)
    return s.wait_healthy()


def _same(a: Path, b: Path) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in os.listdir(a))


def test_relay_serves_verified_shards_while_still_pulling(
    tmp_path: Path, trainer: LocalAccount, servers: list[Server]
) -> None:
    """Cut-through, two levels deep: shard 0 flows origin -> A -> B before shard 1 exists."""
    origin = _origin(tmp_path, trainer, servers)
    a = _relay(tmp_path, "relay_a", [origin.url], trainer, servers)
    b = _relay(tmp_path, "relay_b", [a.url, origin.url], trainer, servers)  # several parents
    model = _model(tmp_path, "m")
    signed = sign_manifest(build_manifest(model, 1, None, SHARD, trainer.address), trainer)
    f = next(f for f in signed.manifest.files if f.name == "model.safetensors")
    r = httpx.put(f"{origin.url}/v1/versions/1/manifest", content=signed.model_dump_json())
    assert r.status_code == 200

    def put(i: int) -> None:
        body = b"".join(iter_shard_bytes(model / f.name, f.shards[i]))
        url = f"{origin.url}/v1/versions/1/files/{f.name}/shards/{i}"
        assert httpx.put(url, content=body).status_code == 200

    put(0)
    # B learns of version 1 from A's partial listing (one poll each, 50 ms apart); `?wait` then
    # holds for shards, not for a manifest the relay has never seen.
    deadline = time.monotonic() + 10
    while httpx.get(f"{b.url}/v1/versions/partial").json()["versions"] != [1]:
        assert time.monotonic() < deadline, "relay B never saw version 1"
        time.sleep(0.05)
    shard0 = f"{b.url}/v1/versions/1/files/{f.name}/shards/0"
    got = httpx.get(shard0, params={"wait": 10}, timeout=15)
    assert got.status_code == 200, got.text
    assert got.content == b"".join(iter_shard_bytes(model / f.name, f.shards[0]))
    assert httpx.get(f"{b.url}/v1/versions/partial").json()["versions"] == [1]
    assert httpx.get(f"{b.url}/v1/versions").json()["versions"] == []
    # Shard 1 is not anywhere yet: a bounded wait ends in 404, not a hang.
    shard1 = f"{b.url}/v1/versions/1/files/{f.name}/shards/1"
    t = time.monotonic()
    assert httpx.get(shard1, params={"wait": 0.3}, timeout=10).status_code == 404
    assert time.monotonic() - t < 5
    # A waiting request is answered as soon as the shard has come down the tree.
    timer = threading.Timer(0.3, put, args=(1,))
    timer.start()
    try:
        assert httpx.get(shard1, params={"wait": 10}, timeout=15).status_code == 200
    finally:
        timer.join()
    for i in range(2, len(f.shards)):
        put(i)
    for name in ("config.json",):
        entry = next(x for x in signed.manifest.files if x.name == name)
        for s in entry.shards:
            body = b"".join(iter_shard_bytes(model / name, s))
            httpx.put(f"{origin.url}/v1/versions/1/files/{name}/shards/{s.index}", content=body)
    wait_for_version(b.url, 1, timeout_s=20)
    out = download_version([b.url], 1, tmp_path / "out", trainer.address, timeout_s=5)
    assert _same(model, out)


def test_relay_killed_mid_broadcast_clients_finish_from_the_other(
    tmp_path: Path, trainer: LocalAccount, servers: list[Server]
) -> None:
    origin = _origin(tmp_path, trainer, servers)
    a = _relay(tmp_path, "relay_a", [origin.url], trainer, servers)
    b = _relay(tmp_path, "relay_b", [origin.url], trainer, servers)
    model = _model(tmp_path, "m", weights=4 * 1024 * 1024)
    publisher = threading.Thread(
        target=publish_version, args=(origin.url, model, 1, None, trainer, SHARD, 10.0)
    )
    publisher.start()
    try:
        pool = RelayPool([a.url, b.url])
        signed = wait_for_manifest(pool, 1, trainer.address, wait_s=20, timeout_s=2)
        killed = threading.Event()

        def progress(done: int, total: int) -> None:
            if not killed.is_set() and done > 0:
                killed.set()
                a.kill()  # while the version is still being published and pulled

        out = download_version(
            pool,
            1,
            tmp_path / "out",
            trainer.address,
            timeout_s=2,
            manifest=signed,
            progress=progress,
            max_workers=4,
            deadline_s=60,
        )
    finally:
        publisher.join()
    assert killed.is_set() and a.proc.poll() is not None
    assert _same(model, out)
    report = pool.report()
    assert report[b.url]["shards_ok"] > 0
    assert not pool.demoted


def test_wait_is_bounded_and_partial_listing_of_unknown_is_empty(
    tmp_path: Path, trainer: LocalAccount, servers: list[Server]
) -> None:
    origin = _origin(tmp_path, trainer, servers)
    assert httpx.get(f"{origin.url}/v1/versions/partial").json() == {
        "protocol_version": httpx.get(f"{origin.url}/v1/versions").json()["protocol_version"],
        "versions": [],
        "latest": None,
    }
    url = f"{origin.url}/v1/versions/1/files/model.safetensors/shards/0"
    for wait in ("31", "-1", "abc", "1e9"):
        assert httpx.get(url, params={"wait": wait}).status_code == 422, wait
    assert httpx.get(url, params={"wait": "0.1"}).status_code == 404


def test_fetch_command_shows_progress_and_refuses_forged_relay(
    tmp_path: Path, trainer: LocalAccount, servers: list[Server]
) -> None:
    origin = _origin(tmp_path, trainer, servers)
    model = _model(tmp_path, "m", weights=300_000)
    publish_version(origin.url, model, 3, 2, trainer, SHARD, 10.0)
    cmd = [sys.executable, "-m", "prime_swarm.services.relay", "fetch", "--trainer"]
    ok = subprocess.run(
        [*cmd, trainer.address, "--relay", origin.url, "--version", "3"]
        + ["--out", str(tmp_path / "out"), "--wait", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "100.0%" in ok.stderr and _same(model, tmp_path / "out")
    # Same relay, but the client trusts another trainer: the manifest is rejected, nothing lands.
    bad = subprocess.run(
        [*cmd, Account.create().address, "--relay", origin.url, "--version", "3"]
        + ["--out", str(tmp_path / "out2"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "demoted" in bad.stderr
    assert not (tmp_path / "out2").exists()
    # An evicted or unknown version is a clear error.
    gone = subprocess.run(
        [*cmd, trainer.address, "--relay", origin.url, "--version", "9"]
        + ["--out", str(tmp_path / "out3"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 1 and "not held" in gone.stderr
    # Holding version 3, version 4 comes as a delta: a few changed bytes, not the file.
    v4 = tmp_path / "m4"
    shutil.copytree(model, v4)
    weights = bytearray((v4 / "model.safetensors").read_bytes())
    weights[1000:1010] = bytes(10)
    (v4 / "model.safetensors").write_bytes(weights)
    signed = publish_version(origin.url, v4, 4, 3, trainer, SHARD, 10.0, parent_dir=model)
    assert [d.name for d in signed.manifest.deltas] == ["model.safetensors"]
    held = ["--held", str(tmp_path / "out"), "--held-version", "3"]
    new = subprocess.run(
        [*cmd, trainer.address, "--relay", origin.url, "--version", "4", *held]
        + ["--out", str(tmp_path / "out4"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert new.returncode == 0, new.stderr
    assert _same(v4, tmp_path / "out4")
    half = subprocess.run(
        [*cmd, trainer.address, "--relay", origin.url, "--held", str(tmp_path / "out")]
        + ["--out", str(tmp_path / "out5"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert half.returncode == 2 and "--held-version" in half.stderr


def test_origin_streams_a_shard_while_its_upload_is_still_arriving(
    tmp_path: Path, trainer: LocalAccount, servers: list[Server]
) -> None:
    """Byte-level cut-through: the first half of a shard is downloadable before the second half
    has been uploaded; a downstream reader of an upload that fails is cut off, never served a
    complete wrong shard."""
    origin = _origin(tmp_path, trainer, servers)
    model = _model(tmp_path, "m", weights=1_000_000)
    signed = sign_manifest(build_manifest(model, 1, None, 1_000_000, trainer.address), trainer)
    f = next(f for f in signed.manifest.files if f.name == "model.safetensors")
    assert httpx.put(f"{origin.url}/v1/versions/1/manifest", content=signed.model_dump_json())
    data = b"".join(iter_shard_bytes(model / f.name, f.shards[0]))
    url = f"{origin.url}/v1/versions/1/files/{f.name}/shards/0"

    def upload(body: bytes, second_half: threading.Event) -> None:
        def chunks() -> Iterator[bytes]:
            yield body[: len(body) // 2]
            assert second_half.wait(20)
            yield body[len(body) // 2 :]

        httpx.put(url, content=chunks(), timeout=30)

    for tampered in (True, False):
        body = data[:-1] + bytes([data[-1] ^ 1]) if tampered else data
        release = threading.Event()
        t = threading.Thread(target=upload, args=(body, release))
        t.start()
        try:
            with httpx.stream("GET", url, params={"wait": 10}, timeout=15) as r:
                assert r.status_code == 200
                assert int(r.headers["content-length"]) == len(data)
                stream = r.iter_raw()
                got = b""
                while len(got) < len(data) // 2:
                    got += next(stream)
                assert got[: len(data) // 2] == data[: len(data) // 2]  # before the rest exists
                release.set()
                if tampered:
                    # The origin's hash check fails at the end: the response is cut short.
                    with pytest.raises(httpx.RemoteProtocolError):
                        for chunk in stream:
                            got += chunk
                    assert len(got) < len(data)
                else:
                    got += b"".join(stream)
                    assert got == data
        finally:
            release.set()
            t.join()
    assert httpx.get(url).content == data  # the good upload is what the origin holds


def test_an_idle_keep_alive_connection_outlives_a_clients_expiry(
    tmp_path: Path, trainer: LocalAccount, servers: list[Server]
) -> None:
    """A client keeps an idle connection up to 5 s (httpx's default) before reusing it; the
    relay must not close it first, or the reuse races its close (a request lost as "server
    disconnected", over a wide-area round trip)."""
    origin = _origin(tmp_path, trainer, servers)
    host, port = origin.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() and conn.sock is not None
        kept = conn.sock
        time.sleep(6.0)  # past both the client's expiry and uvicorn's default keep-alive
        # On a connection the relay had closed this raises RemoteDisconnected (http.client
        # reconnects only when it knows the socket is gone).
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        assert conn.sock is kept
    finally:
        conn.close()
