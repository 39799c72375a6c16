"""`prime-swarm chaos`: a local training run while parts of the network are killed and restarted.

During the run a worker, the relay, the validator, the orchestrator, the trainer and Redis (AOF
on) are each SIGKILLed at random moments, `kills_each` times, and started again as a supervisor
would: the same command, port, key and data directory. Once every kill is done the run trains a
few more steps and ends. Then every submitted rollout is accounted for (books.py): trained once,
rejected or expired with a reason, never lost or trained twice, and the chain's attested units
equal to the validators' accepted ones.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from prime_swarm.libs.localnet.process import ProcessFailed
from prime_swarm.libs.localnet.redis_ha import RedisHA
from prime_swarm.services.trainer import progress

from .network import LocalNetwork, new_run_dir
from .settings import ChaosSettings

# "redis-cut" (with --redis-ha only): the primary cut off from every peer, then let back in.
# With --redis-ha, "redis" loses the primary's machine and the Sentinels fail over.
PARTS = ("worker", "relay", "validator", "orchestrator", "trainer", "redis", "redis-cut")


def kill_plan(rng: random.Random, kills_each: int, parts: Sequence[str]) -> list[str]:
    """Every part `kills_each` times, in a random order."""
    plan = [p for p in parts for _ in range(kills_each)]
    rng.shuffle(plan)
    return plan


def _process_of(part: str, net: LocalNetwork, rng: random.Random) -> str:
    if part == "worker":
        return rng.choice(sorted(n for n in net.procs if n.startswith("worker-")))
    if part == "validator":
        return "validator-0"
    if part == "orchestrator":  # one of the replicas, when there are several
        return rng.choice(sorted(n for n in net.orchestrators if n != "haproxy"))
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
        parts: Sequence[str] = PARTS[:6],
        say: object = print,
    ) -> None:
        self.net, self.rng = net, random.Random(seed)
        self.plan = kill_plan(self.rng, kills_each, parts)
        self.parts = tuple(parts)
        # Each failover of a --redis-ha run: how, when, and how long until writes landed.
        self.failovers: list[dict[str, object]] = []
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
            self.supervise(started, spare=("trainer",) if done_at_step is not None else ())
            net.read_books(every_s=30.0)
            if self.plan and now >= next_kill:
                self.strike(self.plan.pop(), round(now - started, 1), step)
                next_kill = time.monotonic() + self.rng.uniform(*self.gap_s)
            elif not self.plan and done_at_step is None:
                done_at_step = step
            if done_at_step is not None and step >= done_at_step + self.steps_after:
                if trainer.alive():
                    trainer.stop(timeout_s=60)  # SIGTERM: it saves and exits between steps
            time.sleep(0.25)

    def _books_now(self) -> dict[str, int]:
        """The books right after a failover, read from the new primary: nothing trained twice
        and nothing unaccounted so far (what is in flight counts as such, not as lost)."""
        assert self.net.redis is not None
        r = self.net.redis.client()
        try:
            rollouts = self.net.books.account(r, 0)["rollouts"]
        finally:
            r.close()
        return {k: rollouts[k] for k in ("submitted", "trained_twice", "unaccounted")}  # type: ignore[index]

    def supervise(self, started: float, spare: tuple[str, ...] = ()) -> None:
        """Restart any process (but `spare`) that died of something other than a planned kill
        (the others' deaths, a retry budget spent), with no limit: the run counts them."""
        for name in self.net.supervise(spare, budget=None):
            self.unplanned[name] += 1
            self.log.append({"t": round(time.monotonic() - started, 1), "restarted": name})

    def strike(self, part: str, t: float, step: int) -> None:
        """Kill `part` (a process of it) and bring it back, or fail the Redis primary over."""
        net = self.net
        name = _process_of(part, net, self.rng)
        at = {"t": t, "step": step}
        if isinstance(net.redis, RedisHA) and part in ("redis", "redis-cut"):
            how = "SIGKILL" if part == "redis" else "cut off"
            self.say(f"chaos: Redis primary {how} at step {step}")  # type: ignore[operator]
            lose = net.redis.kill_primary if part == "redis" else net.redis.cut_primary
            figures = lose(down_s=self.rng.uniform(*self.gap_s))
            self.failovers.append({"how": how, **at, **figures, **self._books_now()})
        else:
            self.say(f"chaos: kill -9 {name} at step {step}")  # type: ignore[operator]
            net.crash_and_restart(name)
        self.kills[part] += 1
        self.log.append({**at, "kill": name})


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
        parts=s.parts,
    )
    completed = False
    try:
        net.start()
        rows = chaos.run(s.timeout_s)
        completed = True
        books = net.close_books()
    finally:
        net.stop()
    result: dict[str, object] = {
        "completed": completed,
        "steps": len(rows),
        "kills": {p: chaos.kills[p] for p in chaos.parts},
        "redis_ha": s.redis_ha,
        "orchestrators": s.orchestrators,
        "failovers": chaos.failovers,
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
    if s.redis_ha:
        record_failovers(s.ha_out, result)
    return result


def record_failovers(path: Path, result: dict[str, object]) -> None:
    """`redis_failover` of bench/results/ha.json: each failover (how, promotion, the outage a
    writer saw, the books right after it) and the run's closing books."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc["redis_failover"] = {
        "kills": result["failovers"],
        "rollouts": result["rollouts"],
        "onchain_units": result["onchain_units"],
        "validator_units": result["validator_units"],
        "other_kills": {
            k: v
            for k, v in result["kills"].items()
            if k not in ("redis", "redis-cut")  # type: ignore[union-attr]
        },
        "restarts_after_unplanned_exit": result["restarts_after_unplanned_exit"],
        "orchestrators": result["orchestrators"],
        "steps": result["steps"],
        "wall_seconds": result["wall_seconds"],
        "command": "prime-swarm chaos --redis-ha --orchestrators 3 "
        "--parts redis,redis-cut,orchestrator --kills-each 3",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_result(path, doc)
    print(f"wrote {path} (redis_failover)")
