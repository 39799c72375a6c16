"""The trainer: verified rollouts in, one GRPO step, a signed new policy version out."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import redis
import torch
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.model.io import load_pretrained, save_pretrained
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, grpo_step, make_optimizer
from prime_swarm.libs.rollout.admission import is_fresh
from prime_swarm.libs.shardcast.publish import publish_version
from prime_swarm.libs.shardcast.routes import manifest_path
from prime_swarm.libs.streams.consumer import Entry, GroupReader
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import PolicyAnnouncement, StepProgress, VerifiedRollout

from . import metrics, progress
from .settings import TrainerSettings

log = logging.getLogger("trainer")
TRAINED = "trainer:trained_submissions"


class Trainer:
    def __init__(self, settings: TrainerSettings, account: LocalAccount) -> None:
        self.s, self.account = settings, account
        torch.manual_seed(settings.seed)
        self.r = redis.Redis.from_url(settings.redis_url, socket_timeout=30)
        self.reader = GroupReader(
            self.r,
            streams.ROLLOUTS_VERIFIED,
            streams.TRAINER_GROUP,
            settings.consumer,
            VerifiedRollout,
            min_idle_ms=settings.reclaim_idle_ms,
        )
        self.step = 0
        self.model = load_pretrained(self._resume_point())
        self.opt = make_optimizer(self.model, lr=settings.lr)
        self.cfg = GRPOConfig(clip_eps=settings.clip_eps, max_grad_norm=settings.max_grad_norm)
        self.stale_dropped = 0
        self.started = time.time()
        latest = self._latest_announcement()
        if latest is None or latest.version < self.step:
            # A fresh start, or a crash after saving a version but before announcing it.
            self.publish()
        log.info("trainer ready", extra={"fields": {"step": self.step}})

    def _resume_point(self) -> Path:
        """Continue from the newest local checkpoint; remember which groups it was trained on.

        Each version's trained submission ids are saved next to it *before* it is published, so
        after a crash anywhere in a step the reclaimed entries are either skipped (their step was
        saved) or trained once (it was not): nothing is lost and nothing is trained twice.
        """
        saved = (
            sorted(
                int(p.name[1:])
                for p in self.s.checkpoint_dir.glob("v*")
                if p.is_dir() and p.name[1:].isdigit()
            )
            if self.s.checkpoint_dir.exists()
            else []
        )
        for path in self.s.checkpoint_dir.glob("v*.trained.json"):
            ids = json.loads(path.read_text())
            if ids:
                self.r.sadd(TRAINED, *ids)
        if not saved:
            return self.s.init_model_dir
        self.step = saved[-1]
        return self._ckpt(self.step)

    def _ckpt(self, version: int) -> Path:
        return self.s.checkpoint_dir / f"v{version}"

    def _latest_announcement(self) -> PolicyAnnouncement | None:
        entries = self.r.xrevrange(streams.POLICY_ANNOUNCEMENTS, count=1)
        return streams.decode(PolicyAnnouncement, entries[0][1]) if entries else None

    def save(self, trained_ids: list[str]) -> Path:
        out = save_pretrained(self.model, self.model.tokenizer, self._ckpt(self.step))
        record = self.s.checkpoint_dir / f"v{self.step}.trained.json"
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(trained_ids))
        tmp.replace(record)
        return out

    def publish(self) -> None:
        """Push the saved version `step` to the origin and announce it."""
        out = self._ckpt(self.step)
        if not out.exists():
            self.save([])
        signed = publish_version(
            self.s.origin_url,
            out,
            version=self.step,
            parent_version=self.step - 1 if self.step > 0 else None,
            account=self.account,
            shard_size=self.s.shard_size,
            timeout=self.s.http_timeout_s,
        )
        ann = PolicyAnnouncement(
            version=self.step,
            step=self.step,
            model_hash=signed.manifest.model_hash,
            manifest_path=manifest_path(self.step),
        )
        self.r.xadd(
            streams.POLICY_ANNOUNCEMENTS, streams.encode(ann), maxlen=10_000, approximate=True
        )
        metrics.POLICY_VERSION.set(self.step)
        for old in range(self.step - self.s.keep_checkpoints, -1, -1):
            if old > 0 and self._ckpt(old).exists():  # v0 is kept: it is the start of RL
                shutil.rmtree(self._ckpt(old), ignore_errors=True)
            else:
                break

    def collect(self) -> tuple[list[VerifiedRollout], list[str]]:
        """Block until a step's worth of fresh groups is in; stale ones are dropped (and acked)."""
        batch: list[VerifiedRollout] = []
        ids: list[str] = []
        while len(batch) < self.s.groups_per_step:
            entries: list[Entry[VerifiedRollout]] = self.reader.read(
                self.s.groups_per_step - len(batch), block_ms=1000
            )
            metrics.QUEUE_LAG.set(self.reader.lag())
            for e in entries:
                msg = e.message
                if msg is None:
                    log.warning("dropping undecodable entry", extra={"fields": {"err": e.error}})
                    self.reader.ack(e.entry_id)
                elif not is_fresh(msg.policy_version, self.step, self.s.recipe.async_level):
                    # Bounded staleness (DESIGN.md §3.4): too old to train on by now.
                    self.stale_dropped += 1
                    metrics.STALE_DROPPED.inc()
                    self.reader.ack(e.entry_id)
                elif self.r.sismember(TRAINED, msg.submission_id):
                    self.reader.ack(e.entry_id)  # trained before a crash; never twice
                else:
                    batch.append(msg)
                    ids.append(e.entry_id)
        return batch, ids

    def train_step(self) -> StepProgress:
        batch, ids = self.collect()
        t0 = time.time()
        groups = [
            [
                Rollout(
                    prompt_ids=r.prompt_token_ids,
                    completion_ids=c.token_ids,
                    behaviour_logprobs=c.logprobs,
                    reward=c.reward,
                    temperature=r.sampling.temperature,
                )
                for c in r.completions
            ]
            for r in batch
        ]
        stats = grpo_step(self.model, self.opt, groups, self.cfg)
        lags = [self.step - r.policy_version for r in batch]
        rewards = [c.reward for r in batch for c in r.completions]
        self.step += 1
        self.save([r.submission_id for r in batch])
        self.publish()
        # Acknowledge only once the step's effect (the new version) is durable.
        pipe = self.r.pipeline(transaction=True)
        pipe.sadd(TRAINED, *[r.submission_id for r in batch])
        pipe.xack(streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP, *ids)
        pipe.execute()
        row = StepProgress(
            step=self.step,
            version=self.step,
            mean_reward=sum(rewards) / len(rewards),
            groups=len(batch),
            policy_lag_mean=sum(lags) / len(lags),
            policy_lag_max=max(lags),
            stale_dropped=self.stale_dropped,
            accepted_total=int(self.r.xlen(streams.ROLLOUTS_VERIFIED)),
            rejected_total=int(self.r.xlen(streams.ROLLOUTS_REJECTED)),
            loss=float(stats["loss"]),
            clip_frac=float(stats.get("clip_frac", 0.0)),
            seconds=time.time() - t0,
            wall=time.time() - self.started,
        )
        metrics.STEPS.inc()
        metrics.MEAN_REWARD.set(row.mean_reward)
        progress.append(self.s.progress_file, row)
        log.info("step", extra={"fields": row.model_dump()})
        return row

    def run(self) -> None:
        while self.step < self.s.max_steps:
            self.train_step()
        log.info("reached max_steps", extra={"fields": {"step": self.step}})
