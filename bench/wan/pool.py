"""The pool section of `make bench-wan`: the local pool of `make up` (tiny model, its task),
placed on the testbed's hosts: trainer, validator, orchestrator, origin, Redis and the chain on
the operator's host, a relay in each region, nine workers on home links, three per region. The
same pool, same settings, also runs on loopback, for the share of work lost to staleness.

Mid-run one region is cut off from all others for 60 s and healed. Checked afterwards: the
books (each submitted rollout trained once, rejected with a reason or expired with one; none
lost; the chain's attested units equal the validators'), the workers' stakes and membership on
chain (a partition must cost no stake and eject no one), that the cut region's workers submit
again after the heal by themselves, and each worker's version switches (the pause between its
last generation on version k and its first on k+1, from the workers' "generated" log lines).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from prime_swarm.deploy.local.books import account
from prime_swarm.deploy.local.cli import heldout, prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.placement import OnTestbed
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.deploy.testbed.net import LiveTestbed
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.rl.checkpoint import model_dir
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import SubmittedRollout, normal_address

from .delivery import log

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 9
CUT_REGION, CUT_AT_STEP, CUT_FOR_S = "asia", 8, 60.0


def settings(runs: Path) -> LocalNetworkSettings:
    return LocalNetworkSettings(
        workers=WORKERS, runs_dir=runs, cache_dir=ROOT / ".cache", quiet=True, timeout_s=2400
    )


def placement(live: LiveTestbed) -> OnTestbed:
    regions = ["eu", "sa", "asia"]
    hosts = {"operator": "operator", **{f"relay-{r}": f"relay-{r}" for r in regions}}
    workers = [f"worker-{r}-{i}" for i in range(1, 4) for r in regions]
    return OnTestbed(live, hosts, workers)


def switch_pauses(logs: Path) -> dict[str, Any]:
    """Per worker, the gap between the end of its last generation on version k and the start of
    its first on k+1, against the gap between two generations on one version (leasing)."""
    switches: list[float] = []
    same: list[float] = []
    for path in sorted(logs.glob("worker-*.log")):
        gens = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "generated" or rec.get("message") == "generated":
                f = rec.get("fields", rec)
                gens.append((float(f["since"]), float(f["seconds"]), int(f["version"])))
        gens.sort()
        for (s0, d0, v0), (s1, _, v1) in zip(gens, gens[1:], strict=False):
            gap = s1 - (s0 + d0)
            (switches if v1 > v0 else same).append(gap)

    def stats(xs: list[float]) -> dict[str, float | int]:
        if not xs:
            return {"n": 0}
        return {
            "n": len(xs),
            "p50": round(statistics.median(xs), 3),
            "max": round(max(xs), 3),
        }

    return {**stats(switches), "between_batches_same_version": stats(same)}


def run(work: Path, live: LiveTestbed | None) -> dict[str, Any]:
    s = settings(work / "runs")
    init_dir = prepare_model(s, say=lambda _m: None)
    run_dir = work / ("pool-wan" if live else "pool-loopback")
    run_dir.mkdir(parents=True)
    place = placement(live) if live else None
    net = LocalNetwork(s, init_dir, run_dir, place)
    cut: dict[str, float] = {}
    out: dict[str, Any] = {}
    try:
        topo = net.start()
        ledger = LedgerClient(topo.rpc_url, topo.ledger, account=None, timeout=30)
        # The baseline once every worker has staked: each joins the pool by itself after it
        # starts, and a baseline read before that (a stake of 0) made every later reading look
        # like a change.
        deadline = time.monotonic() + 120
        while not all(ledger.is_member(topo.pool_id, w) for w in topo.workers):
            if time.monotonic() > deadline:
                raise TimeoutError("the pool's workers did not all join within 120 s")
            time.sleep(1.0)
        stakes = {w: ledger.stake_of(topo.pool_id, w) for w in topo.workers}
        started = time.time()

        def heal() -> None:
            assert live is not None
            live.heal(CUT_REGION)
            cut["healed"] = time.time()
            log(f"  pool: healed {CUT_REGION}")

        def on_step(row: Any) -> None:
            log(f"  pool {'wan' if live else 'loopback'} step {row.step} "
                f"reward {row.mean_reward:.3f} lag {row.policy_lag_mean:.2f}")  # fmt: skip
            if live is not None and row.step == CUT_AT_STEP and "at" not in cut:
                live.cut(CUT_REGION)
                cut["at"] = time.time()
                log(f"  pool: cut {CUT_REGION} for {CUT_FOR_S:.0f}s")
                threading.Timer(CUT_FOR_S, heal).start()

        rows = net.follow(on_step, s.timeout_s)
        if live is not None and "at" in cut and "healed" not in cut:
            time.sleep(max(0.0, cut["at"] + CUT_FOR_S + 1 - time.time()))
        # Read before the workers stop: a stopping worker leaves the pool and unbonds.
        stakes_unchanged = all(ledger.stake_of(topo.pool_id, w) == v for w, v in stakes.items())
        ejected = [w for w in topo.workers if not ledger.is_member(topo.pool_id, w)]
        net.stop_workers()
        net.stop_validators()
        assert net.redis is not None
        r = net.redis.client()
        books = account(r, net.attested_units())
        by_worker: dict[str, list[float]] = defaultdict(list)
        for _, fields in r.xrange(streams.ROLLOUTS_SUBMITTED):
            sub = streams.decode(SubmittedRollout, fields)
            by_worker[sub.submission.worker].append(sub.received_at)
        r.close()
        out = {
            "wall_s": round(time.time() - started, 1),
            "steps": len(rows),
            "workers": len(topo.workers),
            "books": books,
            "mean_policy_lag": round(sum(x.policy_lag_mean for x in rows) / len(rows), 3),
            "stakes_unchanged": stakes_unchanged,
            "ejected": ejected,
            "switch_pause_s": switch_pauses(net.logs),
        }
        if live is not None and "healed" in cut:
            assert place is not None
            cut_workers = [
                w
                for i, w in enumerate(topo.workers)
                if live.hosts[place.host(f"worker-{i}")].region == CUT_REGION
            ]
            out["region_cut"] = {
                "region": CUT_REGION,
                "for_s": CUT_FOR_S,
                "at_s": round(cut["at"] - started, 1),
                "cut_workers": len(cut_workers),
                "resumed_workers": sum(
                    any(t > cut["healed"] for t in by_worker[normal_address(w)])
                    for w in cut_workers
                ),
            }
    finally:
        net.stop()
    out["heldout_start"] = round(heldout(init_dir, s), 4)
    out["heldout_end"] = round(heldout(model_dir(run_dir / "checkpoints", s.steps), s), 4)
    return out


def stale_share(books: dict[str, Any]) -> float:
    """Submitted rollouts lost to age: refused by a validator or dropped by the trainer."""
    rejected = books["rejected_by_reason"].get("stale_policy", 0)
    expired = sum(n for why, n in books["expired_by_reason"].items() if "stale" in why)
    return round((rejected + expired) / max(books["rollouts"]["submitted"], 1), 4)
