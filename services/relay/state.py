"""What the routes of one relay process share."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from prime_swarm.libs.shardcast import VersionStore

from .metrics import RelayMetrics
from .settings import RelaySettings


@dataclass
class RelayState:
    settings: RelaySettings
    store: VersionStore
    metrics: RelayMetrics


def get_state(request: Request) -> RelayState:
    return request.app.state.relay
