"""A worker keeps generating with the version it holds while the next one is on the wire, and
switches between two batches of leases once it has arrived, rebuilt from a delta: the worker's
own policy path (`Worker._current_policy`, `_freshest`, `PolicyStore`) against a real origin,
reached through a slow link that the test opens when it chooses."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import httpx
import pytest
import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount
from safetensors.torch import load_file, save_file
from scripted_relay import Reply, ScriptedRelay

from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.shardcast import publish_version
from prime_swarm.protocol.messages import PolicyInfo, SignedManifest
from prime_swarm.services.worker.runner import Worker
from prime_swarm.services.worker.settings import WorkerSettings

FORWARDED = ("content-range", "etag", "cache-control", "content-type")


@pytest.fixture
def trainer() -> LocalAccount:
    return Account.create()


@pytest.fixture
def origin(tmp_path: Path, trainer: LocalAccount) -> Iterator[RelayProcess]:
    proc = RelayProcess(["origin", "--trainer", trainer.address], tmp_path / "origin")
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


def _rl_step(parent: Path, child: Path) -> None:
    """`child`: `parent` with a few weights nudged, config and tokenizer unchanged."""
    shutil.copytree(parent, child)
    weights = child / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[:50] += 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})


class SlowLink:
    """A relay in front of the origin whose shards of `version` wait until `open()`."""

    def __init__(self, origin_url: str, version: int) -> None:
        self.opened = threading.Event()
        self.held = threading.Event()  # a shard request of `version` is waiting
        gated = f"/v1/versions/{version}/files/"

        def forward(path: str, headers: Message) -> Reply:
            if path.startswith(gated):
                self.held.set()
                self.opened.wait(60)
            asked = {"range": headers["range"]} if headers["range"] else {}
            r = httpx.get(origin_url + path, headers=asked, timeout=30)
            kept = {k: v for k, v in r.headers.items() if k.lower() in FORWARDED}
            return Reply(r.status_code, r.content, kept)

        self.relay = ScriptedRelay(forward)

    def open(self) -> None:
        self.opened.set()

    def close(self) -> None:
        self.opened.set()
        self.relay.close()


def _info(signed: SignedManifest, relay: str, min_version: int) -> PolicyInfo:
    m = signed.manifest
    return PolicyInfo(
        version=m.version,
        model_hash=m.model_hash,
        manifest_path=f"/v1/versions/{m.version}/manifest",
        relays=[relay],
        min_version=min_version,
    )


def test_a_worker_generates_on_while_the_next_version_downloads_then_switches(
    tmp_path: Path, origin: RelayProcess, trainer: LocalAccount
) -> None:
    v1 = build_tiny_model(3, tmp_path / "v1")
    v2 = tmp_path / "v2"
    _rl_step(v1, v2)
    s1 = publish_version(origin.url, v1, 1, None, trainer, timeout=20)
    s2 = publish_version(origin.url, v2, 2, 1, trainer, timeout=20, parent_dir=v1)
    (offer,) = s2.manifest.deltas
    link = SlowLink(origin.url, version=2)
    settings = WorkerSettings(
        pool_id=1,
        ledger_address="0x" + "00" * 20,
        cache_dir=tmp_path / "cache",
        precision="fp32",
        progress=False,
        http_timeout_s=10,
    )
    worker = Worker(settings, Account.create(), None, "http://127.0.0.1:1", trainer.address)  # type: ignore[arg-type]
    try:
        worker.policy_info = _info(s1, link.relay.url, min_version=0)
        held = worker._current_policy()
        assert held is not None and held.version == 1

        # v2 is announced; v1 is still admitted. Its bytes are held on the link.
        worker.policy_info = _info(s2, link.relay.url, min_version=1)
        assert worker._current_policy() is held
        assert link.held.wait(30)  # the download is under way, in the background
        # The next batch of leases: the worker waits for the download only briefly, then
        # generates with v1 rather than pausing for the transfer.
        assert worker._freshest(held) is held
        ids = torch.tensor([[1, 2, 3]])
        with torch.no_grad():
            held.lm.module(ids)  # v1 is loaded and usable throughout
        assert worker.store is not None and not worker.store.is_downloaded(2)

        link.open()
        fetching = worker.store.prefetch(2, [link.relay.url])
        if fetching is not None:
            fetching.join(60)
        assert worker.store.is_downloaded(2)
        switched = worker._freshest(held)
        assert switched.version == 2
        want = load_file(v2 / "model.safetensors")
        got = switched.lm.module.state_dict()
        assert all(torch.equal(got[k].float(), want[k].float()) for k in want)

        # v2 came as its delta: the full weights of v2 never crossed the link.
        asked = link.relay.requests
        assert any(f"/v1/versions/2/files/{offer.delta.name}/" in p for p in asked)
        assert not any("/v1/versions/2/files/model.safetensors/" in p for p in asked)
    finally:
        link.close()


def test_a_worker_holds_one_model_and_keeps_the_parents_on_disk(
    tmp_path: Path, origin: RelayProcess, trainer: LocalAccount
) -> None:
    """Three versions in a row through the worker's store: one model in memory at a time, the
    older versions' files kept on disk (the parent of each next delta) up to `keep_versions`,
    and a version put out of memory loads again from disk without a download."""
    versions = [build_tiny_model(3, tmp_path / "v1")]
    for v in (2, 3):
        _rl_step(versions[-1], tmp_path / f"v{v}")
        versions.append(tmp_path / f"v{v}")
    signed = [publish_version(origin.url, versions[0], 1, None, trainer, timeout=20)]
    for v in (2, 3):
        signed.append(
            publish_version(
                origin.url, versions[v - 1], v, v - 1, trainer, timeout=20,
                parent_dir=versions[v - 2],
            )
        )  # fmt: skip
    settings = WorkerSettings(
        pool_id=1, ledger_address="0x" + "00" * 20, cache_dir=tmp_path / "cache",
        precision="fp32", progress=False, http_timeout_s=10, keep_versions=2,
    )  # fmt: skip
    worker = Worker(settings, Account.create(), None, "http://127.0.0.1:1", trainer.address)  # type: ignore[arg-type]
    for s in signed:
        worker.policy_info = _info(s, origin.url, min_version=s.manifest.version)
        held = worker._current_policy()
        assert held is not None and held.version == s.manifest.version
    store = worker.store
    assert store is not None and list(store._loaded) == [3]
    cached = sorted(p.name for p in store.cache_dir.iterdir() if p.name.startswith("v"))
    assert cached == ["v2", "v3"]  # v1 went: two versions on disk, one in memory
    assert store.is_downloaded(2)
    again = store.get(2, [])  # no relay to ask: it comes from disk
    assert again.version == 2 and list(store._loaded) == [2]
    assert sorted(p.name for p in store.cache_dir.iterdir() if p.name.startswith("v")) == [
        "v2",
        "v3",
    ]
