"""Ejection of silent workers: a worker not heard from for `eject_after_s` loses its membership
on chain, signed with the pool owner's key (no slash; its stake unbonds as after `leave`).

Without it a vanished worker stays a member forever, counted in the pool and holding stake the
owner cannot tell from an active contributor's. The roster's claim is the lock: with several
orchestrators on one Redis, each silent worker is ejected once.
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


async def eject_silent_workers(
    roster: WorkerRoster, owner: LedgerClient, settings: OrchestratorSettings
) -> None:
    """Runs for the orchestrator's lifetime; each round ejects the workers silent for too long."""
    interval = min(30.0, settings.eject_after_s / 4)
    while True:
        await asyncio.sleep(interval)
        try:
            silent = await roster.claim_silent(settings.eject_after_s)
        except Exception as exc:  # Redis down: the next round tries again
            log.warning("ejection round skipped: %s", exc)
            continue
        for worker in silent:
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
