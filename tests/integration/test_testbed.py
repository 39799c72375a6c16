"""The wide-area testbed for real: two regions in network namespaces, a policy version carried
from the operator's origin through a far region's relay to its followers (`prime-relay fetch`),
the links' delay and bandwidth seen from inside, a partition that holds and heals, and nothing
left behind, even when the process holding the testbed is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from eth_account import Account
from safetensors.numpy import save_file

from prime_swarm.deploy.testbed.net import LiveTestbed, available, namespaces
from prime_swarm.deploy.testbed.topology import Testbed
from prime_swarm.libs.shardcast import publish_version

TAG = "wtest"
FAR_RTT_MS = 300.0
FOLLOWER_DOWN_MBIT = 16.0
BED = {
    "name": "two-regions",
    "tag": TAG,
    "subnet": "10.79",
    "regions": {"op": {"rtt_ms": 1}, "far": {"rtt_ms": 10, "jitter_ms": 1}},
    "links": [{"between": ["op", "far"], "rtt_ms": FAR_RTT_MS, "jitter_ms": 10}],
    "hosts": {
        "origin": {"region": "op", "up_mbit": 500, "down_mbit": 500, "ports": [8700]},
        "relay": {"region": "far", "up_mbit": 500, "down_mbit": 500, "ports": [8700]},
        "follower": {
            "region": "far",
            "count": 3,
            "up_mbit": 8,
            "down_mbit": FOLLOWER_DOWN_MBIT,
        },
    },
}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"
)


def _leftovers() -> tuple[list[str], str]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return namespaces(TAG), "\n".join(ln for ln in links.splitlines() if f"{TAG}-ctl" in ln)


def _request_s(live: LiveTestbed, host: str, url: str) -> float:
    """Seconds one HTTP request takes from inside `host` (curl: connect and answer)."""
    out = subprocess.run(
        ["ip", "netns", "exec", live.ns(host), "curl", "-sf", "-o", "/dev/null", "-m", "20",
         "-w", "%{time_total}", url],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


def test_a_version_crosses_the_wide_area_and_nothing_is_left(tmp_path: Path) -> None:
    if why := available():
        pytest.fail(why)
    model = tmp_path / "v1"
    model.mkdir()
    weights = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    save_file({"w": weights}, str(model / "model.safetensors"))
    (model / "config.json").write_text("{}")
    trainer = Account.create()
    relay_cmd = [sys.executable, "-m", "prime_swarm.services.relay"]
    common = ["--host", "0.0.0.0", "--port", "8700", "--trainer", trainer.address]

    with LiveTestbed(Testbed.model_validate(BED), tmp_path / "bed") as live:
        assert len(namespaces(TAG)) == 6  # the hub and five hosts
        # A second testbed of the same tag would tear this one down under its owner.
        with pytest.raises(RuntimeError, match="already up"):
            LiveTestbed(Testbed.model_validate(BED), tmp_path / "second").up()
        assert len(namespaces(TAG)) == 6
        origin_url, relay_url = live.url("origin", 8700), live.url("relay", 8700)
        procs = [
            live.spawn("origin", "origin", [*relay_cmd, "origin", *common,
                       "--data-dir", str(tmp_path / "origin")]),
            live.spawn("relay", "relay", [*relay_cmd, "relay", *common, "--parent", origin_url,
                       "--data-dir", str(tmp_path / "relay")]),
        ]  # fmt: skip
        procs[0].wait_http(f"{origin_url}/healthz", 60)
        procs[1].wait_http(f"{relay_url}/healthz", 60)

        # Delay: a request from the far region to the origin pays the handshake and the
        # request's round trip (two of 300 ms); inside the region it pays two of 10 ms.
        far = _request_s(live, "follower-1", f"{origin_url}/healthz")
        near = _request_s(live, "follower-1", f"{relay_url}/healthz")
        assert 2 * FAR_RTT_MS / 1000 * 0.9 < far < 2 * FAR_RTT_MS / 1000 + 1.0, far
        assert near < 0.25, near

        followers = [h.name for h in live.in_group("follower")]
        fetches = [
            live.spawn(name, f"fetch-{name}", [sys.executable, "-m", "prime_swarm.services.relay",
                       "fetch", "--relay", relay_url, "--trainer", trainer.address, "--version",
                       "1", "--wait", "120", "--out", str(tmp_path / name), "--no-progress"])
            for name in followers
        ]  # fmt: skip
        time.sleep(2.0)
        started = time.monotonic()
        publish_version(origin_url, model, 1, None, trainer, shard_size=1 << 20)
        for f in fetches:
            f.proc.wait(120)
            assert f.proc.returncode == 0, f.tail()
        took = time.monotonic() - started
        size = (model / "model.safetensors").stat().st_size
        # Bandwidth: each follower's 16 Mbit/s downlink carries 4 MiB in no less than 2.1 s.
        assert took > size * 8 / (FOLLOWER_DOWN_MBIT * 1e6), took
        for name in followers:
            got = (tmp_path / name / "model.safetensors").read_bytes()
            assert got == (model / "model.safetensors").read_bytes()

        # A partition: the far region cannot reach the origin while cut, and can once healed.
        live.cut("far")
        time.sleep(0.3)
        cut = subprocess.run(
            ["ip", "netns", "exec", live.ns("relay"), "curl", "-s", "-m", "2",
             f"{origin_url}/healthz"],
            capture_output=True, timeout=30,
        )  # fmt: skip
        assert cut.returncode == 28  # curl: operation timed out (a blackhole, not a refusal)
        assert _request_s(live, "follower-2", f"{relay_url}/healthz") < 0.25  # inside: fine
        live.heal("far")
        time.sleep(0.3)
        assert _request_s(live, "relay", f"{origin_url}/healthz") < 2 * FAR_RTT_MS / 1000 + 1.0
        stats = live.link_stats()
        assert stats["bytes"] > 3 * size  # every byte went through the emulator
        for p in procs:
            p.stop()
    assert _leftovers() == ([], "")


def test_a_killed_owner_leaves_nothing_behind(tmp_path: Path) -> None:
    if why := available():
        pytest.fail(why)
    bed_file = tmp_path / "bed.toml"
    hosts = "\n".join(
        f'[hosts.{n}]\nregion = "{r}"\nup_mbit = 10\ndown_mbit = 10\nports = [80]\n'
        for n, r in (("a", "op"), ("b", "far"))
    )
    bed_file.write_text(
        f'name = "killed"\ntag = "{TAG}"\nsubnet = "10.79"\n[regions.op]\nrtt_ms = 1\n'
        f'[regions.far]\nrtt_ms = 1\n[[links]]\nbetween = ["op", "far"]\nrtt_ms = 50\n{hosts}'
    )
    owner = subprocess.Popen(
        [sys.executable, "-m", "prime_swarm.deploy.local.cli", "testbed", "up", str(bed_file),
         "--work", str(tmp_path / "work")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdout is not None
    for line in owner.stdout:
        if line.startswith("Ctrl-C"):
            break
    assert len(namespaces(TAG)) == 3
    owner.send_signal(signal.SIGKILL)  # no `finally` runs: only the janitor can clean up
    owner.wait(10)
    deadline = time.monotonic() + 20
    while _leftovers() != ([], "") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leftovers() == ([], "")
    emulator = subprocess.run(
        ["pgrep", "-f", f"prime_swarm.deploy.testbed.link {tmp_path}"], capture_output=True
    )
    assert emulator.returncode == 1  # no emulator process left either
