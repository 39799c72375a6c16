"""The hostile-swarm run end to end (`python -m bench.hostile`, `make hostile`): a clean run and a
run with a cheater of each kind and a flooder; every check of its JSON must hold. Slow: two
training runs, one with ten workers on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_hostile_swarm_checks_hold(tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.hostile", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["passed"], (result["checks"], run.stdout[-2000:], run.stderr[-2000:])
    assert set(result["cheaters"]) >= {"forged_proof", "different_model_other_seed"}
