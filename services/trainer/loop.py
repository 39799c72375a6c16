"""The trainer: verified rollouts in, one GRPO step, a signed new policy version out.

The loop only collects and computes. Checkpointing, acknowledging and publishing run on the
Persister's thread (persist.py), so a slow upload never stalls the next step.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import httpx
import torch
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.model.causal_lm import PRECISIONS
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.rl import checkpoint as ckpt
from prime_swarm.libs.rl.advantages import is_informative
from prime_swarm.libs.rl.distributed import (
    DistContext,
    broadcast_batch,
    full_optimizer_state_dict,
    full_state_dict,
    load_full_optimizer_state_dict,
    shard_model,
)
from prime_swarm.libs.rl.grpo import Rollout, make_optimizer, make_scheduler
from prime_swarm.libs.rl.step import train_step
from prime_swarm.libs.rollout.admission import is_fresh
from prime_swarm.libs.shardcast.client import make_http_client
from prime_swarm.libs.shardcast.publish import publish_version
from prime_swarm.libs.shardcast.routes import manifest_path
from prime_swarm.libs.streams.announcements import latest_announcement
from prime_swarm.libs.streams.connection import connect
from prime_swarm.libs.streams.consumer import Entry, GroupReader
from prime_swarm.libs.streams.replication import ReplicaWait, has_replicas
from prime_swarm.libs.streams.retention import entries_added
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    Manifest,
    PolicyAnnouncement,
    StepProgress,
    VerifiedRollout,
)
from prime_swarm.protocol.trainer_records import DROPPED, TRAINED, TRAINED_BY_STEP

from . import metrics, progress
from .persist import Persister, Snapshot
from .settings import TrainerSettings

log = logging.getLogger("trainer")

PUBLISH_ATTEMPTS = 4  # 2 + 4 + 8 s of pauses: longer than any reconnect, short of a step
__all__ = ["Trainer"]


class Trainer:
    """Rank 0 of the trainer: it alone reads Redis, checkpoints and publishes. Under torchrun
    the other ranks run `follow` (follower.py) and take each batch from it by broadcast; in a
    single process `ctx` is the default one and every collective is a no-op."""

    def __init__(
        self, settings: TrainerSettings, account: LocalAccount, ctx: DistContext | None = None
    ) -> None:
        self.settings, self.account = settings, account
        self.ctx = ctx or DistContext(0, 1, torch.device("cpu"))
        self.root = settings.checkpoint_dir
        self.r = connect(settings.redis_url, socket_timeout=30)
        self.reader = GroupReader(
            self.r,
            streams.ROLLOUTS_VERIFIED,
            streams.TRAINER_GROUP,
            settings.consumer,
            VerifiedRollout,
            min_idle_ms=settings.reclaim_idle_ms,
        )
        self.cfg = settings.grpo
        self.counters: dict[str, float] = {"stale": 0, "filtered": 0, "busy_s": 0.0, "wall_s": 0.0}
        # Groups whose completions all scored alike (no advantage), trained or dropped, by
        # environment: what live prompt selection is meant to spare.
        self.zero_advantage: Counter[str] = Counter()
        torch.manual_seed(settings.seed)
        self.step, self.model, self.opt, self.sched = self._resume()
        self.ref = load_pretrained(ckpt.model_dir(self.root, 0)) if settings.loss.kl_coef else None
        # Entries this consumer read before a restart and never acknowledged come first.
        self._backlog: list[Entry[VerifiedRollout]] = self._own_pending()
        # Submission id -> the step it was collected for (see `collect`).
        self._taken: dict[str, int] = {}
        latest = latest_announcement(self.r)
        self._last_published: int | None = latest.version if latest else None
        # Its manifest once this process has published it: the parent files' hashes for the
        # next version's deltas (after a restart they are hashed again).
        self._last_manifest: Manifest | None = None
        # One keep-alive client for every upload: a version a step, each a handful of requests.
        self._origin_http = make_http_client(settings.http_timeout_s)
        if latest is None or latest.version < self.step:
            self.publish(self.step)  # a fresh start, or a crash between saving and announcing
        self.persister = Persister(
            self.r,
            self._save,
            self.publish,
            start_version=self.step,
            replica_wait=ReplicaWait(has_replicas(settings.redis_url)),
        )
        self._last_step_end: float | None = None
        self.started = time.time()
        log.info("trainer ready", extra={"fields": {"step": self.step}})

    # ------------------------------------------------------------------ state
    def _resume(
        self,
    ) -> tuple[int, object, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        """Continue from the newest complete checkpoint; the trained ids of every saved version
        go back into the trained set (they may not have reached Redis before a crash)."""
        versions = ckpt.saved_versions(self.root)
        for v in versions:
            state = ckpt.load_state(self.root, v)
            if state and state.trained:
                self.r.sadd(TRAINED, *state.trained)
                self.r.hsetnx(TRAINED_BY_STEP, str(v), ",".join(state.trained))
        if not versions:
            model = load_pretrained(self.settings.init_model_dir)
            step, state = 0, ckpt.TrainerState(step=0)
            ckpt.save_checkpoint(
                self.root, model.module, model.tokenizer, state, publish_dtype=self._publish_dtype
            )
        else:
            step = versions[-1]
            model = load_pretrained(ckpt.model_dir(self.root, step))
            state = ckpt.load_state(self.root, step) or ckpt.TrainerState(step=step)
        # Followers load the same directory, then shard and step in lockstep with rank 0.
        source = self.settings.init_model_dir if not versions else ckpt.model_dir(self.root, step)
        broadcast_batch((step, str(source), state.scheduler), self.ctx)
        shard_model(model, self.ctx)
        opt = make_optimizer(model, lr=self.settings.lr)  # after sharding: it holds the shards
        sched = make_scheduler(opt, self.settings.warmup_steps)
        if self.ctx.distributed or state.optimizer:
            load_full_optimizer_state_dict(model, opt, state.optimizer, self.ctx)
        if state.scheduler:
            sched.load_state_dict(state.scheduler)
        if state.rng:
            ckpt.restore_rng(state.rng)
        self.counters.update(state.counters)
        return step, model, opt, sched

    def _own_pending(self) -> list[Entry[VerifiedRollout]]:
        # At most a few steps' worth exist (lease admission bounds what is in flight); any
        # beyond this count are reclaimed by the normal read once idle.
        return self.reader.own_pending(10_000)

    def _save(self, snap: Snapshot) -> None:
        ckpt.save_checkpoint(
            self.root,
            self.model.module,
            self.model.tokenizer,
            snap.state,
            snap.weights,
            publish_dtype=self._publish_dtype,
        )

    @property
    def _publish_dtype(self) -> torch.dtype:
        return PRECISIONS[self.settings.publish_precision]

    def publish(self, version: int) -> None:
        """Push saved version `version` to the origin and announce it, with deltas against the
        version published before it where that is still on disk."""
        parent = self._last_published if version > 0 else None
        parent_dir = ckpt.published_dir(self.root, parent) if parent is not None else None
        if parent_dir is not None and not parent_dir.is_dir():
            parent_dir = None
        # A request can leave on a pooled keep-alive connection that the origin closes at that
        # moment ("Server disconnected without sending a response"): over the wide-area testbed
        # that killed the trainer mid-run. Publishing again is safe (the origin keeps what it
        # has), so a transport error is retried, within a budget.
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                signed = publish_version(
                    self.settings.origin_url,
                    ckpt.published_dir(self.root, version),
                    version=version,
                    parent_version=parent,  # the version shipped before
                    account=self.account,
                    shard_size=self.settings.shard_size,
                    timeout=self.settings.http_timeout_s,
                    http=self._origin_http,
                    parent_dir=parent_dir,
                    parent_manifest=self._last_manifest,
                )
                break
            except httpx.TransportError as exc:
                if attempt == PUBLISH_ATTEMPTS:
                    raise
                log.warning("publishing version %s failed (%s); retrying", version, exc)
                time.sleep(2.0**attempt)
        ann = PolicyAnnouncement(
            version=version,
            step=version,
            model_hash=signed.manifest.model_hash,
            manifest_path=manifest_path(version),
        )
        self.r.xadd(
            streams.POLICY_ANNOUNCEMENTS, streams.encode(ann), maxlen=10_000, approximate=True
        )
        self._last_published, self._last_manifest = version, signed.manifest
        metrics.POLICY_VERSION.set(version)
        ckpt.prune(self.root, self.settings.keep_checkpoints)

    # ------------------------------------------------------------------ collect
    def _next_entries(self, want: int) -> list[Entry[VerifiedRollout]]:
        if self._backlog:
            taken, self._backlog = self._backlog[:want], self._backlog[want:]
            return taken
        return self.reader.read(want, block_ms=200)

    def collect(self) -> tuple[list[VerifiedRollout], list[str]]:
        """A step's worth of fresh, informative groups. Stale groups (older than the async
        bound) and zero-variance groups (no gradient) are acknowledged and counted, and the
        batch is refilled from the stream, so every step trains a full batch."""
        batch: list[VerifiedRollout] = []
        ids: list[str] = []
        filtered_now = 0
        while len(batch) < self.settings.groups_per_step:
            self.persister.raise_if_failed()
            entries = self._next_entries(self.settings.groups_per_step - len(batch))
            metrics.QUEUE_LAG.set(self.reader.lag())
            for e in entries:
                msg = e.message
                if msg is None:
                    log.warning("dropping undecodable entry", extra={"fields": {"err": e.error}})
                    self.reader.ack(e.entry_id)
                elif self._taken.get(msg.submission_id, -1) >= self.persister.saved_step:
                    # Taken for a step not yet saved: a step longer than `reclaim_idle_ms`
                    # has the reader reclaim its own batch's entries. Left pending: the
                    # persister acknowledges them with the step, and a crash before that
                    # has them delivered again (acknowledged here, they would be lost).
                    continue
                elif msg.submission_id in self._taken or self.r.sismember(
                    TRAINED, msg.submission_id
                ):
                    self.reader.ack(e.entry_id)  # trained before a crash; never twice
                elif not is_fresh(msg.policy_version, self.step, self.settings.recipe.async_level):
                    # Bounded staleness (DESIGN.md §3.4): too old to train on by now.
                    self.counters["stale"] += 1
                    metrics.STALE_DROPPED.inc()
                    self._drop(e, msg, "stale")
                elif (
                    self.settings.filter_zero_variance
                    and filtered_now < self.settings.max_filtered_per_step
                    and not is_informative([c.reward for c in msg.completions])
                ):
                    self.zero_advantage[msg.env] += 1
                    filtered_now += 1
                    self.counters["filtered"] += 1
                    metrics.FILTERED.inc()
                    self._drop(e, msg, "zero_variance")
                else:
                    if not is_informative([c.reward for c in msg.completions]):
                        self.zero_advantage[msg.env] += 1  # trained on, for no gradient
                    batch.append(msg)
                    ids.append(e.entry_id)
                    self._taken[msg.submission_id] = self.step
        # A Redis failover can lose the newest writes (docs/high-availability.md): a validator
        # then decides a group again, and the copy reaches the trainer under a new entry id,
        # possibly before the trained set records the first. Remembered here for as long as a
        # copy could still be fresh enough to train; after that it is dropped as stale anyway.
        horizon = self.step - self.settings.recipe.async_level - 2
        self._taken = {sid: at for sid, at in self._taken.items() if at >= horizon}
        return batch, ids

    def _drop(self, e: Entry[VerifiedRollout], msg: VerifiedRollout, reason: str) -> None:
        """Acknowledge a group that will not be trained, recording why (before the ack, so a
        crash between the two only records it twice)."""
        self.r.hset(DROPPED, msg.submission_id, reason)
        self.reader.ack(e.entry_id)

    # ------------------------------------------------------------------ step
    def train_step(self) -> StepProgress:
        t_wait = time.monotonic()
        batch, ids = self.collect()
        t0 = time.monotonic()
        idle = t0 - t_wait
        groups = [
            [
                Rollout(
                    prompt_ids=r.prompt_token_ids,
                    completion_ids=c.token_ids,
                    old_logprobs=c.logprobs,
                    reward=c.reward,
                    temperature=r.sampling.temperature,
                    inference_logprobs=c.inference_logprobs,
                    sampled_spans=c.sampled_spans or None,
                )
                for c in r.completions
            ]
            for r in batch
        ]
        broadcast_batch(groups, self.ctx)
        stats = train_step(
            self.model,
            self.opt,
            groups,
            self.cfg,
            self.ctx,
            ref_model=self.ref,
            scheduler=self.sched,
            constant_tokens=self.settings.step_tokens,
        )
        trained_at = self.step
        self.step += 1
        snap = Snapshot(
            state=ckpt.TrainerState(
                step=self.step,
                optimizer=full_optimizer_state_dict(self.model, self.opt, self.ctx),
                scheduler=self.sched.state_dict(),
                rng=ckpt.rng_state(),
                trained=[r.submission_id for r in batch],
                counters=dict(self.counters),
            ),
            weights=full_state_dict(self.model, self.ctx) or {},
            entry_ids=ids,
        )
        self.persister.submit(snap)
        seconds = time.monotonic() - t0
        return self._record(batch, stats, trained_at, seconds, idle)

    def _record(
        self,
        batch: list[VerifiedRollout],
        stats: dict[str, float],
        trained_at: int,
        seconds: float,
        idle: float,
    ) -> StepProgress:
        now = time.monotonic()
        # The first step's wait is warm-up (workers fetching v0, first generation); busy time
        # is counted from the end of the first step.
        if self._last_step_end is not None:
            self.counters["busy_s"] += seconds
            self.counters["wall_s"] += now - self._last_step_end
        self._last_step_end = now
        lags = [trained_at - r.policy_version for r in batch]
        comps = [c for r in batch for c in r.completions]
        tokens = sum(len(c.token_ids) for c in comps)
        n = max(len(comps), 1)
        ages = [time.time() - r.submitted_at for r in batch]
        busy = self.counters["busy_s"] / self.counters["wall_s"] if self.counters["wall_s"] else 0
        by_env: dict[str, list[float]] = {}
        for r in batch:
            by_env.setdefault(r.env, []).extend(c.task_reward for c in r.completions)
        row = StepProgress(
            step=self.step,
            version=self.step,
            mean_reward=sum(c.reward for c in comps) / n,
            reward_task=sum(c.task_reward for c in comps) / n,
            reward_length=sum(c.length_reward for c in comps) / n,
            reward_format=sum(c.format_reward for c in comps) / n,
            reward_by_env={env: sum(rs) / len(rs) for env, rs in by_env.items()},
            groups_by_env=dict(Counter(r.env for r in batch)),
            zero_advantage_by_env=dict(self.zero_advantage),
            groups=len(batch),
            completions=len(comps),
            policy_lag_mean=sum(lags) / max(len(lags), 1),
            policy_lag_max=max(lags, default=0),
            lag_histogram=dict(Counter(lags)),
            rollout_age_s=sum(ages) / max(len(ages), 1),
            stale_dropped=int(self.counters["stale"]),
            filtered_total=int(self.counters["filtered"]),
            accepted_total=entries_added(self.r, streams.ROLLOUTS_VERIFIED),
            rejected_total=entries_added(self.r, streams.ROLLOUTS_REJECTED),
            loss=float(stats["loss"]),
            clip_frac=float(stats["clip_frac"]),
            stats={k: round(float(v), 6) for k, v in stats.items()},
            seconds=seconds,
            idle_s=idle,
            busy_fraction=busy,
            tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
            wall=time.time() - self.started,
        )
        self._export(row, lags, ages)
        progress.append(self.settings.progress_file, row)
        progress.publish(self.r, row)
        log.info("step", extra={"fields": row.model_dump(exclude={"stats", "lag_histogram"})})
        return row

    @staticmethod
    def _export(row: StepProgress, lags: list[int], ages: list[float]) -> None:
        metrics.STEPS.inc()
        metrics.MEAN_REWARD.set(row.mean_reward)
        metrics.REWARD_PART.labels("task").set(row.reward_task)
        metrics.REWARD_PART.labels("length").set(row.reward_length)
        metrics.REWARD_PART.labels("format").set(row.reward_format)
        for env, reward in row.reward_by_env.items():
            metrics.ENV_REWARD.labels(env).set(reward)
        for k, v in row.stats.items():
            metrics.STEP_STAT.labels(k).set(v)
        metrics.COMPLETIONS.inc(row.completions)
        metrics.TOKENS_PER_S.set(row.tokens_per_s)
        metrics.STEP_SECONDS.observe(row.seconds)
        metrics.IDLE_SECONDS.observe(row.idle_s)
        metrics.BUSY_FRACTION.set(row.busy_fraction)
        for lag in lags:
            metrics.CONSUMPTION_LAG.observe(lag)
        for age in ages:
            metrics.QUEUE_SECONDS.observe(age)

    def run(self) -> None:
        try:
            while self.step < self.settings.max_steps:
                self.train_step()
            broadcast_batch(None, self.ctx)  # tells the followers the run is over
        finally:
            # Whatever ends the loop, what was trained is saved, acknowledged and published.
            self.persister.drain()
            self._origin_http.close()
        log.info("reached max_steps", extra={"fields": {"step": self.step}})
