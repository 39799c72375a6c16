"""Ejection of silent workers: a worker not heard from for `eject_after_s` loses its membership
on chain, signed with the pool owner's key (no slash; its stake unbonds as after `leave`).

Without it a vanished worker stays a member forever, counted in the pool and holding stake the
owner cannot tell from an active contributor's. The roster's claim is the lock: with several
orchestrators on one Redis, each silent worker is ejected once.

Silence is the worker's fault only when the pool could have heard it. Two kinds of silence are
the operator's, and eject nobody (`why_nobody_is_ejected`): the pool was not listening (every
replica down, or Redis out of their reach: the count of silence starts again when one listens),
and silence that is correlated (more than `eject_max_silent_share` of the roster silent at once:
the orchestrator's region cut off, its balancer down, a route lost; contributors do not leave
in step).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.errors import ChainError, ChainRevert

from . import metrics
from .settings import OrchestratorSettings
from .state import WorkerRoster

log = logging.getLogger(__name__)


def round_interval_s(settings: OrchestratorSettings) -> float:
    return min(10.0, settings.eject_after_s / 4)


def quiet_after_s(settings: OrchestratorSettings) -> float:
    """How long unheard a worker counts as quiet now, for the share of the roster that fell
    silent together. Shorter than `eject_after_s`: workers cut off at one moment were last
    heard a heartbeat apart, so they cross `eject_after_s` one by one, and the first to cross
    it must not be ejected alone while the rest are a moment behind."""
    return min(settings.heartbeat_ttl_s, settings.eject_after_s / 2)


def why_nobody_is_ejected(
    silent: int, quiet: int, registered: int, listened_s: float, settings: OrchestratorSettings
) -> str | None:
    """Why this round must eject nobody (the silence is the operator's), or None. `silent`:
    workers past `eject_after_s`; `quiet`: those past `quiet_after_s`, the silent among them."""
    if silent and listened_s < settings.eject_after_s:
        return (
            f"the pool has listened for only {listened_s:.0f} s (its replicas or Redis were "
            "down): silence from before that is not the workers'"
        )
    if silent and quiet > settings.eject_max_silent_share * registered:
        return (
            f"{quiet} of {registered} workers silent at once (more than "
            f"{settings.eject_max_silent_share:.0%}): an outage on the pool's side or the "
            "network's, not departures"
        )
    return None


async def eject_silent_workers(
    roster: WorkerRoster, owner: LedgerClient, settings: OrchestratorSettings
) -> None:
    """Runs for the orchestrator's lifetime; each round ejects the workers silent for too long."""
    interval = round_interval_s(settings)
    held: str | None = None
    while True:
        await asyncio.sleep(interval)
        try:
            # Two missed rounds of every replica is a gap: nobody was listening then.
            since = await roster.mark_listening(gap_s=3 * interval)
            silent, registered = await roster.silent(settings.eject_after_s)
            quiet, _ = await roster.silent(quiet_after_s(settings))
        except Exception as exc:  # Redis down: the next round tries again
            log.warning("ejection round skipped: %s", exc)
            continue
        listened_s = time.time() - since
        why = why_nobody_is_ejected(len(silent), len(quiet), registered, listened_s, settings)
        metrics.EJECTIONS_HELD.set(1 if why else 0)
        if why != held:
            if why:
                log.warning("nobody ejected: %s", why, extra={"fields": {"silent": len(silent)}})
            elif held:
                log.info("silent workers may be ejected again")
            held = why
        if why:
            continue
        for worker in silent:
            if not await roster.claim(worker, settings.eject_after_s):
                continue  # heard from since, or claimed by another replica
            record = await asyncio.to_thread(eject_one, owner, settings, worker)
            if record is not None:
                await roster.record_ejection(worker, json.dumps(record))


def eject_one(owner: LedgerClient, settings: OrchestratorSettings, worker: str) -> dict | None:
    """The ejection's record, or None when there was nothing to eject or the chain refused."""
    reason = f"no heartbeat for {settings.eject_after_s:.0f} s"
    fields = {"worker": worker, "reason": reason}
    try:
        if not owner.is_member(settings.pool_id, worker):
            log.info("silent worker already left the pool", extra={"fields": fields})
            return None
        result = owner.eject(settings.pool_id, worker, reason)
    except ChainRevert as exc:  # e.g. it left between the check and the transaction
        log.info("ejection refused: %s", exc.reason, extra={"fields": fields})
        return None
    except ChainError as exc:
        # The worker is off the roster already: it gets no work, and the owner sees this line.
        log.error("ejection failed: %s", exc, extra={"fields": fields})
        return None
    metrics.WORKERS_EJECTED.inc()
    record = {
        "at": time.time(),
        "reason": reason,
        "stake": result.stake,
        "tx": result.tx.tx_hash,
    }
    log.warning("worker ejected on chain", extra={"fields": {**fields, **record}})
    return record
