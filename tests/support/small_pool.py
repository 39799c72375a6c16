"""A small local pool run to its last step: one `hf` worker, the tiny warm-started model unless
given another, and what the streams hold afterwards. Shared by the end-to-end tests that check
that a model or an environment works through the whole network; and the one way those tests
install a package of their own (pip, into a folder of its own, never into the venv)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import StepProgress, Verdict, VerifiedRollout

REPO = Path(__file__).resolve().parents[2]


@dataclass
class PoolRun:
    net: LocalNetwork
    """Still up (Redis, chain) for more checks; workers and validators are stopped."""
    settings: LocalNetworkSettings
    rows: list[StepProgress]
    verified: list[VerifiedRollout]
    rejected: list[Verdict]

    def assert_honest(self) -> None:
        """Every step trained, enough groups verified, and no honest group refused for
        anything but age (a group that went stale while queued is refused without slashing)."""
        assert [r.step for r in self.rows] == list(range(1, self.settings.steps + 1))
        assert {v.reason for v in self.rejected} <= {"stale_policy"}, [
            v.detail for v in self.rejected
        ]
        assert len(self.verified) >= self.settings.steps * self.settings.groups_per_step

    def assert_scored_by(self, env: str) -> None:
        """Every verified group is a task of `env`, scored in [0, 1] by the validator's rerun
        of its reward, and the scores vary (a reward stuck at one value tests nothing)."""
        assert all(v.task_id.startswith(f"{env}/train/") for v in self.verified)
        rewards = [c.task_reward for v in self.verified for c in v.completions]
        assert all(0.0 <= x <= 1.0 for x in rewards)
        assert len(set(rewards)) > 1, f"{env}'s partial-credit reward never varied"


def run_small_pool(
    run_dir: Path, model_dir: Path | None = None, timeout_s: float = 300, **settings: Any
) -> PoolRun:
    """Start a pool in `run_dir`, follow it to its last step and stop its workers and validators.
    The caller stops `PoolRun.net` (in a `finally`)."""
    s = LocalNetworkSettings(
        runs_dir=run_dir.parent,
        cache_dir=REPO / ".cache",
        **{"workers": 1, "worker_backends": ["hf"], **settings},
    )
    net = LocalNetwork(s, model_dir or prepare_model(s), run_dir)
    run = PoolRun(net, s, [], [], [])
    try:
        net.start()
        run.rows = net.follow(lambda row: None, timeout_s=timeout_s)
        net.stop_workers()
        net.stop_validators()
    except BaseException:
        net.stop()
        raise
    r = net.redis.client()
    run.verified = [
        streams.decode(VerifiedRollout, f) for _, f in r.xrange(streams.ROLLOUTS_VERIFIED)
    ]
    run.rejected = [streams.decode(Verdict, f) for _, f in r.xrange(streams.ROLLOUTS_REJECTED)]
    return run


def pip_install(sources: list[Path], site: Path) -> None:
    """Build and install `sources` (package folders) into `site` with pip, offline."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--target", str(site), *map(str, sources)],
        check=True,
        timeout=300,
    )
