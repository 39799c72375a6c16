"""One JSON line per trainer step: what the launcher prints and plots."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel


class StepProgress(BaseModel):
    step: int
    version: int
    mean_reward: float
    groups: int
    policy_lag_mean: float
    policy_lag_max: int
    stale_dropped: int
    accepted_total: int
    rejected_total: int
    loss: float
    clip_frac: float
    seconds: float
    wall: float


def append(path: Path | None, row: StepProgress) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write() of a whole line per step, flushed, so a reader never sees half a line.
    with open(path, "a") as f:
        f.write(json.dumps(row.model_dump()) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(path: Path) -> list[StepProgress]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(StepProgress.model_validate_json(line))
    return rows
