"""`prime-swarm soak` (`make soak`): a day in an hour.

The whole local network trains for `--minutes` under its own steady load (the tiny model by
default: the trainer never waits long, the workers never idle), while a part is killed on a
schedule, one every `--kill-every-s`, in rotation: by default the Redis primary lost and cut off
(with `--redis-ha`), an orchestrator replica and a worker. The trainer, the validator and the
relays are left alone, so their growth is measured over the whole run.

Every `--sample-every-s`, each process's resident memory and open files (Linux /proc) and
Redis's memory and stream lengths are recorded. At the end the trainer stops cleanly and the
books are closed (deploy/local/books.py: every rollout trained once, rejected or expired, the
chain's units equal to the validators'). Growth per hour is fitted, per process, over the
samples since it last (re)started and after the first `--settle-s` (start-up: models load), so
a process killed on schedule is measured over its last life only. Writes
bench/results/soak.json.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from prime_swarm.libs.localnet.redis_ha import RedisHA
from prime_swarm.libs.streams.retention import entries_added
from prime_swarm.protocol import streams
from prime_swarm.services.trainer import progress

from .chaos import ChaosRun, write_result
from .network import LocalNetwork, new_run_dir
from .settings import SoakSettings

STREAMS = (
    streams.ROLLOUTS_SUBMITTED,
    streams.ROLLOUTS_VERIFIED,
    streams.ROLLOUTS_REJECTED,
    streams.ROLLOUTS_HELD,
    streams.POLICY_ANNOUNCEMENTS,
    streams.TRAINER_PROGRESS,
)


def process_sample(pid: int) -> dict[str, float] | None:
    """Resident memory (MiB) and open files of `pid`, None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return {"rss_mb": round(rss_kb / 1024, 1), "open_files": fds}


def pids(net: LocalNetwork) -> dict[str, int]:
    """Every process of the network by name (Redis nodes and Sentinels included)."""
    found = {name: p.proc.pid for name, p in net.procs.items()}
    redis = net.redis
    if isinstance(redis, RedisHA):
        for i, node in enumerate(redis.nodes):
            found[f"redis-{i}"] = node.process.proc.pid
        for i, sentinel in enumerate(redis.sentinels):
            found[f"sentinel-{i}"] = sentinel.proc.pid
    elif redis is not None:
        found["redis"] = redis.process.proc.pid
    return found


def redis_sample(net: LocalNetwork) -> dict[str, Any]:
    assert net.redis is not None
    r = net.redis.client()
    try:
        info = r.info("memory")
        return {
            "used_memory_mb": round(int(info["used_memory"]) / 2**20, 2),
            "keys": int(r.dbsize()),
            "stream_lengths": {s: int(r.xlen(s)) for s in STREAMS},
            "entries_added": {s: entries_added(r, s) for s in STREAMS},
        }
    finally:
        r.close()


def growth_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value), per hour; None under two points."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return round(3600 * sum((t - mt) * (v - mv) for t, v in points) / var, 2)


def summarize(samples: list[dict[str, Any]], settle_s: float = 0.0) -> dict[str, Any]:
    """Per process: first and last reading, restarts, and growth over its last life, all from
    `settle_s` on (a process loading its model is not growing)."""
    out: dict[str, Any] = {}
    settled = [s for s in samples if s["t"] >= settle_s] or samples[-1:]
    names = sorted({n for s in settled for n in s["processes"]})
    for name in names:
        seen = [(s["t"], s["processes"][name]) for s in settled if name in s["processes"]]
        last_pid = seen[-1][1]["pid"]
        life = [(t, p) for t, p in seen if p["pid"] == last_pid]
        if life[0][0] > seen[0][0]:  # restarted during the soak: it settles again
            life = [(t, p) for t, p in life if t >= life[0][0] + settle_s] or life[-1:]
        out[name] = {
            "start": {k: seen[0][1][k] for k in ("rss_mb", "open_files")},
            "end": {k: seen[-1][1][k] for k in ("rss_mb", "open_files")},
            "restarts": len({p["pid"] for _, p in seen}) - 1,
            "measured_over_min": round((life[-1][0] - life[0][0]) / 60, 1),
            "rss_mb_per_h": growth_per_hour([(t, p["rss_mb"]) for t, p in life]),
            "open_files_per_h": growth_per_hour([(t, p["open_files"]) for t, p in life]),
        }
    return out


def run(s: SoakSettings) -> dict[str, Any]:
    from .cli import prepare_model

    run_dir = new_run_dir(s.runs_dir)
    print(f"run folder: {run_dir}")
    net = LocalNetwork(s, prepare_model(s), run_dir)
    chaos = ChaosRun(
        net, kills_each=1, seed=s.seed, gap_s=(s.gap_min_s, s.gap_max_s), steps_after=1,
        parts=s.parts,
    )  # fmt: skip
    order = list(s.parts)
    random.Random(s.seed).shuffle(order)
    rotation = itertools.cycle(order)
    samples: list[dict[str, Any]] = []

    def sample(t: float) -> None:
        procs = {}
        for name, pid in pids(net).items():
            reading = process_sample(pid)
            if reading is not None:
                procs[name] = {"pid": pid, **reading}
        samples.append({"t": round(t, 1), "processes": procs, "redis": redis_sample(net)})

    rows: list[Any] = []
    try:
        net.start()
        started = time.monotonic()
        end = started + 60 * s.minutes
        next_kill, next_sample, seen = started + s.kill_every_s, started, 0
        while (now := time.monotonic()) < end:
            rows = progress.read(net.progress_file)
            if len(rows) // 50 > seen // 50:
                print(f"{(now - started) / 60:5.1f} min  step {rows[-1].step:>5}  "
                      f"reward {rows[-1].mean_reward:.3f}")  # fmt: skip
            seen = len(rows)
            chaos.supervise(started)
            net.read_books(every_s=30.0)
            if now >= next_sample:
                sample(now - started)
                next_sample = now + s.sample_every_s
            if now >= next_kill:
                chaos.strike(next(rotation), round(now - started, 1), rows[-1].step if rows else 0)
                next_kill = time.monotonic() + s.kill_every_s
            time.sleep(1.0)
        sample(time.monotonic() - started)
        net.procs["trainer"].stop(timeout_s=120)  # SIGTERM: it saves and exits between steps
        rows = progress.read(net.progress_file)
        books = net.close_books()
    finally:
        net.stop()
    settled = [x for x in samples if x["t"] >= s.settle_s] or samples[-1:]
    hours = max(1e-9, (settled[-1]["t"] - settled[0]["t"]) / 3600)
    redis_first, redis_last = settled[0]["redis"], settled[-1]["redis"]
    # Trimming starts once the first entries are RETENTION_S old: growth is fitted after that.
    full = [x for x in settled if x["t"] >= s.settle_s + streams.RETENTION_S] or settled[-2:]
    result: dict[str, Any] = {
        "minutes": round(samples[-1]["t"] / 60, 1),
        "steps": len(rows),
        "redis_ha": s.redis_ha,
        "orchestrators": s.orchestrators,
        "kills": dict(chaos.kills),
        "failovers": chaos.failovers,
        "restarts_after_unplanned_exit": dict(chaos.unplanned),
        "settle_s": s.settle_s,
        "processes": summarize(samples, s.settle_s),
        "redis": {
            "start": redis_first,
            "end": redis_last,
            "used_memory_mb_per_h": round(
                (redis_last["used_memory_mb"] - redis_first["used_memory_mb"]) / hours, 2
            ),
            "retention_s": streams.RETENTION_S,
            "once_retention_full": {
                "from_min": round(full[0]["t"] / 60, 1),
                "used_memory_mb_per_h": growth_per_hour(
                    [(x["t"], x["redis"]["used_memory_mb"]) for x in full]
                ),
                "keys_per_h": growth_per_hour([(x["t"], x["redis"]["keys"]) for x in full]),
            },
        },
        **books,
        "reward_first_last": [rows[0].mean_reward, rows[-1].mean_reward] if rows else [],
        "events": chaos.log,
        "samples": samples,
        "command": "make soak",
        "run_dir": str(run_dir),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_result(s.out, result)
    print(json.dumps({k: result[k] for k in ("minutes", "steps", "kills", "rollouts")}))
    print(f"wrote {s.out}")
    return result
