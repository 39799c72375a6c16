"""The validator's loop with everything but its chain client and policy downloads: real Redis,
real streams, its own decision path; `policy` is what every version loads as."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import redis

from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.streams.consumer import GroupReader
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import SubmittedRollout
from prime_swarm.services.validator.loop import Validator

HERE = device_class("cpu")
CHAIN_QUEUE = "validator:1:chain_queue"


def validator(
    r: redis.Redis, policy: LoadedPolicy, device_class: str = HERE, audit_fraction: float = 0.0
) -> Validator:
    v = Validator.__new__(Validator)
    v.r = r
    v.settings = SimpleNamespace(
        recipe=Recipe(async_level=2),
        relays=["http://relay"],
        reward_tolerance=1e-6,
        audit_fraction=audit_fraction,
    )
    v.reader = GroupReader(
        r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, device_class, SubmittedRollout
    )
    v.held_reader = GroupReader(
        r, streams.ROLLOUTS_HELD, streams.held_group(device_class), device_class, SubmittedRollout
    )
    v.queue = SimpleNamespace(key=CHAIN_QUEUE)
    v.counts = defaultdict(int)
    v.device_class = device_class
    v.account = SimpleNamespace(address="0x" + "22" * 20)
    v.store = SimpleNamespace(get=lambda version, relays: policy)  # downloads tested elsewhere
    return v
