"""Redis stream and consumer-group names, and how a message rides in a stream entry.

Internal services talk only through these streams. Each entry carries one field, `data`, holding
the JSON of a `protocol.messages` model, so a consumer validates exactly what a producer sent.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from .messages import (
    PolicyAnnouncement,
    StepProgress,
    SubmittedRollout,
    Verdict,
    VerifiedRollout,
)

ROLLOUTS_SUBMITTED = "rollouts:submitted"
ROLLOUTS_VERIFIED = "rollouts:verified"
ROLLOUTS_REJECTED = "rollouts:rejected"
# Suspects whose second opinion could not be recomputed on the worker's declared device class:
# held, neither trained on nor slashed, until a validator of that class settles them. Each class
# reads the stream through its own consumer group, `held_group(device_class)`.
ROLLOUTS_HELD = "rollouts:held"
POLICY_ANNOUNCEMENTS = "policy:announcements"
# One entry per trainer step (its `StepProgress`), capped: what the status page plots. Nobody
# consumes it as a group; readers take the newest entries with XREVRANGE.
TRAINER_PROGRESS = "trainer:progress"
TRAINER_PROGRESS_MAXLEN = 1_000

# How long an entry every consumer group has acknowledged stays for readers outside the groups
# (the operator's books, dashboards) before its consumer trims it (libs/streams/retention.py).
RETENTION_S = 600.0

VALIDATOR_GROUP = "validators"
TRAINER_GROUP = "trainer"


def held_group(device_class: str) -> str:
    """The consumer group through which validators of `device_class` read held suspects."""
    return f"held-{device_class}"


# Which model each stream carries; consumers decode with this, never with a guess.
STREAM_MODELS: dict[str, type[BaseModel]] = {
    ROLLOUTS_SUBMITTED: SubmittedRollout,
    ROLLOUTS_VERIFIED: VerifiedRollout,
    ROLLOUTS_REJECTED: Verdict,
    ROLLOUTS_HELD: SubmittedRollout,
    POLICY_ANNOUNCEMENTS: PolicyAnnouncement,
    TRAINER_PROGRESS: StepProgress,
}

FIELD = "data"

M = TypeVar("M", bound=BaseModel)


def encode(message: BaseModel) -> dict[str, str]:
    return {FIELD: message.model_dump_json()}


def decode(model: type[M], fields: dict[bytes | str, bytes | str]) -> M:
    raw = fields.get(FIELD) if FIELD in fields else fields.get(FIELD.encode())
    if raw is None:
        raise ValueError(f"stream entry has no {FIELD!r} field")
    return model.model_validate_json(raw)
