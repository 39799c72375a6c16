"""`prime-swarm chaos`: a local training run while parts of the network are killed and restarted.

During the run a worker, the relay, the validator, the orchestrator, the trainer and Redis (AOF
on) are each SIGKILLed at random moments, `kills_each` times, and started again as a supervisor
would: the same command, port, key and data directory. Once every kill is done the run trains a
few more steps and ends. Then every submitted rollout is accounted for from the records the
services keep anyway (Redis streams, the trainer's audit hashes, the chain):

- trained: in a saved step's trained list (`trainer:trained_by_step`); in two lists: trained twice;
- rejected: a validator verdict said no, with its reason;
- expired: not trained, with a reason: dropped by the trainer (stale, zero variance), or still
  queued for a validator or the trainer when the run ended;
- unaccounted: none of those, i.e. lost.

The chain's attested units must equal the units of the validators' accepted verdicts.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import redis

from prime_swarm.libs.localnet.process import ProcessFailed
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import SubmittedRollout, Verdict, VerifiedRollout
from prime_swarm.services.trainer import progress
from prime_swarm.services.trainer.persist import DROPPED, TRAINED_BY_STEP

from .network import LocalNetwork, new_run_dir
from .settings import ChaosSettings

PARTS = ("worker", "relay", "validator", "orchestrator", "trainer", "redis")


def kill_plan(rng: random.Random, kills_each: int) -> list[str]:
    """Every part `kills_each` times, in a random order."""
    plan = [p for p in PARTS for _ in range(kills_each)]
    rng.shuffle(plan)
    return plan


def _process_of(part: str, net: LocalNetwork, rng: random.Random) -> str:
    if part == "worker":
        return rng.choice(sorted(n for n in net.procs if n.startswith("worker-")))
    if part == "validator":
        return "validator-0"
    return part


class ChaosRun:
    """Drives the kills from its own loop (the trainer itself is among the victims, so the
    trainer's progress cannot be the clock) and restarts any process that dies of the others'
    deaths, counting those separately."""

    def __init__(
        self,
        net: LocalNetwork,
        *,
        kills_each: int,
        seed: int,
        gap_s: tuple[float, float],
        steps_after: int,
        say: object = print,
    ) -> None:
        self.net, self.rng = net, random.Random(seed)
        self.plan = kill_plan(self.rng, kills_each)
        self.gap_s, self.steps_after = gap_s, steps_after
        self.kills: Counter[str] = Counter()
        self.unplanned: Counter[str] = Counter()
        self.log: list[dict[str, object]] = []
        self.say = say

    def run(self, timeout_s: float) -> list[object]:
        net, started = self.net, time.monotonic()
        next_kill = started + self.rng.uniform(*self.gap_s)
        done_at_step: int | None = None
        seen = 0
        while True:
            now = time.monotonic()
            if now - started > timeout_s:
                raise TimeoutError(f"chaos run did not finish within {timeout_s:.0f}s")
            rows = progress.read(net.progress_file)
            for row in rows[seen:]:
                self.say(f"step {row.step:>4}  reward {row.mean_reward:.3f}")  # type: ignore[operator]
            seen = len(rows)
            step = rows[-1].step if rows else 0
            trainer = net.procs["trainer"]
            if done_at_step is not None and not trainer.alive():
                if trainer.proc.returncode != 0:
                    raise ProcessFailed(f"trainer exited with {trainer.proc.returncode}")
                return rows  # type: ignore[return-value]
            for name, p in list(net.procs.items()):
                if not p.alive() and not (name == "trainer" and done_at_step is not None):
                    # Died of something other than our SIGKILL: a supervisor restarts it.
                    self.unplanned[name] += 1
                    self.log.append({"t": round(now - started, 1), "restarted": name})
                    net.procs[name] = p.respawn()
            if self.plan and now >= next_kill:
                part = self.plan.pop()
                name = _process_of(part, net, self.rng)
                self.say(f"chaos: kill -9 {name} at step {step}")  # type: ignore[operator]
                net.crash_and_restart(name)
                self.kills[part] += 1
                self.log.append({"t": round(now - started, 1), "kill": name, "step": step})
                next_kill = time.monotonic() + self.rng.uniform(*self.gap_s)
            elif not self.plan and done_at_step is None:
                done_at_step = step
            if done_at_step is not None and step >= done_at_step + self.steps_after:
                if trainer.alive():
                    trainer.stop(timeout_s=60)  # SIGTERM: it saves and exits between steps
            time.sleep(0.25)


def _entries(r: redis.Redis, stream: str, model: type) -> list[tuple[str, object]]:
    out = []
    for entry_id, fields in r.xrange(stream):
        out.append((entry_id.decode(), streams.decode(model, fields)))
    return out


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _unfinished(r: redis.Redis, stream: str, group: str) -> set[str]:
    """Entry ids of `stream` that `group` has not acknowledged: pending or never delivered."""
    groups = {g["name"].decode(): g for g in r.xinfo_groups(stream)}
    if group not in groups:
        return {e.decode() for e, _ in r.xrange(stream)}
    last = _id_key(groups[group]["last-delivered-id"].decode())
    pending = {p["message_id"].decode() for p in r.xpending_range(stream, group, "-", "+", 10**6)}
    undelivered = {e.decode() for e, _ in r.xrange(stream) if _id_key(e.decode()) > last}
    return pending | undelivered


def account(r: redis.Redis, onchain_units: int) -> dict[str, object]:
    """Every submitted rollout's fate, from the streams, the trainer's audit hashes and the
    chain (see the module notes)."""
    submitted = _entries(r, streams.ROLLOUTS_SUBMITTED, SubmittedRollout)
    verified = _entries(r, streams.ROLLOUTS_VERIFIED, VerifiedRollout)
    rejected = _entries(r, streams.ROLLOUTS_REJECTED, Verdict)
    unvalidated = _unfinished(r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP)
    untrained = _unfinished(r, streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP)

    trained_count: Counter[str] = Counter()
    for ids in r.hgetall(TRAINED_BY_STEP).values():
        trained_count.update(i for i in ids.decode().split(",") if i)
    dropped = {k.decode(): v.decode() for k, v in r.hgetall(DROPPED).items()}

    accepted_units: dict[str, int] = {}
    queued_for_trainer: set[str] = set()
    for entry_id, v in verified:
        accepted_units.setdefault(v.submission_id, v.verdict.units)  # type: ignore[attr-defined]
        if entry_id in untrained:
            queued_for_trainer.add(v.submission_id)  # type: ignore[attr-defined]
    reasons = {v.submission_id: str(v.reason) for _, v in rejected}  # type: ignore[attr-defined]

    outcome: dict[str, str] = {}
    for entry_id, s in submitted:
        sid = s.submission_id  # type: ignore[attr-defined]
        if sid in trained_count:
            outcome[sid] = "trained"
        elif sid in reasons:
            outcome[sid] = f"rejected:{reasons[sid]}"
        elif sid in dropped:
            outcome[sid] = f"expired:{dropped[sid]}"
        elif sid in queued_for_trainer:
            outcome[sid] = "expired:run_ended_before_training"
        elif entry_id in unvalidated:
            outcome[sid] = "expired:run_ended_before_validation"
        else:
            outcome[sid] = "unaccounted"
    kinds = Counter(o.split(":", 1)[0] for o in outcome.values())
    trained_twice = sorted(i for i, n in trained_count.items() if n > 1)
    return {
        "rollouts": {
            "submitted": len(outcome),
            "trained": kinds["trained"],
            "rejected": kinds["rejected"],
            "expired": kinds["expired"],
            "trained_twice": len(trained_twice),
            "unaccounted": kinds["unaccounted"],
        },
        "rejected_by_reason": _reasons(outcome, "rejected"),
        "expired_by_reason": _reasons(outcome, "expired"),
        "trained_twice_ids": trained_twice[:20],
        "unaccounted_ids": sorted(s for s, o in outcome.items() if o == "unaccounted")[:20],
        # Trained ids that no submission explains would be fabricated work.
        "trained_not_submitted": len(set(trained_count) - set(outcome)),
        "onchain_units": onchain_units,
        "validator_units": sum(accepted_units.values()),
    }


def _reasons(outcome: dict[str, str], kind: str) -> dict[str, int]:
    return dict(Counter(o.split(":", 1)[1] for o in outcome.values() if o.startswith(kind + ":")))


def write_result(path: Path, result: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def run(s: ChaosSettings) -> dict[str, object]:
    """The whole chaos run: network up, kills, a clean end, the accounting."""
    from .cli import prepare_model

    started = time.time()
    run_dir = new_run_dir(s.runs_dir)
    print(f"run folder: {run_dir}")
    net = LocalNetwork(s, prepare_model(s), run_dir)
    chaos = ChaosRun(
        net,
        kills_each=s.kills_each,
        seed=s.seed,
        gap_s=(s.gap_min_s, min(s.gap_max_s, max(s.gap_min_s, s.gap_max_s))),
        steps_after=s.steps_after,
    )
    completed = False
    try:
        net.start()
        rows = chaos.run(s.timeout_s)
        completed = True
        net.stop_workers()
        net.stop_validators()  # each flushes its queued attestations first
        assert net.redis is not None
        r = net.redis.client()
        try:
            books = account(r, net.attested_units())
        finally:
            r.close()
    finally:
        net.stop()
    result: dict[str, object] = {
        "completed": completed,
        "steps": len(rows),
        "kills": {p: chaos.kills[p] for p in PARTS},
        "restarts_after_unplanned_exit": dict(chaos.unplanned),
        **books,
        "reward_first_last": [rows[0].mean_reward, rows[-1].mean_reward] if rows else [],
        "events": chaos.log,
        "seed": s.seed,
        "wall_seconds": round(time.time() - started, 1),
        "run_dir": str(run_dir),
    }
    write_result(s.out, result)
    print(json.dumps({k: result[k] for k in ("completed", "kills", "rollouts")}))
    print(f"wrote {s.out}")
    return result
