"""`prime-swarm up` exactly as `make up` runs it: the held-out reward must rise through RL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def refusals(runs: Path) -> str:
    """The validators' refusals other than staleness, with the statistic that decided each: what
    a failed run needs said (an honest worker slashed below the pool's minimum stops the run)."""
    lines = [
        line
        for log in sorted(runs.glob("latest/logs/validator*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if '"reason"' in line and '"stale_policy"' not in line
    ]
    return "\nvalidator refusals:\n" + "\n".join(lines[-20:])


@pytest.mark.timeout(600)
def test_local_run_learns_and_reports(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "prime-swarm"
    runs = tmp_path / "runs"
    env = {**os.environ, "PRIME_UP_CACHE_DIR": str(REPO / ".cache")}
    proc = subprocess.run(
        [str(script), "up", "--runs-dir", str(runs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + refusals(runs)
    assert " reward " in proc.stdout  # the per-step progress table was printed
    latest = runs / "latest"
    summary = json.loads((latest / "summary.json").read_text())
    assert (latest / "reward.png").stat().st_size > 10_000
    for key in (
        "steps",
        "heldout_reward_start",
        "heldout_reward_end",
        "rollouts_submitted",
        "rollouts_accepted",
        "rollouts_rejected",
        "attested_units_onchain",
        "wall_seconds",
    ):
        assert key in summary
    assert summary["heldout_reward_end"] - summary["heldout_reward_start"] >= 0.2
    assert summary["attested_units_onchain"] > 0
    assert set(summary["rejected_by_reason"]) <= {"stale_policy"}
