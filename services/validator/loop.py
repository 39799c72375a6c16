"""The validator: submitted rollouts in, verdicts out (stream + chain)."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from eth_account.signers.local import LocalAccount
from redis.client import Pipeline

from prime_swarm.libs.chain.anchor import trusted_trainer
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.environments.registry import args_key
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.policy.store import PolicyError, PolicyStore
from prime_swarm.libs.rollout import env_disputes, sampling_record, verify
from prime_swarm.libs.rollout.admission import Refusal, check_admission, check_answers_lease
from prime_swarm.libs.rollout.pool_rates import Record
from prime_swarm.libs.rollout.selection import pass_rate
from prime_swarm.libs.streams.announcements import latest_announcement
from prime_swarm.libs.streams.connection import connect
from prime_swarm.libs.streams.consumer import Entry, GroupReader
from prime_swarm.libs.streams.replication import ReplicaWait, has_replicas
from prime_swarm.libs.streams.retention import Retention
from prime_swarm.protocol import streams
from prime_swarm.protocol.env_records import ENV_GROUPS, ENV_MISMATCHES, env_key
from prime_swarm.protocol.messages import (
    SubmittedRollout,
    Verdict,
    VerifiedCompletion,
    VerifiedRollout,
    normal_address,
)
from prime_swarm.protocol.sampling_records import SAMPLING_GROUPS, SAMPLING_MARKED, sampling_kind
from prime_swarm.protocol.selection_records import PASS_RATES

from . import metrics, stats
from .ledger_queue import ChainAction, LedgerQueue
from .settings import ValidatorSettings

log = logging.getLogger("validator")

SEEN_TTL_S = 7 * 24 * 3600
ENV_RECORD_TTL_S = 7 * 24 * 3600  # refreshed by every group judged: an environment in use
# Verdicts that say the environment's tokens replayed (accepted) or did not (refused on them):
# the record of each environment across workers (libs/rollout/env_disputes.py) counts these.
ENVIRONMENT_VERDICTS = {"context_mismatch", "env_unsettled"}
# Which accepted cross-class groups are spot-checked: unpredictable to the worker.
_audit_draw = random.SystemRandom()


@dataclass
class Decided:
    """One submission's verdict, with the rollout the trainer gets when it was accepted."""

    entry_id: str
    msg: SubmittedRollout
    verdict: Verdict
    verified: VerifiedRollout | None = None
    marked: bool = False
    """Accepted with a replay z over sampling_record.MARGINAL_Z: counted as such in the
    worker's sampling record."""

    def fields(self) -> tuple[str, SubmittedRollout, Verdict, VerifiedRollout | None, bool]:
        return self.entry_id, self.msg, self.verdict, self.verified, self.marked


def default_consumer(address: str) -> str:
    return f"validator-{normal_address(address)[2:12]}-{socket.gethostname()}"


class Validator:
    def __init__(self, settings: ValidatorSettings, account: LocalAccount) -> None:
        self.settings, self.account = settings, account
        self.r = connect(settings.redis_url, socket_timeout=30)
        self.reader = GroupReader(
            self.r,
            streams.ROLLOUTS_SUBMITTED,
            streams.VALIDATOR_GROUP,
            settings.consumer or default_consumer(account.address),
            SubmittedRollout,
            min_idle_ms=settings.reclaim_idle_ms,
        )
        self.ledger = LedgerClient(
            settings.rpc_url,
            settings.ledger_address,
            account=account,
            timeout=settings.chain_timeout_s,
        )
        if not self.ledger.is_validator(settings.pool_id, account.address):
            raise SystemExit(
                f"{account.address} is not a registered validator of pool {settings.pool_id}"
            )
        self.queue = LedgerQueue(
            self.r,
            self.ledger,
            settings.pool_id,
            account.address,
            settings.attest_batch_size,
            settings.attest_interval_s,
            ReplicaWait(has_replicas(settings.redis_url)),
        )
        self.store = PolicyStore(
            settings.cache_dir,
            trusted_trainer(self.ledger.get_pool(settings.pool_id), settings.trusted_trainer),
            keep=settings.keep_versions,
            timeout_s=settings.http_timeout_s,
            # fp32 weights, cast once per precision a worker declares (CausalLM.cast caches).
            dtype=torch.float32,
            device=settings.device,
        )
        self.counts: dict[str, int] = defaultdict(int)
        # The submitted stream behind this group, and the rejected verdicts (a record) by age.
        self.retention = Retention(self.r, (streams.ROLLOUTS_SUBMITTED, streams.ROLLOUTS_REJECTED))
        self.device_class = device_class(settings.device)
        # Suspects other validators held for this device class: settled here.
        self.held_reader = GroupReader(
            self.r,
            streams.ROLLOUTS_HELD,
            streams.held_group(self.device_class),
            settings.consumer or default_consumer(account.address),
            SubmittedRollout,
            min_idle_ms=settings.reclaim_idle_ms,
        )

    def current_version(self) -> int:
        latest = latest_announcement(self.r)
        return latest.version if latest else -1

    def _first_sighting(self, entry: SubmittedRollout) -> bool:
        """Content seen before under another submission id is a replay (across workers, too)."""
        key = f"validator:seen:{entry.submission.content_hash()}"
        if self.r.set(key, entry.submission_id, nx=True, ex=SEEN_TTL_S):
            return True
        held = self.r.get(key)
        # The same submission reclaimed after a crash is not a duplicate of itself.
        return (held.decode() if isinstance(held, bytes) else held) == entry.submission_id

    def validate_batch(self, entries: list[Entry[SubmittedRollout]], held: bool = False) -> None:
        """Judge a batch read from `rollouts:submitted`, or (`held`) held suspects of this
        validator's device class: those were admitted and first seen before, so only their lease
        match is checked again (their reward must not be lost to the wait), and other classes'
        entries are passed over."""
        started = time.monotonic()
        current = self.current_version()
        verdicts: list[Decided] = []
        works: list[tuple[str, verify.Work]] = []
        no_verdict: list[str] = []
        unavailable: set[int] = set()  # versions that failed to fetch: tried once per batch
        for e in entries:
            if e.message is None:
                log.warning("undecodable submission dropped", extra={"fields": {"err": e.error}})
                metrics.UNDECODABLE.inc()
                no_verdict.append(e.entry_id)
                continue
            msg = e.message
            if held and msg.submission.device_class != self.device_class:
                no_verdict.append(e.entry_id)  # another class's to settle: acknowledged, skipped
                continue
            try:
                if held:
                    check_answers_lease(msg.submission, msg.lease)
                else:
                    check_admission(
                        msg.submission, msg.lease, current, self.settings.recipe.async_level
                    )
                    if not self._first_sighting(msg):
                        raise Refusal("duplicate", "identical work was submitted before")
                version = msg.submission.policy_version
                try:
                    if version in unavailable:
                        raise PolicyError(f"policy v{version} unavailable earlier in this batch")
                    policy = self.store.get(version, self.settings.relays)
                except PolicyError as exc:
                    # Admission has checked the version was announced, so the trainer signed
                    # it: failing to fetch or load it is this side's fault, never the
                    # worker's. Left unacknowledged, it is reclaimed after `reclaim_idle_ms`
                    # and judged then (or refused as stale, which does not slash).
                    log.warning("policy unavailable; submission deferred: %s", exc)
                    metrics.DEFERRED.inc()
                    unavailable.add(version)
                    continue
                verify.check_prompt(msg, policy.lm)
                verify.check_shapes(msg, policy.lm)
            except Refusal as rej:
                if rej.reason == "unknown_policy":
                    # The orchestrator admits no version newer than the announced one, so an
                    # announcement now behind this work is the pool's lost write (a Redis
                    # failover before the trainer's newest entry replicated), never the
                    # worker's: left pending like an unfetchable version, and judged once the
                    # announcements pass it again.
                    log.warning("announcement behind the work; submission deferred: %s", rej.detail)
                    metrics.DEFERRED.inc()
                    continue
                verdicts.append(Decided(e.entry_id, msg, self._verdict(msg, rej)))
                continue
            works.append((e.entry_id, verify.Work(msg, policy)))

        if works:
            t0 = time.monotonic()
            decisions = verify.verify_batch(
                [w for _, w in works],
                self.settings.reward_tolerance,
                self.settings.recipe.length_reward,
                device_class=self.device_class,
            )
            metrics.PREFILL_SECONDS.observe(time.monotonic() - t0)
            for (entry_id, work), decision in zip(works, decisions, strict=True):
                if verify.unexplained_environment_refusal(decision):
                    decision = self._blame_environment(work.entry, decision)
                if not work.entry.audit:  # an audit's group was counted when first accepted
                    decision = self._weigh_sampling(work.entry, decision)
                decided = self._decide(entry_id, work.entry, decision)
                decided.marked = sampling_record.marked(decision)
                if work.entry.audit and decided.verdict.accepted:
                    # Attested when first accepted: a passed spot check pays nothing twice.
                    metrics.AUDITS.labels("passed").inc()
                    no_verdict.append(entry_id)
                    continue
                if work.entry.audit:
                    metrics.AUDITS.labels("failed").inc()
                verdicts.append(decided)
        source = self.held_reader if held else self.reader
        self._commit(verdicts, no_verdict, source.stream, source.group)
        metrics.LATENCY.observe(time.monotonic() - started)
        versions = [d.msg.submission.policy_version for d in verdicts]
        if versions and current >= 0:
            metrics.VERSION_LAG.set(current - sum(versions) / len(versions))

    def _record_with(self, groups_key: str, marked_key: str, worker: str) -> Record:
        """A record across workers as the pool's validators keep it, with this group counted
        in `worker`'s groups and marks, as the commit will count it."""
        groups, marked = (
            {k.decode(): int(v) for k, v in self.r.hgetall(key).items()}
            for key in (groups_key, marked_key)
        )
        groups[worker] = groups.get(worker, 0) + 1
        marked[worker] = marked.get(worker, 0) + 1
        return Record(groups, marked)

    def _blame_environment(self, msg: SubmittedRollout, d: verify.Decision) -> verify.Decision:
        """An environment refusal this machine cannot explain: slashed only if the pool's record
        of the environment across workers says it is the worker's doing, else held."""
        env, worker = msg.lease.env, msg.submission.worker
        key = env_key(env, args_key(msg.lease.env_args))
        record = self._record_with(
            ENV_GROUPS.format(env=key), ENV_MISMATCHES.format(env=key), worker
        )
        found = env_disputes.blame(record, worker, env)
        fields = {"env": env, "worker": worker, "detail": found.detail}
        if found.worker:
            log.warning("environment tokens forged", extra={"fields": fields})
            return d
        if found.environment_disputed:
            metrics.ENV_DISPUTED.labels(env).inc()
            log.error(
                f"environment {env!r} does not replay across machines: work held, not slashed",
                extra={"fields": fields},
            )
        else:
            metrics.ENV_UNSETTLED.labels(env).inc()
        return verify.held_unsettled(d, found.detail)

    def _weigh_sampling(self, msg: SubmittedRollout, d: verify.Decision) -> verify.Decision:
        """A marked group against the worker's sampling record across validators."""
        if not sampling_record.marked(d):
            return d
        sub = msg.submission
        kind = sampling_kind(sub.backend, sub.device_class)
        record = self._record_with(
            SAMPLING_GROUPS.format(kind=kind), SAMPLING_MARKED.format(kind=kind), sub.worker
        )
        weighed = sampling_record.weigh(d, record, sub.worker)
        if weighed.action == "reject" and weighed.refusal is not None:
            fields = {"worker": sub.worker, "kind": kind, "detail": weighed.refusal.detail}
            log.warning("sampling off the lease, group after group", extra={"fields": fields})
        return weighed

    def _decide(self, entry_id: str, msg: SubmittedRollout, d: verify.Decision) -> Decided:
        """The settled decision encoded: a verdict, and the trainer's rollout when accepted."""
        if d.suspect:
            j = d.judgement
            metrics.SUSPECTS.labels(d.action).inc()
            log.info(
                "suspect",
                extra={
                    "fields": {
                        "worker": msg.submission.worker,
                        "settled": d.action,
                        "first": j.refusal.detail if j.refusal else "",
                        "second": j.second_opinion.detail if j.second_opinion else "cleared",
                    }
                },
            )
        if d.refusal is not None and d.refusal.reason == "env_nondeterministic":
            # The environment's bug holds honest work until the operator fixes it: an alert.
            env = msg.lease.env
            metrics.ENV_NONDETERMINISTIC.labels(env).inc()
            log.error(
                f"environment {env!r} is not deterministic: work held, not slashed",
                extra={
                    "fields": {
                        "env": env,
                        "worker": msg.submission.worker,
                        "detail": d.refusal.detail,
                    }
                },
            )
        verdict = self._verdict(msg, d.refusal, d.completions)
        verified = self._verified(msg, verdict, d.completions) if d.action == "accept" else None
        return Decided(entry_id, msg, verdict, verified)

    def _audited(self, msg: SubmittedRollout, verdict: Verdict) -> bool:
        """Whether accepted work is also spot-checked by a validator of its declared class.
        From another class the fp32 weight ratio alone judged it, and on shallow models int8
        weights can hide in that ratio's honest spread (bench/results/toploc.json
        models.tiny: 7 of 10 such liars accepted); the spot check makes the lie a bet that
        loses the stake."""
        return (
            verdict.accepted
            and not msg.audit
            and msg.submission.device_class != self.device_class
            and _audit_draw.random() < self.settings.audit_fraction
        )

    def _verdict(
        self,
        msg: SubmittedRollout,
        rej: Refusal | None,
        completions: list[VerifiedCompletion] | None = None,
    ) -> Verdict:
        return Verdict(
            submission_id=msg.submission_id,
            lease_id=msg.lease.lease_id,
            worker=msg.submission.worker,
            pool_id=msg.lease.pool_id,
            accepted=rej is None,
            reason=rej.reason if rej else None,
            detail=rej.detail if rej else "",
            units=sum(len(c.token_ids) for c in completions) if completions else 0,
            validator=self.account.address,
        )

    @staticmethod
    def _verified(
        msg: SubmittedRollout, verdict: Verdict, completions: list[VerifiedCompletion]
    ) -> VerifiedRollout:
        return VerifiedRollout(
            submission_id=msg.submission_id,
            worker=msg.submission.worker,
            env=msg.lease.env,
            task_id=msg.submission.task_id,
            policy_version=msg.submission.policy_version,
            sampling=msg.lease.sampling,
            prompt_token_ids=msg.submission.prompt_token_ids,
            completions=completions,
            verdict=verdict,
            submitted_at=msg.received_at,
        )

    def _commit(
        self,
        verdicts: list[Decided],
        no_verdict: list[str],
        stream: str = streams.ROLLOUTS_SUBMITTED,
        group: str = streams.VALIDATOR_GROUP,
    ) -> None:
        """Verdicts, chain actions, per-worker counters and ACKs in one Redis transaction: all
        or nothing."""
        pipe = self.r.pipeline(transaction=True)
        now = time.time()
        for entry_id, msg, verdict, verified, marked in (d.fields() for d in verdicts):
            work_id = msg.lease.work_id
            if verified is not None:
                pipe.xadd(streams.ROLLOUTS_VERIFIED, streams.encode(verified))
                if self.settings.recipe.selection.enabled:
                    key, rate = pass_rate(msg.lease, verified.completions)
                    pipe.hset(PASS_RATES, key, rate)
                action = ChainAction("attest", verdict.worker, work_id, units=verdict.units)
            else:
                pipe.xadd(streams.ROLLOUTS_REJECTED, streams.encode(verdict))
                action = (
                    None
                    if verdict.reason in verify.NOT_SLASHED
                    else ChainAction("slash", verdict.worker, work_id, reason=str(verdict.reason))
                )
            if action is not None:
                pipe.rpush(self.queue.key, action.dumps())
            if verdict.reason == "held_for_recheck":
                pipe.xadd(streams.ROLLOUTS_HELD, streams.encode(msg))
            elif self._audited(msg, verdict):
                pipe.xadd(
                    streams.ROLLOUTS_HELD, streams.encode(msg.model_copy(update={"audit": True}))
                )
                metrics.AUDITS.labels("queued").inc()
            if verdict.accepted or verdict.reason in ENVIRONMENT_VERDICTS:
                self._count_environment(pipe, msg, verdict)
            if verdict.accepted and not msg.audit:
                self._count_sampling(pipe, msg, marked)
            pipe.xack(stream, group, entry_id)
            stats.count_verdict(pipe, verdict, now)
            label = "accepted" if verdict.accepted else str(verdict.reason)
            self.counts[label] += 1
            metrics.VERDICTS.labels(label).inc()
            if verdict.reason == "validator_error":  # the operator's to fix
                log.error(
                    "this validator failed on a group: refused, not slashed",
                    extra={
                        "fields": {
                            "worker": verdict.worker,
                            "reason": verdict.reason,
                            "detail": verdict.detail,
                        }
                    },
                )
            elif not verdict.accepted:
                log.info(
                    "rejected",
                    extra={
                        "fields": {
                            "worker": verdict.worker,
                            "reason": verdict.reason,
                            "detail": verdict.detail,
                        }
                    },
                )
        for entry_id in no_verdict:
            pipe.xack(stream, group, entry_id)
        pipe.execute()

    @staticmethod
    def _count_environment(pipe: Pipeline, msg: SubmittedRollout, verdict: Verdict) -> None:
        """The environment's record across workers: one more group, and one more mismatch."""
        key = env_key(msg.lease.env, args_key(msg.lease.env_args))
        keys = [ENV_GROUPS] + ([] if verdict.accepted else [ENV_MISMATCHES])
        for template in keys:
            name = template.format(env=key)
            pipe.hincrby(name, verdict.worker, 1)
            pipe.expire(name, ENV_RECORD_TTL_S)

    @staticmethod
    def _count_sampling(pipe: Pipeline, msg: SubmittedRollout, marked: bool) -> None:
        """The worker's sampling record: one more accepted group, and one more marked."""
        kind = sampling_kind(msg.submission.backend, msg.submission.device_class)
        for template in [SAMPLING_GROUPS] + ([SAMPLING_MARKED] if marked else []):
            name = template.format(kind=kind)
            pipe.hincrby(name, msg.submission.worker, 1)
            pipe.expire(name, ENV_RECORD_TTL_S)

    def run_once(self, block_ms: int = 1000, flush: bool = True) -> int:
        # The newest announced version downloads in the background while older work is
        # checked, so its first submissions do not wait for the transfer.
        announced = self.current_version()
        if announced >= 0:
            self.store.prefetch(announced, self.settings.relays)
        held = self.held_reader.read(self.settings.batch_size, block_ms=None)
        if held:
            self.validate_batch(held, held=True)
        entries = self.reader.read(self.settings.batch_size, block_ms=block_ms)
        if entries:
            self.validate_batch(entries)
        if flush and self.queue.due():
            self.queue.flush()
        self.retention.maybe_trim()
        metrics.QUEUE_DEPTH.set(self.reader.lag())
        metrics.CHAIN_QUEUE.set(self.queue.pending())
        return len(entries)

    def run(self, stop: threading.Event | None = None) -> None:
        """Validate until `stop`; attestations go on chain from a thread of their own, since
        each transaction waits for its receipt and the verdicts the trainer waits for must
        not wait behind it. Verdicts and chain actions meet only in Redis (the queue)."""
        log.info("validating", extra={"fields": {"pool": self.settings.pool_id}})
        stop = stop or threading.Event()
        done = threading.Event()
        flusher = threading.Thread(
            target=self._flush_loop, args=(done,), name="chain-flush", daemon=True
        )
        flusher.start()
        try:
            while not stop.is_set():
                self.run_once(flush=False)
        finally:
            done.set()
            self.store.close()  # no download left running into interpreter shutdown
            flusher.join()

    def _flush_loop(self, done: threading.Event) -> None:
        while not done.wait(0.05):
            try:
                if self.queue.due():
                    self.queue.flush()
            except Exception:  # a Redis or chain hiccup: the queue keeps it for the next try
                log.exception("chain flush failed")

    def drain_chain_queue(self) -> None:
        while self.queue.pending():
            before = self.queue.pending()
            self.queue.flush()
            if self.queue.pending() == before:
                break
