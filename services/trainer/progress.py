"""One JSON line per trainer step (`protocol.messages.StepProgress`): what the launcher prints
and plots. Appended whole and fsynced, so a reader never sees half a line. The same row goes to
the capped `trainer:progress` stream, where the orchestrator's status page reads recent rewards."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import StepProgress

if TYPE_CHECKING:  # the launcher reads progress files without the service extra
    import redis


def append(path: Path | None, row: StepProgress) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write() of a whole line per step, flushed, so a reader never sees half a line.
    with open(path, "a") as f:
        f.write(json.dumps(row.model_dump()) + "\n")
        f.flush()
        os.fsync(f.fileno())


def publish(r: redis.Redis, row: StepProgress) -> None:
    """Append the step to the capped progress stream (about the last thousand steps kept)."""
    r.xadd(
        streams.TRAINER_PROGRESS,
        streams.encode(row),
        maxlen=streams.TRAINER_PROGRESS_MAXLEN,
        approximate=True,
    )


def read(path: Path) -> list[StepProgress]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(StepProgress.model_validate_json(line))
    return rows
